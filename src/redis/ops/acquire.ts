import type { AcquireRequest, AcquireResult } from '../../core/backend.js';
import { BackendUnavailableError } from '../../core/errors.js';
import { luaOp } from '../lua/library.js';
import type { WakeCursor, WakeHub } from '../wake-hub.js';
import { limitConflict } from '../limit.js';
import { decimal, type OpContext } from './context.js';
import { wakeIdOf } from './queue.js';
import { release } from './release.js';

/** ARGV of acquire: the first seven always; the last two only when the caller will wait (it is then enqueued). */
type AcquireArgs = readonly [...AcquireBase] | readonly [...AcquireBase, queueTtl: string, channel: string];
type AcquireBase = [owner: string, mode: 'e' | 's' | `s${number}`, ttl: string, lockDelay: string, label: string, session: string, retain: string];

/**
 * The token (granted) | busy: the label of a holder ('' if none) and when the key could free by expiry ('' if unknown) | L: the session is gone |
 * M: refused, the holders record another limit (theirs: a decimal, '' for plain shared holders).
 */
type AcquireReply = string | readonly ['B', string, string] | readonly ['L'] | readonly ['M', string];

/**
 * acquire: grants, or answers busy (enqueueing the caller when it will wait). The token is raised
 * in the same call as the grant: max(counter + 1, server TIME in µs), so a counter lost with the
 * data cannot bring tokens back while the server clock moves forward (I1).
 *
 * KEYS: lock[, session]. ARGV: owner, mode (e|s, or s<limit> for a semaphore permit), ttl (ms), lockDelay (ms, a decimal integer,
 * stored as given), label, session id ('' for none), retain (ms)[, queueTtl (ms), wake channel (''
 * when this client cannot be told)] — the last two only when the caller will wait (it is then
 * enqueued). Reply: the token (a string: granted) | {'B', holderLabel, retryInMs or ''} | {'L'}
 * (the session is gone) | {'M', the holders' limit or ''} (refused: see below).
 *
 * An owner that holds already (an answer it missed, or a hand-off it did not take) gets its grant
 * back, bound to the session it asks with now. A shared grant serves the shared waiters queued
 * behind it (hand_off).
 *
 * Permits (`AcquireRequest.limit`): the record carries the limit (`s3|…`); a permit is granted when
 * the shared holders share its limit and fewer hold, and it is among the first (limit − holders)
 * permit waiters with no other waiter ahead (clear_ahead). A shared request whose limit the live
 * holders do not share is refused ('M'): nothing of it is written, and a place it had is given up
 * (the queue is then served). A change of holders is told to the key's watchers (notify).
 *
 * Fast path, the common case: the key is free (no `s`): TIME, [session HGET], HMGET of counter and
 * state, one HSET of counter, state and holder, and one TTL command (PERSIST when the key existed,
 * for a session-bound holder; PEXPIREAT otherwise); no HGETALL, no queue, no record parsing.
 */
export const ACQUIRE = luaOp<readonly [lock: string] | readonly [lock: string, session: string], AcquireArgs, AcquireReply>(
  'acquire',
  'acquire',
  `
local lk, sk = KEYS[1], KEYS[2]
local owner, ses = ARGV[1], ARGV[6]
local mode, lim = string.sub(ARGV[2], 1, 1), tonumber(string.sub(ARGV[2], 2))
local now, now_us, now_us_s = clock_us()
local sexp = 0
if ses ~= '' then
  local e = redis.call('HGET', sk, 'e')
  if not e then return {'L'} end
  sexp = tonumber(e)
  if sexp <= now then return {'L'} end
end
local top = redis.call('HMGET', lk, 't', 's', 'w')
if not top[2] then
  local tok = next_token(top[1], now_us, now_us_s)
  -- ARGV[4], the lock-delay, is a decimal integer (the client formats it): stored as given
  if ses == '' then
    local exp = now + tonumber(ARGV[3])
    redis.call('HSET', lk, 't', tok, 's', ARGV[4] == '0' and '1' or '1l', 'h:' .. owner, ARGV[2] .. '|' .. tok .. '|' .. num(exp) .. '|' .. ARGV[4] .. '||' .. ARGV[5])
    redis.call('PEXPIREAT', lk, num(exp + tonumber(ARGV[4]) + tonumber(ARGV[7])))
  else
    redis.call('HSET', lk, 't', tok, 's', ARGV[4] == '0' and '1' or '1l', 'h:' .. owner, ARGV[2] .. '|' .. tok .. '|0|' .. ARGV[4] .. '|' .. ses .. '|' .. ARGV[5])
    -- a key that did not exist has no TTL to remove (the counter is only ever absent with the key)
    if top[1] then redis.call('PERSIST', lk) end
    if ARGV[4] ~= '0' then session_lock_delay(sk, sexp, tonumber(ARGV[4])) end
  end
  if top[3] then notify(lk, top[3], now) end
  return tok
end
local ttl, ld, label = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local qk, wk, sp = other_keys(lk)
local retain = tonumber(ARGV[7])
local queued = ARGV[8] ~= nil
local live, d, f, purged = purge(lk, sp, now)
local has_queue = queued_hint(f)
for _, h in ipairs(live) do
  if h.owner == owner then
    -- it holds already: an answer it missed, or a hand-off (granted to its place in the queue) that
    -- it did not take; the grant is bound to the session it asks with now
    local rebound = h.ses ~= ses
    if rebound then
      h.ses = ses
      h.exp = 0
      if ses ~= '' then session_lock_delay(sk, sexp, h.ld) end
    end
    if ses == '' then h.exp = now + ttl end
    if rebound or ses == '' then redis.call('HSET', lk, 'h:' .. owner, holder_record(h)) end
    gc(lk, qk, wk, live, d, now, retain, not has_queue)
    if purged then notify(lk, f.w, now) end
    return h.tok
  end
end
local held = limit_conflict(live, mode, lim)
if held then
  -- refused: nothing of this request is written; a place it had (behind an exclusive holder, say) is given up
  if has_queue and redis.call('ZREM', qk, owner) == 1 then
    redis.call('HDEL', wk, owner)
    local queue_empty = hand_off(lk, qk, wk, sp, live, d, f, now, now_us, now_us_s)
    store_state(lk, f, state(live, not queue_empty, d > now))
    gc(lk, qk, wk, live, d, now, retain, queue_empty)
    notify(lk, f.w, now)
  elseif purged then
    gc(lk, qk, wk, live, d, now, retain, not has_queue)
    notify(lk, f.w, now)
  end
  return {'M', held}
end
local clear, queue_empty = false, not has_queue
if compatible(live, mode, lim) and now >= d then
  if not has_queue then
    clear = true
  else
    clear, queue_empty = clear_ahead(qk, wk, owner, mode, lim, lim and lim - #live, queued, now)
  end
end
if clear then
  local h = { owner = owner, mode = mode, lim = lim, tok = next_token(f.t, now_us, now_us_s), exp = 0, ld = ld, ses = ses, label = label }
  if ses == '' then h.exp = now + ttl else session_lock_delay(sk, sexp, ld) end
  live[#live + 1] = h
  f.t = h.tok
  redis.call('HSET', lk, 't', h.tok, 'h:' .. owner, holder_record(h))
  if queued and not queue_empty and redis.call('ZREM', qk, owner) == 1 then
    redis.call('HDEL', wk, owner)
    if mode == 's' then queue_empty = hand_off(lk, qk, wk, sp, live, d, f, now, now_us, now_us_s)
    else queue_empty = redis.call('ZCARD', qk) == 0 end
  end
  store_state(lk, f, state(live, not queue_empty, d > now))
  gc(lk, qk, wk, live, d, now, retain, queue_empty)
  notify(lk, f.w, now)
  return h.tok
end
if queued then
  if not redis.call('ZSCORE', qk, owner) then
    redis.call('ZADD', qk, num(redis.call('HINCRBY', lk, 'qs', 1)), owner)
  end
  local ch = ARGV[9]
  redis.call('HSET', wk, owner, waiter_record(ARGV[2], now + tonumber(ARGV[8]), wake_id(owner, ch), ARGV[4], ses, ch, label))
  queue_empty = false
end
store_state(lk, f, state(live, not queue_empty, d > now))
gc(lk, qk, wk, live, d, now, retain, queue_empty)
if purged then notify(lk, f.w, now) end
local holder_label, retry = busy(live, d, now)
return {'B', holder_label, retry}`,
);

/**
 * One acquire. `wakes`: this client's wake-up hub when a queued caller can be told on its channel
 * (then a busy answer carries the cursor `subscribe` takes); without it a queued caller is enqueued
 * without a channel and polls.
 */
export function acquire(ctx: OpContext, req: AcquireRequest, wakes: WakeHub | undefined): Promise<AcquireResult> {
  const lock = ctx.lockKey(req.key);
  const keys = req.session === undefined ? ([lock] as const) : ([lock, ctx.sessionPrefix + req.session] as const);
  // A permit's mode carries its limit (the Lua records it with the holder); an exclusive request has none.
  const mode = req.mode === 'exclusive' ? 'e' : req.limit === undefined ? 's' : (`s${req.limit}` as const);
  const ld = decimal(req.lockDelayMs);
  // Only a caller that will wait is enqueued: it alone sends its place's ttl and its wake-up channel.
  const args: AcquireArgs = req.queue
    ? [req.owner, mode, decimal(req.ttlMs), ld, req.holder, req.session ?? '', ctx.retain, String(req.queueTtlMs), wakes ? wakes.channel : '']
    : [req.owner, mode, decimal(req.ttlMs), ld, req.holder, req.session ?? '', ctx.retain];
  return ctx.runner.run(ACQUIRE, {
    keys,
    args,
    // Nobody listens for this answer any more: a grant in it must not hold the key until its ttl.
    onLate: (late) => {
      if (typeof late === 'string') void release(ctx, { key: req.key, owner: req.owner, token: BigInt(late), mode: req.mode }).catch(() => {});
    },
    map: (reply): AcquireResult => {
      if (typeof reply === 'string') {
        // Granted: the reply is the token. A wake-up that reached us after an earlier busy answer is stale now.
        wakes?.forgetOwner(req.owner);
        return { granted: true, token: BigInt(reply), ttlMs: req.ttlMs };
      }
      switch (reply[0]) {
        case 'B': {
          const holder = String(reply[1] ?? '');
          const retry = String(reply[2] ?? '');
          return {
            granted: false,
            ...(holder ? { holder } : {}),
            ...(retry ? { retryInMs: Number(retry) } : {}),
            ...(wakes ? { cursor: { wake: wakeIdOf(req.owner) } satisfies WakeCursor } : {}),
          };
        }
        case 'L':
          return { granted: false, sessionLost: true };
        case 'M':
          throw limitConflict(req.key, String(reply[1] ?? ''), req.limit);
        default:
          throw new BackendUnavailableError('redis', `acquire: unexpected reply ${JSON.stringify(reply)}`);
      }
    },
  });
}

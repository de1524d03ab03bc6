import { createHash, randomBytes } from 'node:crypto';
import type {
  AcquireRequest, AcquireResult, Backend, HandOff, KeyState, ReleaseRequest, RenewRequest, RenewResult, SessionSupport,
} from '../core/backend.js';
import { BackendUnavailableError, InvalidArgumentError } from '../core/errors.js';
import { checkBoolean, checkInteger, checkKnownOptions, checkObject, MAX_DURATION_MS } from '../core/validate.js';
import {
  checkKeyPrefix, connectUrl, deadline, decodeKey, encodeKey, globEscape, int, LuaLibrary, LuaRunner, mapRedisError, wrapClient,
  type Conn, type RedisClientLike, type Subscriber,
} from './client.js';

export interface RedisBackendOptions {
  /** `redis://…` or `rediss://…`; leasehold opens (and closes) its own ioredis connections. Give this or `client`. */
  url?: string;
  /**
   * An ioredis (`Redis` or `Cluster`) or node-redis client you already have; it stays yours (never
   * closed). Leave ioredis's `enableAutoPipelining` off on it: leasehold batches concurrent calls
   * itself, and auto-pipelining only adds a tick and a pipeline object to each call (measured:
   * about 40 % slower in sequence, and slower with 64 concurrent callers too).
   */
  client?: RedisClientLike;
  /** Prepended to every Redis key and channel leasehold uses; must not contain `{` or `}`. @default 'leasehold:' */
  prefix?: string;
  /**
   * One keep-alive per client keeps all its leases (a session key each lock refers to). Sessions
   * need a single Redis node: a lock and its holder's session live in different cluster slots.
   * @default true, false on a Redis Cluster client
   */
  sessions?: boolean;
  /** Longest wait for one Redis reply before the call fails with BackendUnavailableError. @default 2000 */
  commandTimeoutMs?: number;
  /**
   * How long an idle lock's token counter is kept after its last holder, waiter and lock-delay are
   * gone. Past it the key is garbage-collected and the next token comes from the server clock
   * floor alone (see {@link redisBackend}). @default 3600000 (1 hour)
   */
  retainMs?: number;
}

/** Defaults, each with its reason. */
export const REDIS_DEFAULTS = Object.freeze({
  prefix: 'leasehold:',
  /** 2 s: far above a healthy round trip, well below core's 5 s operation bound and any sane ttl. */
  commandTimeoutMs: 2_000,
  /** 1 h: a clock step back shorter than this cannot bring tokens back even for a key idle that long. */
  retainMs: 3_600_000,
});

/** A subscriber connection that failed is tried again after this long (meanwhile waiters poll). */
const SUBSCRIBER_RETRY_MS = 1_000;
/** Wake-ups that arrived before their waiter subscribed are kept this long, then dropped. */
const PENDING_WAKE_MS = 30_000;

// ---------------------------------------------------------------------------------------------
// Lua shared by the operations below and by redlock's scripts: numbers, the server clock, holder
// records (mode|token|expiresAt|lockDelayMs|session|label; expiresAt 0: the session decides),
// sessions (hash e = expiry in server ms, ld = longest lock-delay of its leases). All expiry is
// judged by the server's TIME (I7); key TTLs are only garbage collection.
// ---------------------------------------------------------------------------------------------
export const LUA_PRELUDE = `
local function num(x) return string.format('%.0f', x) end
local function clock()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return s * 1000 + math.floor(us / 1000), s * 1000000 + us
end
local function holder(v)
  local m, tok, exp, ld, ses, lab = string.match(v, '^(%a)|(%d+)|(%d+)|(%d+)|([^|]*)|(.*)$')
  if not m then return nil end
  return { mode = m, tok = tok, exp = tonumber(exp), ld = tonumber(ld), ses = ses, label = lab }
end
local function holder_record(h)
  return h.mode .. '|' .. h.tok .. '|' .. num(h.exp) .. '|' .. num(h.ld) .. '|' .. h.ses .. '|' .. h.label
end
local function session_expiry(sp, id)
  local e = redis.call('HGET', sp .. id, 'e')
  if e then return tonumber(e) end
  return -1
end
local function compatible(live, mode)
  if #live == 0 then return true end
  if mode == 'e' then return false end
  for _, h in ipairs(live) do if h.mode ~= 's' then return false end end
  return true
end
local function extend_at(key, at, now)
  local p = redis.call('PTTL', key)
  if p >= 0 and now + p < at then redis.call('PEXPIREAT', key, num(at)) end
end
`;

// ---------------------------------------------------------------------------------------------
// The redis backend's key layout (since leasehold 0.1.0; layouts of different leasehold versions
// are not compatible: do not point two versions at the same prefix). Keys of one lock, all in the
// slot of its hash tag:
//   lock    hash  t = last token, d = lock-delay end (server ms), qs = queue sequence,
//                  h:<owner> = holder record (see the prelude) for each holder,
//                  s = state hint: the number of holder fields, then `l` if one of them has a
//                  lock-delay, `q` while the queue may be non-empty and `d` while a lock-delay
//                  may run; absent when none of them is so
//   queue   zset  owner by arrival sequence                               (only while someone waits)
//   waiters hash  <owner> = mode|expiresAt|wakeId|lockDelayMs|session|#channel|channel label
//                  for each waiter (only while someone waits)
// The hint is exact where the fast paths rely on it: `s` absent means no holder field at all (live
// or expired), no queue entry and no lock-delay, so the key is free (one HMGET of `t` and `s`
// tells); `s` = 1 means one holder without lock-delay, nobody waits, no lock-delay runs. Every
// path that reads the whole
// hash (purge) writes `s` back from what it found.
// ---------------------------------------------------------------------------------------------

/**
 * Helpers of the redis backend's operations only.
 * clock_us: one TIME call giving now in ms, in µs, and the µs as a decimal string (built from
 * TIME's own digits: formatting a 16-digit number costs more than the redis.call).
 * next_token: max(counter + 1, now in µs), the token floor of I1.
 * other_keys: the queue and waiters keys of a lock and the session key prefix, named after the
 * lock key. Operations declare only the lock key (and the caller's session): the queue and
 * waiters keys share its hash tag, hence its cluster slot, and are touched only on the slow
 * paths; session keys of other holders (purge) cannot be known in advance anyway.
 * state / store_state / queued_hint: the `s` field (see the layout above).
 * purge: reads the lock hash; holders that expired (or whose session is gone) are removed and their
 * lock-delay starts (I8); `d` and `s` are written back when they changed. Returns the live
 * holders, the lock-delay end, the other fields (`f.s` kept equal to what is stored) and whether
 * it removed a holder (then the caller runs gc: a key kept for a holder now gone gets its TTL).
 * gc: key TTLs from the live holders: none while a session-bound holder lives (the session decides
 * its end), else the latest expiry plus lock-delay, plus `retain` for the counter.
 * hand_off: serves the queue once the key may have become free (release, cancel, a shared grant):
 * while the head waiter is compatible with the live holders and no lock-delay runs, a head that
 * asked with a live session is granted here (holder bound to that session, token raised as in
 * acquire) and its message is `wakeId|token|session`; the first head that cannot be granted so (no
 * session, or its session is gone) is only told to ask (`wakeId`), and the loop stops. Returns
 * whether the queue is empty. The caller writes `s` back.
 */
const BACKEND_HELPERS = `
local function clock_us()
  local t = redis.call('TIME')
  local s, us = t[1], t[2]
  local sn, usn = tonumber(s), tonumber(us)
  return sn * 1000 + math.floor(usn / 1000), sn * 1000000 + usn, s .. string.sub('00000' .. us, -6)
end
local function next_token(counter, now_us, now_us_s)
  local c = tonumber(counter or '0') + 1
  if c > now_us then return num(c) end
  return now_us_s
end
local function wake_id(owner, ch)
  if ch == '' then return '' end
  return string.sub(redis.sha1hex(owner), 1, 20)
end
local function other_keys(lk)
  return lk .. ':q', lk .. ':w', string.sub(lk, 1, string.find(lk, '{', 1, true) - 1) .. 'session:'
end
local function session_lock_delay(sk, sexp, ld)
  if ld > 0 and ld > tonumber(redis.call('HGET', sk, 'ld') or '0') then
    redis.call('HSET', sk, 'ld', num(ld))
    redis.call('PEXPIREAT', sk, num(sexp + ld))
  end
end
local function state(live, queued, delayed)
  local s = ''
  if #live > 0 then s = num(#live) end
  for _, h in ipairs(live) do
    if h.ld > 0 then
      s = s .. 'l'
      break
    end
  end
  if queued then s = s .. 'q' end
  if delayed then s = s .. 'd' end
  return s
end
local function store_state(lk, f, s)
  if s == (f.s or '') then return end
  if s == '' then
    redis.call('HDEL', lk, 's')
    f.s = nil
  else
    redis.call('HSET', lk, 's', s)
    f.s = s
  end
end
local function queued_hint(f)
  return f.s ~= nil and string.find(f.s, 'q', 1, true) ~= nil
end
local function purge(lk, sp, now)
  local all = redis.call('HGETALL', lk)
  local f, live, gone, nd = {}, {}, {}, 0
  for i = 1, #all, 2 do
    local k = all[i]
    if string.sub(k, 1, 2) == 'h:' then
      local h = holder(all[i + 1])
      if h and h.ses ~= '' then h.exp = session_expiry(sp, h.ses) end
      if not h or h.exp <= now then
        gone[#gone + 1] = k
        if h and h.ld > 0 and h.exp >= 0 and h.exp + h.ld > nd then nd = h.exp + h.ld end
      else
        h.owner = string.sub(k, 3)
        live[#live + 1] = h
      end
    else
      f[k] = all[i + 1]
    end
  end
  for i = 1, #gone, 100 do redis.call('HDEL', lk, unpack(gone, i, math.min(i + 99, #gone))) end
  local d = tonumber(f.d or '0')
  if nd > d then
    d = nd
    redis.call('HSET', lk, 'd', num(d))
  end
  store_state(lk, f, state(live, queued_hint(f), d > now))
  return live, d, f, #gone > 0
end
local function waiter(wk, owner)
  local v = redis.call('HGET', wk, owner)
  if not v then return nil end
  local m, exp, wake, ld, ses, n, rest = string.match(v, '^(%a)|(%d+)|([^|]*)|(%d+)|([^|]*)|(%d+)|(.*)$')
  if not m then return nil end
  n = tonumber(n)
  return { owner = owner, mode = m, exp = tonumber(exp), wake = wake, ld = tonumber(ld), ses = ses, ch = string.sub(rest, 1, n), label = string.sub(rest, n + 1) }
end
local function waiter_record(mode, exp, wake, ld, ses, ch, label)
  return mode .. '|' .. num(exp) .. '|' .. wake .. '|' .. ld .. '|' .. ses .. '|' .. #ch .. '|' .. ch .. label
end
local function drop_waiter(qk, wk, owner)
  redis.call('ZREM', qk, owner)
  redis.call('HDEL', wk, owner)
end
local function head(qk, wk, now)
  while true do
    local first = redis.call('ZRANGE', qk, 0, 0)[1]
    if not first then return nil end
    local w = waiter(wk, first)
    if w and w.exp > now then return w end
    drop_waiter(qk, wk, first)
  end
end
local function clear_ahead(qk, wk, owner, mode, queued, now)
  local start = 0
  while true do
    local batch = redis.call('ZRANGE', qk, start, start + 31)
    if #batch == 0 then return true, start == 0 end
    local kept = 0
    for _, o in ipairs(batch) do
      if o == owner then return true end
      local w = waiter(wk, o)
      if not w or w.exp <= now then
        drop_waiter(qk, wk, o)
      else
        if not queued or mode == 'e' or w.mode == 'e' then return false end
        kept = kept + 1
      end
    end
    start = start + kept
  end
end
local function hand_off(lk, qk, wk, sp, live, d, f, now, now_us, now_us_s)
  while true do
    local w = head(qk, wk, now)
    if not w then return true end
    if d > now or w.wake == '' or not compatible(live, w.mode) then return false end
    local sexp = -1
    if w.ses ~= '' then sexp = session_expiry(sp, w.ses) end
    if sexp <= now then
      redis.call('PUBLISH', w.ch, w.wake)
      return false
    end
    local h = { owner = w.owner, mode = w.mode, tok = next_token(f.t, now_us, now_us_s), exp = 0, ld = w.ld, ses = w.ses, label = w.label }
    f.t = h.tok
    live[#live + 1] = h
    redis.call('HSET', lk, 't', h.tok, 'h:' .. w.owner, holder_record(h))
    session_lock_delay(sp .. w.ses, sexp, w.ld)
    drop_waiter(qk, wk, w.owner)
    redis.call('PUBLISH', w.ch, w.wake .. '|' .. h.tok .. '|' .. w.ses)
  end
end
local function gc(lk, qk, wk, live, d, now, retain, queue_empty)
  local horizon = now
  for _, h in ipairs(live) do
    if h.ses ~= '' then
      redis.call('PERSIST', lk)
      if not queue_empty then
        redis.call('PERSIST', qk)
        redis.call('PERSIST', wk)
      end
      return
    end
    if h.exp + h.ld > horizon then horizon = h.exp + h.ld end
  end
  if d > horizon then horizon = d end
  redis.call('PEXPIREAT', lk, num(horizon + retain))
  if not queue_empty then
    redis.call('PEXPIREAT', qk, num(horizon + retain))
    redis.call('PEXPIREAT', wk, num(horizon + retain))
  end
end
`;

/**
 * acquire: grants, or answers busy (enqueueing the caller when it will wait). The token is raised
 * in the same call as the grant: max(counter + 1, server TIME in µs), so a counter lost with the
 * data cannot bring tokens back while the server clock moves forward (I1).
 * KEYS: lock[, session]. ARGV: owner, mode (e|s), ttl, lockDelay, label, session id ('' for none),
 * retain[, queueTtl, wake channel ('' when this client cannot be told)] — the last two only when
 * the caller will wait (it is then enqueued).
 * Returns the token (a string: granted) | {'B', holderLabel, retryInMs or ''} | {'L'} (session gone).
 * An owner that holds already (an answer it missed, or a hand-off it did not take) gets its grant
 * back, bound to the session it asks with now.
 *
 * Fast path, the common case: the key is free (no `s`): TIME, [session HGET], HMGET of counter and
 * state, one HSET of counter, state and holder, and one TTL command (PERSIST when the key existed,
 * for a session-bound holder; PEXPIREAT otherwise); no HGETALL, no queue, no record parsing.
 *
 * release: compare-and-delete on owner and token. A holder without lock-delay is deleted whether
 * or not it expired (a release and an expiry then end the same way, so its expiry need not be
 * judged); one with lock-delay is deleted only if still live (an expired one is left to purge,
 * which starts its lock-delay, I8). Then the queue is served from its head (hand_off: the head
 * waiter is granted the key, or told it may go).
 * KEYS: lock. ARGV: owner, token, retain. Returns 1 if released.
 * Fast path: the only holder, without lock-delay, nobody waiting (`s` = 1): HMGET, the token
 * compared in place, one HDEL of holder and state, and for a session-bound holder one PEXPIRE (the key lives `retain` for its
 * counter; a holder of its own already set a later expiry at its grant or last renewal).
 *
 * renew: extends the holder's expiry to now + ttl if owner and token match and it is still live
 * (a lease bound to a session extends its session instead).
 * KEYS: lock. ARGV: owner, token, ttl, retain. Returns 1 if renewed.
 *
 * cancel: leaves the wait queue, and gives back a grant that a hand-off made to this place and the
 * waiter did not take; then the queue is served from its head (hand_off).
 * KEYS: lock. ARGV: owner, retain. Returns 1 if a place or a handed grant was removed.
 *
 * inspect: state of one lock (purging what expired). KEYS: lock. ARGV: retain.
 * Returns {lastToken, lockDelayRemaining, waiters, then mode, token, expiresIn, label per holder}.
 *
 * session_open: a session living ttl from now (server clock). KEYS: session. ARGV: ttl.
 * session_keepalive: the one renewal per client per interval: extends the session, and with it
 * every lease bound to it, to now + ttl. The key outlives the expiry by the longest lock-delay of
 * its leases (a tombstone from which purge starts their lock-delay). KEYS: session. ARGV: ttl.
 * Returns 1 if alive.
 * session_close: ends a live session (its leases are free at once, without lock-delay); an expired
 * one keeps its tombstone. KEYS: session.
 */
const OPERATIONS = {
  acquire: `
local lk, sk = KEYS[1], KEYS[2]
local owner, mode, ses = ARGV[1], ARGV[2], ARGV[6]
local now, now_us, now_us_s = clock_us()
local sexp = 0
if ses ~= '' then
  local e = redis.call('HGET', sk, 'e')
  if not e then return {'L'} end
  sexp = tonumber(e)
  if sexp <= now then return {'L'} end
end
local top = redis.call('HMGET', lk, 't', 's')
if not top[2] then
  local tok = next_token(top[1], now_us, now_us_s)
  -- ARGV[4], the lock-delay, is a decimal integer (the client formats it): stored as given
  if ses == '' then
    local exp = now + tonumber(ARGV[3])
    redis.call('HSET', lk, 't', tok, 's', ARGV[4] == '0' and '1' or '1l', 'h:' .. owner, mode .. '|' .. tok .. '|' .. num(exp) .. '|' .. ARGV[4] .. '||' .. ARGV[5])
    redis.call('PEXPIREAT', lk, num(exp + tonumber(ARGV[4]) + tonumber(ARGV[7])))
  else
    redis.call('HSET', lk, 't', tok, 's', ARGV[4] == '0' and '1' or '1l', 'h:' .. owner, mode .. '|' .. tok .. '|0|' .. ARGV[4] .. '|' .. ses .. '|' .. ARGV[5])
    -- a key that did not exist has no TTL to remove (the counter is only ever absent with the key)
    if top[1] then redis.call('PERSIST', lk) end
    if ARGV[4] ~= '0' then session_lock_delay(sk, sexp, tonumber(ARGV[4])) end
  end
  return tok
end
local ttl, ld, label = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local qk, wk, sp = other_keys(lk)
local retain = tonumber(ARGV[7])
local queued = ARGV[8] ~= nil
local live, d, f = purge(lk, sp, now)
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
    return h.tok
  end
end
local clear, queue_empty = false, not has_queue
if compatible(live, mode) and now >= d then
  if has_queue then clear, queue_empty = clear_ahead(qk, wk, owner, mode, queued, now) else clear = true end
end
if clear then
  local h = { owner = owner, mode = mode, tok = next_token(f.t, now_us, now_us_s), exp = 0, ld = ld, ses = ses, label = label }
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
  return h.tok
end
if queued then
  if not redis.call('ZSCORE', qk, owner) then
    redis.call('ZADD', qk, num(redis.call('HINCRBY', lk, 'qs', 1)), owner)
  end
  local ch = ARGV[9]
  redis.call('HSET', wk, owner, waiter_record(mode, now + tonumber(ARGV[8]), wake_id(owner, ch), ARGV[4], ses, ch, label))
  queue_empty = false
end
store_state(lk, f, state(live, not queue_empty, d > now))
gc(lk, qk, wk, live, d, now, retain, queue_empty)
local soonest = -1
if d > now then soonest = d end
for _, h in ipairs(live) do
  local at = h.exp
  if d > at then at = d end
  if soonest < 0 or at < soonest then soonest = at end
end
local first = live[1]
local retry = ''
if soonest >= 0 then retry = num(soonest - now) end
return {'B', first and first.label or '', retry}`,

  release: `
local lk = KEYS[1]
local owner, token = ARGV[1], ARGV[2]
local hf = 'h:' .. owner
local top = redis.call('HMGET', lk, hf, 's')
local v = top[1]
if not v then return 0 end
-- the record is mode|token|expiresAt|…: the token is checked in place, without parsing
local n = #token
if top[2] == '1' and string.find(v, token, 3, true) == 3 and string.byte(v, n + 3) == 124 then
  -- the only holder, without lock-delay; nobody waits, no lock-delay runs: delete it and the
  -- state (the key is free)
  redis.call('HDEL', lk, hf, 's')
  -- a holder of its own set the key's expiry past now + retain at its grant or renewal; a
  -- session-bound one (expiresAt 0) had it removed: keep the counter retain from now
  if string.byte(v, n + 4) == 48 and string.byte(v, n + 5) == 124 then redis.call('PEXPIRE', lk, ARGV[3]) end
  return 1
end
local tok, ld = string.match(v, '^%a|(%d+)|%d+|(%d+)|')
if tok and tok ~= token then return 0 end
local qk, wk, sp = other_keys(lk)
local now, now_us, now_us_s = clock_us()
local released = 0
if ld == '0' then
  redis.call('HDEL', lk, hf)
  released = 1
else
  local h = holder(v)
  if h then
    local exp = h.exp
    if h.ses ~= '' then exp = session_expiry(sp, h.ses) end
    if exp > now then
      redis.call('HDEL', lk, hf)
      released = 1
    end
  end
end
local live, d, f = purge(lk, sp, now)
local queue_empty = true
if queued_hint(f) then
  queue_empty = hand_off(lk, qk, wk, sp, live, d, f, now, now_us, now_us_s)
  store_state(lk, f, state(live, not queue_empty, d > now))
end
gc(lk, qk, wk, live, d, now, tonumber(ARGV[3]), queue_empty)
return released`,

  renew: `
local lk = KEYS[1]
local owner, token, ttl, retain = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local qk, wk, sp = other_keys(lk)
local top = redis.call('HMGET', lk, 'h:' .. owner, 's')
if not top[1] then return 0 end
local h = holder(top[1])
if not h or h.tok ~= token then return 0 end
local now = clock()
if h.ses ~= '' then
  local sk = sp .. h.ses
  local s = redis.call('HMGET', sk, 'e', 'ld')
  if not s[1] or tonumber(s[1]) <= now then return 0 end
  redis.call('HSET', sk, 'e', num(now + ttl))
  redis.call('PEXPIREAT', sk, num(now + ttl + tonumber(s[2] or '0')))
  return 1
end
if h.exp <= now then return 0 end
h.exp = now + ttl
redis.call('HSET', lk, 'h:' .. owner, holder_record(h))
extend_at(lk, h.exp + h.ld + retain, now)
if queued_hint({ s = top[2] or nil }) then
  extend_at(qk, h.exp + h.ld + retain, now)
  extend_at(wk, h.exp + h.ld + retain, now)
end
return 1`,

  cancel: `
local lk = KEYS[1]
local owner, retain = ARGV[1], tonumber(ARGV[2])
local qk, wk, sp = other_keys(lk)
-- a hand-off may have granted the key to this place after the waiter stopped listening: give it back
local handed = redis.call('HDEL', lk, 'h:' .. owner) == 1
if not handed and not redis.call('ZSCORE', qk, owner) then
  redis.call('HDEL', wk, owner)
  return 0
end
local now, now_us, now_us_s = clock_us()
drop_waiter(qk, wk, owner)
local live, d, f = purge(lk, sp, now)
local queue_empty = hand_off(lk, qk, wk, sp, live, d, f, now, now_us, now_us_s)
store_state(lk, f, state(live, not queue_empty, d > now))
gc(lk, qk, wk, live, d, now, retain, queue_empty)
return 1`,

  inspect: `
local lk = KEYS[1]
local qk, wk, sp = other_keys(lk)
local now = clock()
local live, d, f, purged = purge(lk, sp, now)
local waiters = 0
if queued_hint(f) then
  for _, o in ipairs(redis.call('ZRANGE', qk, 0, -1)) do
    local w = waiter(wk, o)
    if w and w.exp > now then waiters = waiters + 1 else drop_waiter(qk, wk, o) end
  end
  if waiters == 0 then store_state(lk, f, state(live, false, d > now)) end
end
if purged then gc(lk, qk, wk, live, d, now, tonumber(ARGV[1]), not queued_hint(f)) end
local delay = 0
if d > now then delay = d - now end
local out = { f.t or '0', num(delay), waiters }
for _, h in ipairs(live) do
  out[#out + 1] = h.mode
  out[#out + 1] = h.tok
  out[#out + 1] = num(h.exp - now)
  out[#out + 1] = h.label
end
return out`,

  session_open: `
local now = clock()
local e = now + tonumber(ARGV[1])
redis.call('HSET', KEYS[1], 'e', num(e), 'ld', '0')
redis.call('PEXPIREAT', KEYS[1], num(e))
return 1`,

  session_keepalive: `
local s = redis.call('HMGET', KEYS[1], 'e', 'ld')
local now = clock()
if not s[1] or tonumber(s[1]) <= now then return 0 end
local e = now + tonumber(ARGV[1])
redis.call('HSET', KEYS[1], 'e', num(e))
redis.call('PEXPIREAT', KEYS[1], num(e + tonumber(s[2] or '0')))
return 1`,

  session_close: `
local e = redis.call('HGET', KEYS[1], 'e')
if e and tonumber(e) > clock() then redis.call('DEL', KEYS[1]) end
return 1`,
} as const;

/** The backend's operations: one Functions library (Redis 7+), or one script each (see {@link LuaLibrary}). */
export const REDIS_LIBRARY = new LuaLibrary('leasehold', `${LUA_PRELUDE}${BACKEND_HELPERS}`, OPERATIONS);

/**
 * Leases on one Redis server (or one Redis Cluster, without sessions).
 *
 * - One round trip per acquire, renew, release and session keep-alive: one call each, to a function
 *   of the leasehold Functions library (FCALL; loaded on first use, and again if the server lost
 *   it), or to a script (EVALSHA, EVAL on NOSCRIPT) where the server has no Functions or refuses
 *   them, and on a Cluster. Calls made while others are in flight go out together in batches
 *   (see {@link LuaRunner}). Expiry is judged inside the calls by the server's TIME (I7); key TTLs
 *   are garbage collection only. Release is compare-and-delete on owner and token (I4).
 * - Tokens: a grant's token is max(counter + 1, server TIME in µs), raised in the grant's script
 *   (I1, I2). Assumption, stated exactly: when the counter is lost (a restart without
 *   persistence, a failover to a replica that missed the last writes, or a key idle longer than
 *   `retainMs`), the next token is still larger than every earlier one provided the clock of the
 *   server that issues it reads later than the clock of the server that issued the key's previous
 *   grant read at that grant. After a restart that is one machine's clock, which must not step
 *   back across the loss by more than the time since that grant; after a failover it compares the
 *   new primary's clock with the old primary's, so the replica's clock may lag the old primary's
 *   by less than the time from that grant to the first grant after the failover. (A counter only
 *   runs ahead of TIME when one key is granted more than once per microsecond, which one script
 *   per grant cannot do.)
 * - Waiting without polling: a waiter is enqueued by its busy answer with this client's channel;
 *   release, cancel and shared grants serve the head waiter only (no herd): one that asked with a
 *   session is granted the key in that same call and its message carries the grant (see
 *   `Backend.subscribe`), so a hand-off is one hop; any other is told to ask. FIFO, and a releaser
 *   or a `tryAcquire` cannot barge past waiters. Expiry has no event in Redis: the busy answer's
 *   `retryInMs` and core's bounded re-check cover it and lost messages.
 * - Sessions: one keep-alive per client and ttl keeps all of its leases (a lock refers to its
 *   session; a lock whose session is gone is free). Single node only (see `sessions`).
 */
export function redisBackend(options: RedisBackendOptions): Backend {
  const o = checkObject(options, 'options');
  checkKnownOptions(o, ['url', 'client', 'prefix', 'sessions', 'commandTimeoutMs', 'retainMs'], 'options');
  if ((o.url === undefined) === (o.client === undefined)) throw new InvalidArgumentError('options', 'give exactly one of url or client');
  const prefix = o.prefix === undefined ? REDIS_DEFAULTS.prefix : checkKeyPrefix(o.prefix, 'options.prefix');
  const commandTimeoutMs = o.commandTimeoutMs === undefined ? REDIS_DEFAULTS.commandTimeoutMs : checkInteger(o.commandTimeoutMs, 'options.commandTimeoutMs', 1, MAX_DURATION_MS);
  const retainMs = o.retainMs === undefined ? REDIS_DEFAULTS.retainMs : checkInteger(o.retainMs, 'options.retainMs', 60_000, MAX_DURATION_MS);
  const conn: Conn = o.url !== undefined ? connectUrl(o.url, 'options.url') : wrapClient(o.client, 'options.client');
  const withSessions = o.sessions === undefined ? !conn.isCluster : checkBoolean(o.sessions, 'options.sessions');
  const sessionPrefix = `${prefix}session:`;
  const retain = String(retainMs);
  let closed = false;

  /** The lock key; its queue and waiters keys (`<lock>:q`, `<lock>:w`) are named in the Lua (other_keys). */
  const lockKey = (key: string): string => `${prefix}{${encodeKey(key)}}`;

  const ensureOpen = (): void => {
    if (closed) throw new InvalidArgumentError('backend', 'this redis backend was closed');
  };

  const runner = new LuaRunner(conn, REDIS_LIBRARY, { batching: true, timeoutMs: commandTimeoutMs, backend: 'redis' });
  const run = <T = unknown, R = T>(what: string, op: string, keys: readonly string[], args: readonly string[], onLate?: (value: T) => void, map?: (value: T) => R): Promise<R> => {
    if (closed) return Promise.reject(new InvalidArgumentError('backend', 'this redis backend was closed'));
    return runner.run<T, R>(op, keys, args, what, onLate, map);
  };

  const wakes = new WakeHub(conn, `${prefix}wake:${randomBytes(12).toString('hex')}`, commandTimeoutMs);

  const release = (req: ReleaseRequest): Promise<void> =>
    run('release', 'release', [lockKey(req.key)], [req.owner, req.token.toString(), retain], undefined, ignore);

  const sessions: SessionSupport = {
    async open(ttlMs) {
      const id = randomBytes(16).toString('hex');
      await run('session open', 'session_open', [sessionPrefix + id], [String(ttlMs)]);
      return { id, ttlMs };
    },
    async keepAlive(id, ttlMs) {
      return int(await run('session keep-alive', 'session_keepalive', [sessionPrefix + id], [String(ttlMs)])) === 1;
    },
    async close(id) {
      await run('session close', 'session_close', [sessionPrefix + id], []);
    },
  };

  const send = (req: AcquireRequest, wakeable: boolean): Promise<AcquireResult> => {
    const keys = req.session === undefined ? [lockKey(req.key)] : [lockKey(req.key), sessionPrefix + req.session];
    const args = [req.owner, req.mode === 'shared' ? 's' : 'e', decimal(req.ttlMs), decimal(req.lockDelayMs), req.holder, req.session ?? '', retain];
    // Only a caller that will wait is enqueued: it alone sends its place's ttl and its wake-up channel.
    if (req.queue) args.push(String(req.queueTtlMs), wakeable ? wakes.channel : '');
    // Nobody listens for this answer any more: a grant in it must not hold the key until its ttl.
    const onLate = (late: unknown): void => {
      if (typeof late === 'string') void release({ key: req.key, owner: req.owner, token: BigInt(late), mode: req.mode }).catch(() => {});
    };
    return run('acquire', 'acquire', keys, args, onLate, (reply: string | unknown[]): AcquireResult => {
      if (typeof reply === 'string') {
        // Granted: the reply is the token. A wake-up that reached us after an earlier busy answer is stale now.
        if (wakeable) wakes.forgetOwner(req.owner);
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
            ...(wakeable ? { cursor: { wake: wakeIdOf(req.owner) } satisfies WakeCursor } : {}),
          };
        }
        case 'L':
          return { granted: false, sessionLost: true };
        default:
          throw new BackendUnavailableError('redis', `acquire: unexpected reply ${JSON.stringify(reply)}`);
      }
    });
  };

  const backend: Backend = {
    name: 'redis',
    capabilities: Object.freeze({ fair: true, minTtlMs: 0 }),

    acquire(req: AcquireRequest): Promise<AcquireResult> {
      if (closed) return Promise.reject(new InvalidArgumentError('backend', 'this redis backend was closed'));
      if (!req.queue) return send(req, false);
      // Queued waiters are told on this client's channel, once it is subscribed (the first time: wait for it).
      const ready = wakes.ready();
      return typeof ready === 'boolean' ? send(req, ready) : ready.then((ok) => send(req, ok));
    },

    async renew(req: RenewRequest): Promise<RenewResult> {
      const r = await run('renew', 'renew', [lockKey(req.key)], [req.owner, req.token.toString(), String(req.ttlMs), retain]);
      return int(r) === 1 ? { renewed: true, ttlMs: req.ttlMs } : { renewed: false };
    },

    release,

    async cancelWait({ key, owner }) {
      wakes.forgetOwner(owner);
      await run('cancel wait', 'cancel', [lockKey(key)], [owner, retain]);
    },

    async subscribe(_key: string, onChange: (handOff?: HandOff) => void, cursor?: unknown) {
      ensureOpen();
      // Only queued waiters are told (the head, on its own channel); others poll with backoff.
      if (!isWakeCursor(cursor)) throw new BackendUnavailableError('redis', 'wake-ups are sent to queued (fair) waiters only; polling instead');
      return wakes.register(cursor.wake, onChange);
    },

    async inspect(prefixOfKeys: string): Promise<KeyState[]> {
      ensureOpen();
      const pattern = `${globEscape(prefix)}{${globEscape(encodeKey(prefixOfKeys))}*`;
      const metas = new Set<string>();
      try {
        for (const target of conn.scanTargets()) {
          let cursor = '0';
          do {
            const [next, found] = (await deadline(target.command(['SCAN', cursor, 'MATCH', pattern, 'COUNT', '1000']), commandTimeoutMs, 'redis', 'scan')) as [string, string[]];
            cursor = String(next);
            for (const k of found) if (k.endsWith('}')) metas.add(k);
          } while (cursor !== '0');
        }
      } catch (error) {
        throw mapRedisError('redis', 'inspect', error);
      }
      const out: KeyState[] = [];
      const all = [...metas];
      for (let i = 0; i < all.length; i += 100) {
        const batch = all.slice(i, i + 100);
        const replies = await Promise.all(batch.map((meta) => run<unknown[]>('inspect', 'inspect', [meta], [retain])));
        batch.forEach((meta, j) => {
          const r = replies[j]!;
          const holders = [];
          for (let x = 3; x + 3 < r.length; x += 4) {
            holders.push({
              mode: r[x] === 's' ? ('shared' as const) : ('exclusive' as const),
              token: BigInt(String(r[x + 1])),
              expiresInMs: Math.max(0, Number(r[x + 2])),
              holder: String(r[x + 3]),
            });
          }
          const waiters = int(r[2]);
          const lockDelayRemainingMs = Number(r[1]);
          if (holders.length === 0 && waiters === 0 && lockDelayRemainingMs === 0) return;
          out.push({ key: decodeKey(meta.slice(prefix.length + 1, -1)), lastToken: BigInt(String(r[0])), holders, waiters, lockDelayRemainingMs });
        });
      }
      return out.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
    },

    /**
     * Bounded even against a server that accepts connections and never answers: QUIT on each of our
     * connections (this one and the wake-up subscriber) is waited for at most `commandTimeoutMs`,
     * then the sockets are dropped. A client passed in stays open.
     */
    async close() {
      if (closed) return;
      closed = true;
      await Promise.all([wakes.close(), conn.close(commandTimeoutMs)]);
    },
  };
  if (withSessions) backend.sessions = sessions;
  return backend;
}

interface WakeCursor {
  readonly wake: string;
}

function isWakeCursor(value: unknown): value is WakeCursor {
  return typeof value === 'object' && value !== null && typeof (value as WakeCursor).wake === 'string' && (value as WakeCursor).wake !== '';
}

/**
 * The public name of a waiter in wake messages: a digest of its owner id, never the id itself (I4).
 * The acquire operation derives the same name (`wake_id`) when it enqueues the waiter.
 */
function wakeIdOf(owner: string): string {
  return createHash('sha1').update(owner).digest('hex').slice(0, 20);
}

function ignore(): void {}

/** A duration as the decimal integer the Lua stores as given (core passes integers; round a stray fraction up). */
function decimal(ms: number): string {
  return Number.isInteger(ms) ? String(ms) : String(Math.ceil(ms));
}

/**
 * This client's wake-up channel: one SUBSCRIBE per backend (on a second connection), messages
 * naming the waiter (`wakeId`), or handing it the key (`wakeId|token|session`). A message that
 * arrives before its waiter subscribed is kept, so the subscription fires at once (no lost wake-up
 * between the busy answer and the subscription).
 */
class WakeHub {
  readonly #conn: Conn;
  readonly channel: string;
  /** The backend's commandTimeoutMs: bounds opening the subscriber and its QUIT at close. */
  readonly #timeoutMs: number;
  /** Aborted by close(): a subscriber still connecting is dropped at once. */
  readonly #closing = new AbortController();
  readonly #handlers = new Map<string, Set<(handOff?: HandOff) => void>>();
  readonly #pending = new Map<string, { at: number; handOff: HandOff | undefined }>();
  #sub: Promise<Subscriber> | undefined;
  #subscriber: Subscriber | undefined;
  #failedAt = -Infinity;
  #closed = false;

  constructor(conn: Conn, channel: string, timeoutMs: number) {
    this.#conn = conn;
    this.channel = channel;
    this.#timeoutMs = timeoutMs;
  }

  /** True when wake-ups can be delivered now (subscribes on first use, and only then answers later). */
  ready(): boolean | Promise<boolean> {
    if (this.#closed) return false;
    if (this.#subscriber) return this.#subscriber.ready;
    return this.#open();
  }

  async #open(): Promise<boolean> {
    if (!this.#sub) {
      if (performance.now() - this.#failedAt < SUBSCRIBER_RETRY_MS) return false;
      const opening = this.#conn.subscribe(this.channel, (message) => this.#deliver(message), this.#timeoutMs, this.#closing.signal);
      this.#sub = opening;
      opening.catch(() => {
        this.#failedAt = performance.now();
        if (this.#sub === opening) this.#sub = undefined;
      });
    }
    try {
      const sub = await this.#sub;
      if (this.#closed) return false;
      this.#subscriber = sub;
      return sub.ready;
    } catch {
      return false;
    }
  }

  #deliver(message: string): void {
    const [wake = '', token, session] = message.split('|', 3);
    const handOff = token !== undefined && session !== undefined && /^\d{1,20}$/.test(token) ? { token: BigInt(token), session } : undefined;
    const handlers = this.#handlers.get(wake);
    if (handlers) {
      for (const fn of [...handlers]) fn(handOff);
      return;
    }
    const now = performance.now();
    this.#pending.set(wake, { at: now, handOff });
    if (this.#pending.size > 1_000) {
      for (const [w, p] of this.#pending) if (now - p.at > PENDING_WAKE_MS) this.#pending.delete(w);
    }
  }

  register(wake: string, onChange: (handOff?: HandOff) => void): () => void {
    let set = this.#handlers.get(wake);
    if (!set) this.#handlers.set(wake, (set = new Set()));
    set.add(onChange);
    const pending = this.#pending.get(wake);
    if (pending) {
      this.#pending.delete(wake);
      queueMicrotask(() => onChange(pending.handOff));
    }
    return () => {
      set.delete(onChange);
      if (set.size === 0 && this.#handlers.get(wake) === set) this.#handlers.delete(wake);
    };
  }

  /** Drops a wake-up kept for this owner's waiter (it was granted, or gave up). */
  forgetOwner(owner: string): void {
    if (this.#pending.size > 0) this.#pending.delete(wakeIdOf(owner));
  }

  /** Bounded: a subscriber still connecting is dropped now, an open one gets QUIT for at most the command timeout. */
  async close(): Promise<void> {
    this.#closed = true;
    this.#closing.abort();
    for (const set of this.#handlers.values()) for (const fn of set) fn();
    this.#handlers.clear();
    this.#pending.clear();
    const sub = this.#sub;
    this.#sub = undefined;
    this.#subscriber = undefined;
    if (sub) await sub.then((s) => s.close(this.#timeoutMs)).catch(() => {});
  }
}

import { createHash } from 'node:crypto';

/**
 * The wait queue of a lock and the hand-off: the Lua helpers that serve waiters in arrival order
 * (FIFO, no barging), part of the library's prelude after `lock-hash.ts`. Used by acquire (enqueue,
 * and a shared grant serving the shared waiters behind it), release and cancel.
 *
 * wake_id(owner, ch): the public name of a waiter in wake messages, a digest of its owner id (never
 *   the id itself, I4; {@link wakeIdOf} is the same in TypeScript); '' when it has no channel.
 * waiter(wk, owner) / waiter_record(…): a waiter's record in the waiters hash,
 *   `mode|expiresAt|wakeId|lockDelayMs|session|#channel|channel label` (the channel's length first,
 *   so a label may hold any character; a permit's mode is followed by its limit, `s3`, as in a
 *   holder record).
 * drop_waiter(qk, wk, owner): removes a waiter from the queue and the waiters hash.
 * head(qk, wk, now): the first live waiter (expired ones ahead of it are dropped), or nil.
 * clear_ahead(qk, wk, owner, mode, lim, room, queued, now): whether `owner` may be granted now
 *   past the waiters ahead of it. Expired waiters are dropped on the way; a caller that will wait
 *   (`queued`) in shared mode passes live shared waiters of its own limit (they are granted
 *   alongside) — a permit only while fewer than `room` (the free permits) are ahead of it: the
 *   first `room` permit waiters get them; any other live waiter ahead stops it. Returns clear, and
 *   — when it looked at the whole queue and kept nobody — that the queue is empty.
 * hand_off(lk, qk, wk, sp, live, d, f, now, now_us, now_us_s): serves the queue once the key may
 *   have become free (release, cancel, a shared grant): while the head waiter is compatible with the
 *   live holders (for a permit: one is free) and no lock-delay runs, a head that asked with a live
 *   session is granted here
 *   (holder bound to that session, token raised as in acquire) and its message is
 *   `wakeId|token|session`; the first head that cannot be granted so (no session, or its session is
 *   gone) is only told to ask (`wakeId`), and the loop stops; so is a head whose limit the holders
 *   do not share (it is refused when it asks, which gives up its place and serves the queue).
 *   Returns whether the queue is empty.
 *   The caller writes `s` back.
 */
export const QUEUE_HELPERS = `
local function wake_id(owner, ch)
  if ch == '' then return '' end
  return string.sub(redis.sha1hex(owner), 1, 20)
end
local function waiter(wk, owner)
  local v = redis.call('HGET', wk, owner)
  if not v then return nil end
  local m, lim, exp, wake, ld, ses, n, rest = string.match(v, '^(%a)(%d*)|(%d+)|([^|]*)|(%d+)|([^|]*)|(%d+)|(.*)$')
  if not m then return nil end
  n = tonumber(n)
  return {
    owner = owner, mode = m, lim = tonumber(lim), exp = tonumber(exp), wake = wake, ld = tonumber(ld), ses = ses,
    ch = string.sub(rest, 1, n), label = string.sub(rest, n + 1),
  }
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
local function clear_ahead(qk, wk, owner, mode, lim, room, queued, now)
  local start, ahead = 0, 0
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
        if not queued or mode == 'e' or w.mode == 'e' or w.lim ~= lim then return false end
        ahead = ahead + 1
        if room and ahead >= room then return false end
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
    if d > now or w.wake == '' then return false end
    if not compatible(live, w.mode, w.lim) then
      if limit_conflict(live, w.mode, w.lim) then redis.call('PUBLISH', w.ch, w.wake) end
      return false
    end
    local sexp = -1
    if w.ses ~= '' then sexp = session_expiry(sp, w.ses) end
    if sexp <= now then
      redis.call('PUBLISH', w.ch, w.wake)
      return false
    end
    local h = { owner = w.owner, mode = w.mode, lim = w.lim, tok = next_token(f.t, now_us, now_us_s), exp = 0, ld = w.ld, ses = w.ses, label = w.label }
    f.t = h.tok
    live[#live + 1] = h
    redis.call('HSET', lk, 't', h.tok, 'h:' .. w.owner, holder_record(h))
    session_lock_delay(sp .. w.ses, sexp, w.ld)
    drop_waiter(qk, wk, w.owner)
    redis.call('PUBLISH', w.ch, w.wake .. '|' .. h.tok .. '|' .. w.ses)
  end
end
`;

/**
 * The public name of a waiter in wake messages: a digest of its owner id, never the id itself (I4).
 * The Lua derives the same name (`wake_id`) when it enqueues the waiter.
 */
export function wakeIdOf(owner: string): string {
  return createHash('sha1').update(owner).digest('hex').slice(0, 20);
}

/**
 * The redis backend's key layout, and the Lua helpers that read and write a lock's hash. Every
 * operation in this folder sees them (they are part of the library's prelude, after the shared
 * `lua/prelude.ts`).
 *
 * Key layout (since leasehold 0.1.0; layouts of different leasehold versions are not compatible: do
 * not point two versions at the same prefix). Keys of one lock, all in the slot of its hash tag:
 *   lock    hash  t = last token, d = lock-delay end (server ms), qs = queue sequence,
 *                 h:<owner> = holder record (`lua/prelude.ts`) for each holder,
 *                 s = state hint: the number of holder fields, then `l` if one of them has a
 *                 lock-delay, `q` while the queue may be non-empty and `d` while a lock-delay
 *                 may run; absent when none of them is so,
 *                 w = until when (server ms) a client watches the key (`watch.ts`): while it is in
 *                 the future, a change of holders is published on the key's watch channel
 *   queue   zset  owner by arrival sequence                               (only while someone waits)
 *   waiters hash  <owner> = mode|expiresAt|wakeId|lockDelayMs|session|#channel|channel label
 *                 for each waiter (only while someone waits; see `queue.ts`)
 * and, per session, `<prefix>session:<id>`, a hash: e = expiry (server ms), ld = the longest
 * lock-delay of its leases.
 * The hint is exact where the fast paths rely on it: `s` absent means no holder field at all (live
 * or expired), no queue entry and no lock-delay, so the key is free (one HMGET of `t` and `s`
 * tells); `s` = 1 means one holder without lock-delay, nobody waits, no lock-delay runs. Every path
 * that reads the whole hash (purge) writes `s` back from what it found.
 *
 * clock_us(): one TIME call giving now in ms, in µs, and the µs as a decimal string (built from
 *   TIME's own digits: formatting a 16-digit number costs more than the redis.call).
 * next_token(counter, now_us, now_us_s): max(counter + 1, now in µs), the token floor of I1.
 * other_keys(lk): the queue and waiters keys of a lock and the session key prefix, named after the
 *   lock key. Operations declare only the lock key (and the caller's session): the queue and
 *   waiters keys share its hash tag, hence its cluster slot, and are touched only on the slow
 *   paths; session keys of other holders (purge) cannot be known in advance anyway.
 * session_lock_delay(sk, sexp, ld): a lease with lock-delay `ld` joins session `sk` (expiring at
 *   `sexp`): the session records the longest lock-delay of its leases and its key outlives its
 *   expiry by that much (a tombstone from which purge starts their lock-delay, I8).
 * state / store_state / queued_hint: the `s` field (see the layout above).
 * purge(lk, sp, now): reads the lock hash; holders that expired (or whose session is gone) are
 *   removed and their lock-delay starts (I8); `d` and `s` are written back when they changed.
 *   Returns the live holders, the lock-delay end, the other fields (`f.s` kept equal to what is
 *   stored) and whether it removed a holder (then the caller runs gc: a key kept for a holder now
 *   gone gets its TTL).
 * notify(lk, w, now): a change of the key's holders (a grant, a release, an expiry noticed) told
 *   to its watchers: PUBLISH on `<lock key>:watch` when `w` (the field, as read) is set; where the
 *   caller has no `now` (a fast path that reads no TIME) without judging it, else a lapsed `w` is
 *   deleted instead. Nobody watching costs nothing: the field is read in the same HMGET/HGETALL.
 * gc(lk, qk, wk, live, d, now, retain, queue_empty): key TTLs from the live holders: none while a
 *   session-bound holder lives (the session decides its end), else the latest expiry plus
 *   lock-delay, plus `retain` for the counter.
 */
export const LOCK_HELPERS = `
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
local function notify(lk, w, now)
  if not w then return end
  if now and tonumber(w) <= now then
    redis.call('HDEL', lk, 'w')
    return
  end
  redis.call('PUBLISH', lk .. ':watch', '')
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

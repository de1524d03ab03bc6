/**
 * Lua shared by the redis backend's operations (`ops/`) and by Redlock's per-server scripts
 * (`redlock/`): numbers, the server clock, holder records and sessions. All expiry is judged by the
 * server's TIME (I7); key TTLs are only garbage collection.
 *
 * num(x): a number as a decimal integer string (no exponent).
 * clock(): the server's TIME as ms and µs.
 * holder(v) / holder_record(h): a holder record, `mode|token|expiresAt|lockDelayMs|session|label`
 *   (mode e|s, a semaphore permit's followed by its limit: `s3`; expiresAt in server ms, 0 when the
 *   session decides; session '' for none). A record without a limit (a plain lock, or data written
 *   before permits existed) reads as `lim` nil.
 * session_expiry(sp, id): the expiry of session `id` (hash `e` under prefix `sp`), -1 when gone. A
 *   session hash holds e = expiry in server ms and ld = the longest lock-delay of its leases.
 * compatible(live, mode, lim): whether a holder of `mode` (a permit: `lim`, else nil) may join the
 *   live holders: the key is free; or it is shared, all its holders share `lim` and, for permits,
 *   fewer than `lim` hold.
 * limit_conflict(live, mode, lim): for a shared request (a permit, or plain: `lim` nil), the limit
 *   the live shared holders record when it is not `lim` (a decimal string; '' for plain shared
 *   holders), else nil. Such a request is refused, not queued (`AcquireRequest.limit`).
 * extend_at(key, at, now): moves the key's expiry to `at` if it would expire earlier (never shortens).
 * busy(live, d, now): what a busy answer tells: the first live holder's label ('' when none) and the
 *   ms until the key could free by expiry, the soonest of the live holders' expiry and the lock-delay
 *   end `d`, each no earlier than `d` (a decimal string; '' when neither is known).
 * inspect_reply(t, d, now, waiters, live, digests): an inspect answer: {t, lock-delay left (ms),
 *   waiters, then per live holder: [digest of its owner, when `digests`,] mode (e|s, a permit's
 *   s<limit>), token, expiresIn (ms), label}.
 */
export const LUA_PRELUDE = `
local function num(x) return string.format('%.0f', x) end
local function clock()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return s * 1000 + math.floor(us / 1000), s * 1000000 + us
end
local function holder(v)
  local m, lim, tok, exp, ld, ses, lab = string.match(v, '^(%a)(%d*)|(%d+)|(%d+)|(%d+)|([^|]*)|(.*)$')
  if not m then return nil end
  return { mode = m, lim = tonumber(lim), tok = tok, exp = tonumber(exp), ld = tonumber(ld), ses = ses, label = lab }
end
local function holder_record(h)
  return h.mode .. (h.lim and num(h.lim) or '') .. '|' .. h.tok .. '|' .. num(h.exp) .. '|' .. num(h.ld) .. '|' .. h.ses .. '|' .. h.label
end
local function session_expiry(sp, id)
  local e = redis.call('HGET', sp .. id, 'e')
  if e then return tonumber(e) end
  return -1
end
local function compatible(live, mode, lim)
  if #live == 0 then return true end
  if mode == 'e' then return false end
  for _, h in ipairs(live) do if h.mode ~= 's' or h.lim ~= lim then return false end end
  return lim == nil or #live < lim
end
local function limit_conflict(live, mode, lim)
  if mode ~= 's' then return nil end
  for _, h in ipairs(live) do
    if h.mode == 's' and h.lim ~= lim then return h.lim and num(h.lim) or '' end
  end
  return nil
end
local function extend_at(key, at, now)
  local p = redis.call('PTTL', key)
  if p >= 0 and now + p < at then redis.call('PEXPIREAT', key, num(at)) end
end
local function busy(live, d, now)
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
  return first and first.label or '', retry
end
local function inspect_reply(t, d, now, waiters, live, digests)
  local delay = 0
  if d > now then delay = d - now end
  local out = { t, num(delay), waiters }
  for _, h in ipairs(live) do
    if digests then out[#out + 1] = redis.sha1hex(h.owner) end
    out[#out + 1] = h.mode .. (h.lim and num(h.lim) or '')
    out[#out + 1] = h.tok
    out[#out + 1] = num(h.exp - now)
    out[#out + 1] = h.label
  end
  return out
end
`;

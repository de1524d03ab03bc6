/**
 * Redlock's key layout on each server, and the Lua helpers its per-server scripts share (after the
 * shared `lua/prelude.ts`). Expiry is judged by each server's own TIME.
 *
 * Keys per lock and server, all named after the lock key `<prefix>{<encoded key>}`:
 *   meta        hash  t = last token, d = lock-delay end (server ms)
 *   holders     hash  owner → holder record `mode|token|expiresAt|lockDelay||label` (token 0 until
 *                     the commit phase; no session)                    (`<meta>:h`)
 *   contenders  zset  digest of refused owners → expiry (inspect's `waiters`)  (`<meta>:q`)
 *
 * purge(mk, hk, now, d): removes expired holders (their lock-delay starts, I8) and returns the live
 *   ones and the lock-delay end.
 * gc(mk, hk, ck, live, d, now, retain): key TTLs from the live holders' expiry and lock-delay, plus
 *   `retain` for the counter.
 */
export const NODE_HELPERS = `
local function purge(mk, hk, now, d)
  local all = redis.call('HGETALL', hk)
  local live = {}
  local nd = d
  for i = 1, #all, 2 do
    local h = holder(all[i + 1])
    if not h or h.exp <= now then
      redis.call('HDEL', hk, all[i])
      if h and h.ld > 0 and h.exp + h.ld > nd then nd = h.exp + h.ld end
    else
      h.owner = all[i]
      live[#live + 1] = h
    end
  end
  if nd > d then redis.call('HSET', mk, 'd', num(nd)) end
  return live, nd
end
local function gc(mk, hk, ck, live, d, now, retain)
  local horizon = now
  for _, h in ipairs(live) do
    if h.exp + h.ld > horizon then horizon = h.exp + h.ld end
  end
  if #live > 0 then redis.call('PEXPIREAT', hk, num(horizon)) end
  if d > horizon then horizon = d end
  redis.call('PEXPIREAT', mk, num(horizon + retain))
  redis.call('PEXPIREAT', ck, num(horizon + retain))
end
`;

/** The three keys of a lock on every server (see above). */
export type LockKeys = readonly [meta: string, holders: string, contenders: string];

export function lockKeys(meta: string): LockKeys {
  return [meta, `${meta}:h`, `${meta}:q`];
}

import { LuaScript } from '../lua/script.js';
import { LUA_PRELUDE } from '../lua/prelude.js';
import { NODE_HELPERS, type LockKeys } from './helpers.js';

/**
 * Extends our record on one server; where the server has none (it restarted empty, or our record
 * expired there alone) and the key is free there (for a permit: one is free), records it again
 * with the token, as granted.
 *
 * KEYS: meta, holders, contenders. ARGV: owner, token, ttl (ms), mode (e|s|s<limit>), lockDelay
 * (ms), label, retain (ms). Reply: 1 if held here, else 0.
 */
export const NODE_RENEW = new LuaScript<
  LockKeys,
  readonly [owner: string, token: string, ttl: string, mode: 'e' | 's' | `s${number}`, lockDelay: string, label: string, retain: string],
  0 | 1
>(
  'redlock-renew',
  `${LUA_PRELUDE}${NODE_HELPERS}
local mk, hk, ck = KEYS[1], KEYS[2], KEYS[3]
local owner, token, ttl, ld, label, retain = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7])
local mode, lim = string.sub(ARGV[4], 1, 1), tonumber(string.sub(ARGV[4], 2))
local now = clock()
local v = redis.call('HGET', hk, owner)
if v then
  local h = holder(v)
  if h and h.tok ~= token and h.tok ~= '0' then return 0 end
  if h and h.exp > now then
    h.exp = now + ttl
    h.tok = token
    redis.call('HSET', hk, owner, holder_record(h))
    extend_at(hk, h.exp + h.ld, now)
    extend_at(mk, h.exp + h.ld + retain, now)
    return 1
  end
end
local meta = redis.call('HMGET', mk, 't', 'd')
local live, d = purge(mk, hk, now, tonumber(meta[2] or '0'))
if not compatible(live, mode, lim) or now < d then return 0 end
local h = { owner = owner, mode = mode, lim = lim, tok = token, exp = now + ttl, ld = ld, ses = '', label = label }
redis.call('HSET', hk, owner, holder_record(h))
if tonumber(meta[1] or '0') < tonumber(token) then redis.call('HSET', mk, 't', token) end
live[#live + 1] = h
gc(mk, hk, ck, live, d, now, retain)
return 1
`,
);

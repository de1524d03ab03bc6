import { LuaScript } from '../lua/script.js';
import { LUA_PRELUDE } from '../lua/prelude.js';
import { NODE_HELPERS, type LockKeys } from './helpers.js';

/**
 * Phase 1 of an acquire, on one server: records the holder if the key is free there (token pending,
 * 0, until the commit) and reads the server's counter and clock; a refused owner is remembered as
 * a contender for `contenderTtl`. A semaphore permit (mode `s<limit>`) is recorded, with its limit,
 * while fewer than its limit hold here; a shared request whose limit the holders here do not share
 * is refused and nothing is written ('M').
 *
 * KEYS: meta, holders, contenders. ARGV: owner, mode (e|s|s<limit>), ttl (ms), lockDelay (ms),
 * label, retain (ms), contenderTtl (ms). Reply: {'G', counter, TIME in µs} (recorded here) | {'B',
 * a holder's label, retryInMs or '', counter} (busy here) | {'M', the holders' limit ('' for plain
 * shared ones), counter} (another limit here).
 */
export const NODE_ACQUIRE = new LuaScript<
  LockKeys,
  readonly [owner: string, mode: 'e' | 's' | `s${number}`, ttl: string, lockDelay: string, label: string, retain: string, contenderTtl: string],
  | readonly ['G', counter: string, timeUs: string]
  | readonly ['B', label: string, retryInMs: string, counter: string]
  | readonly ['M', held: string, counter: string]
>(
  'redlock-acquire',
  `${LUA_PRELUDE}${NODE_HELPERS}
local mk, hk, ck = KEYS[1], KEYS[2], KEYS[3]
local owner, ttl, ld, label = ARGV[1], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local mode, lim = string.sub(ARGV[2], 1, 1), tonumber(string.sub(ARGV[2], 2))
local retain, cttl = tonumber(ARGV[6]), tonumber(ARGV[7])
local now, now_us = clock()
local meta = redis.call('HMGET', mk, 't', 'd')
local t = meta[1] or '0'
local live, d = purge(mk, hk, now, tonumber(meta[2] or '0'))
for _, h in ipairs(live) do
  if h.owner == owner then
    h.exp = now + ttl
    redis.call('HSET', hk, owner, holder_record(h))
    gc(mk, hk, ck, live, d, now, retain)
    return {'G', t, num(now_us)}
  end
end
local held = limit_conflict(live, mode, lim)
if held then
  gc(mk, hk, ck, live, d, now, retain)
  return {'M', held, t}
end
local digest = redis.sha1hex(owner)
if compatible(live, mode, lim) and now >= d then
  local h = { owner = owner, mode = mode, lim = lim, tok = '0', exp = now + ttl, ld = ld, ses = '', label = label }
  redis.call('HSET', hk, owner, holder_record(h))
  live[#live + 1] = h
  redis.call('ZREM', ck, digest)
  gc(mk, hk, ck, live, d, now, retain)
  return {'G', t, num(now_us)}
end
redis.call('ZADD', ck, num(now + cttl), digest)
gc(mk, hk, ck, live, d, now, retain)
local holder_label, retry = busy(live, d, now)
return {'B', holder_label, retry, t}
`,
);

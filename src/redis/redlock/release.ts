import { LuaScript } from '../lua/script.js';
import { LUA_PRELUDE } from '../lua/prelude.js';
import { NODE_HELPERS, type LockKeys } from './helpers.js';

/**
 * Compare-and-delete on one server (an expired record is left to purge: lock-delay, I8).
 *
 * KEYS: meta, holders, contenders. ARGV: owner, token ('0': whatever token, to give back an
 * unfinished grant), retain (ms). Reply: 1 if a record of ours was there, else 0.
 */
export const NODE_RELEASE = new LuaScript<LockKeys, readonly [owner: string, token: string, retain: string], 0 | 1>(
  'redlock-release',
  `${LUA_PRELUDE}${NODE_HELPERS}
local mk, hk, ck = KEYS[1], KEYS[2], KEYS[3]
local owner, token, retain = ARGV[1], ARGV[2], tonumber(ARGV[3])
local v = redis.call('HGET', hk, owner)
if not v then return 0 end
local h = holder(v)
if h and token ~= '0' and h.tok ~= token and h.tok ~= '0' then return 0 end
local now = clock()
if h and h.exp > now then redis.call('HDEL', hk, owner) end
local live, d = purge(mk, hk, now, tonumber(redis.call('HGET', mk, 'd') or '0'))
gc(mk, hk, ck, live, d, now, retain)
return 1
`,
);

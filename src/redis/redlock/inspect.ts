import { LuaScript } from '../lua/script.js';
import { LUA_PRELUDE } from '../lua/prelude.js';
import { NODE_HELPERS, type LockKeys } from './helpers.js';

/**
 * One server's view of a key (purging what expired there).
 *
 * KEYS: meta, holders, contenders. ARGV: none. Reply: {counter, lockDelayRemaining (ms), live
 * contenders, then per holder: digest of its owner, mode (e|s, a permit's s<limit>), token, expiresIn (ms), label}.
 */
export const NODE_INSPECT = new LuaScript<
  LockKeys,
  readonly [],
  readonly [counter: string, lockDelayRemaining: string, contenders: number, ...holders: string[]]
>(
  'redlock-inspect',
  `${LUA_PRELUDE}${NODE_HELPERS}
local mk, hk, ck = KEYS[1], KEYS[2], KEYS[3]
local now = clock()
local meta = redis.call('HMGET', mk, 't', 'd')
local live, d = purge(mk, hk, now, tonumber(meta[2] or '0'))
redis.call('ZREMRANGEBYSCORE', ck, '-inf', num(now))
return inspect_reply(meta[1] or '0', d, now, redis.call('ZCARD', ck), live, true)
`,
);

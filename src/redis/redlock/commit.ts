import { LuaScript } from '../lua/script.js';
import { LUA_PRELUDE } from '../lua/prelude.js';
import { NODE_HELPERS, type LockKeys } from './helpers.js';

/**
 * Phase 2 of an acquire, on one server: raises the key's counter to the proposal only if it is
 * lower (strictly), and stamps our holder record with it. A server that already has the proposal
 * or more answers with its counter: another grant got there first.
 *
 * KEYS: meta, holders (contenders: unused). ARGV: owner, proposal, retain (ms).
 * Reply: {1} (accepted) | {0, counter} (refused: the counter is at or above the proposal).
 */
export const NODE_COMMIT = new LuaScript<LockKeys, readonly [owner: string, proposal: string, retain: string], readonly [1] | readonly [0, counter: string]>(
  'redlock-commit',
  `${LUA_PRELUDE}${NODE_HELPERS}
local mk, hk = KEYS[1], KEYS[2]
local owner, p, retain = ARGV[1], ARGV[2], tonumber(ARGV[3])
local c = redis.call('HGET', mk, 't') or '0'
if tonumber(c) >= tonumber(p) then return {0, c} end
local now = clock()
redis.call('HSET', mk, 't', p)
local pt = redis.call('PTTL', mk)
if pt < retain then redis.call('PEXPIREAT', mk, num(now + retain)) end
local v = redis.call('HGET', hk, owner)
if v then
  local h = holder(v)
  if h then
    h.tok = p
    redis.call('HSET', hk, owner, holder_record(h))
  end
end
return {1}
`,
);

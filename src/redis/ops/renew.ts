import type { RenewRequest, RenewResult } from '../../core/backend.js';
import { luaOp } from '../lua/library.js';
import { int } from '../lua/script.js';
import type { OpContext } from './context.js';

/**
 * renew: extends the holder's expiry to now + ttl if owner and token match and it is still live (a
 * lease bound to a session extends its session instead: every lease of that session with it).
 *
 * KEYS: lock. ARGV: owner, token, ttl (ms), retain (ms). Reply: 1 if renewed, 0 if not held (any more).
 */
export const RENEW = luaOp<[lock: string], [owner: string, token: string, ttl: string, retain: string], 0 | 1>(
  'renew',
  'renew',
  `
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
);

export async function renew(ctx: OpContext, req: RenewRequest): Promise<RenewResult> {
  const r = await ctx.runner.run(RENEW, { keys: [ctx.lockKey(req.key)], args: [req.owner, req.token.toString(), String(req.ttlMs), ctx.retain] });
  return int(r) === 1 ? { renewed: true, ttlMs: req.ttlMs } : { renewed: false };
}

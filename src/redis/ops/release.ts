import type { ReleaseRequest } from '../../core/backend.js';
import { luaOp } from '../lua/library.js';
import type { OpContext } from './context.js';

/**
 * release: compare-and-delete on owner and token (I4). A holder without lock-delay is deleted
 * whether or not it expired (a release and an expiry then end the same way, so its expiry need not
 * be judged); one with lock-delay is deleted only if still live (an expired one is left to purge,
 * which starts its lock-delay, I8). Then the queue is served from its head (hand_off: the head
 * waiter is granted the key, or told it may go), and the key's watchers are told (notify).
 *
 * KEYS: lock. ARGV: owner, token, retain (ms). Reply: 1 if released, 0 if it held nothing (any more).
 *
 * Fast path: the only holder, without lock-delay, nobody waiting (`s` = 1): HMGET, the token
 * compared in place, one HDEL of holder and state, and for a session-bound holder one PEXPIRE (the
 * key lives `retain` for its counter; a holder of its own already set a later expiry at its grant
 * or last renewal).
 */
export const RELEASE = luaOp<[lock: string], [owner: string, token: string, retain: string], 0 | 1>(
  'release',
  'release',
  `
local lk = KEYS[1]
local owner, token = ARGV[1], ARGV[2]
local hf = 'h:' .. owner
local top = redis.call('HMGET', lk, hf, 's', 'w')
local v = top[1]
if not v then return 0 end
-- the record is mode|token|expiresAt|… (a permit's mode with its limit, s3): the token is checked
-- in place, without parsing; o is where it starts (3 but for a permit)
local n = #token
local o = string.find(v, '|', 2, true)
o = o and o + 1
if top[2] == '1' and o and string.find(v, token, o, true) == o and string.byte(v, n + o) == 124 then
  -- the only holder, without lock-delay; nobody waits, no lock-delay runs: delete it and the
  -- state (the key is free)
  redis.call('HDEL', lk, hf, 's')
  -- a holder of its own set the key's expiry past now + retain at its grant or renewal; a
  -- session-bound one (expiresAt 0) had it removed: keep the counter retain from now
  if string.byte(v, n + o + 1) == 48 and string.byte(v, n + o + 2) == 124 then redis.call('PEXPIRE', lk, ARGV[3]) end
  if top[3] then notify(lk, top[3], nil) end
  return 1
end
local tok, ld = string.match(v, '^%a%d*|(%d+)|%d+|(%d+)|')
if tok and tok ~= token then return 0 end
local qk, wk, sp = other_keys(lk)
local now, now_us, now_us_s = clock_us()
local released = 0
if ld == '0' then
  redis.call('HDEL', lk, hf)
  released = 1
else
  local h = holder(v)
  if h then
    local exp = h.exp
    if h.ses ~= '' then exp = session_expiry(sp, h.ses) end
    if exp > now then
      redis.call('HDEL', lk, hf)
      released = 1
    end
  end
end
local live, d, f = purge(lk, sp, now)
local queue_empty = true
if queued_hint(f) then
  queue_empty = hand_off(lk, qk, wk, sp, live, d, f, now, now_us, now_us_s)
  store_state(lk, f, state(live, not queue_empty, d > now))
end
gc(lk, qk, wk, live, d, now, tonumber(ARGV[3]), queue_empty)
notify(lk, f.w, now)
return released`,
);

/** Releases; idempotent (a lease already gone resolves the same). */
export function release(ctx: OpContext, req: ReleaseRequest): Promise<void> {
  return ctx.runner.run(RELEASE, { keys: [ctx.lockKey(req.key)], args: [req.owner, req.token.toString(), ctx.retain], map: ignore });
}

function ignore(): void {}

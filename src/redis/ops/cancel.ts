import { luaOp } from '../lua/library.js';
import type { WakeHub } from '../wake-hub.js';
import type { OpContext } from './context.js';

/**
 * cancel: leaves the wait queue, and gives back a grant that a hand-off made to this place and the
 * waiter did not take; then the queue is served from its head (hand_off).
 *
 * KEYS: lock. ARGV: owner, retain (ms). Reply: 1 if a place or a handed grant was removed, else 0.
 */
export const CANCEL = luaOp<[lock: string], [owner: string, retain: string], 0 | 1>(
  'cancel',
  'cancel wait',
  `
local lk = KEYS[1]
local owner, retain = ARGV[1], tonumber(ARGV[2])
local qk, wk, sp = other_keys(lk)
-- a hand-off may have granted the key to this place after the waiter stopped listening: give it back
local handed = redis.call('HDEL', lk, 'h:' .. owner) == 1
if not handed and not redis.call('ZSCORE', qk, owner) then
  redis.call('HDEL', wk, owner)
  return 0
end
local now, now_us, now_us_s = clock_us()
drop_waiter(qk, wk, owner)
local live, d, f = purge(lk, sp, now)
local queue_empty = hand_off(lk, qk, wk, sp, live, d, f, now, now_us, now_us_s)
store_state(lk, f, state(live, not queue_empty, d > now))
gc(lk, qk, wk, live, d, now, retain, queue_empty)
notify(lk, f.w, now)
return 1`,
);

/** Gives up `owner`'s place in the queue of `key` (and a hand-off it did not take); idempotent. */
export async function cancelWait(ctx: OpContext, wakes: WakeHub, { key, owner }: { key: string; owner: string }): Promise<void> {
  wakes.forgetOwner(owner);
  await ctx.runner.run(CANCEL, { keys: [ctx.lockKey(key)], args: [owner, ctx.retain] });
}

import type { HolderState, KeyState } from '../../core/backend.js';
import { mapRedisError } from '../errors.js';
import { keyOfLock, lockPattern } from '../keys.js';
import { luaOp } from '../lua/library.js';
import { int } from '../lua/script.js';
import type { OpContext } from './context.js';

/** lastToken, lockDelayRemaining (ms), waiters, then per holder: mode (e|s, a permit's s<limit>), token, expiresIn (ms), label. */
type InspectReply = readonly [lastToken: string, lockDelayRemaining: string, waiters: number, ...holders: string[]];

/**
 * inspect: the state of one lock, purging what expired (holders whose time or session ran out,
 * waiters whose place expired).
 *
 * KEYS: lock. ARGV: retain (ms). Reply: {lastToken, lockDelayRemaining, waiters, then mode (e|s,
 * a permit's s<limit>), token, expiresIn, label per holder}. Holders it found expired are told to
 * the key's watchers (notify).
 */
export const INSPECT = luaOp<[lock: string], [retain: string], InspectReply>(
  'inspect',
  'inspect',
  `
local lk = KEYS[1]
local qk, wk, sp = other_keys(lk)
local now = clock()
local live, d, f, purged = purge(lk, sp, now)
local waiters = 0
if queued_hint(f) then
  for _, o in ipairs(redis.call('ZRANGE', qk, 0, -1)) do
    local w = waiter(wk, o)
    if w and w.exp > now then waiters = waiters + 1 else drop_waiter(qk, wk, o) end
  end
  if waiters == 0 then store_state(lk, f, state(live, false, d > now)) end
end
if purged then
  gc(lk, qk, wk, live, d, now, tonumber(ARGV[1]), not queued_hint(f))
  notify(lk, f.w, now)
end
return inspect_reply(f.t or '0', d, now, waiters, live, false)`,
);

/** Locks looked at per round (their scripts run concurrently, and batched). */
const INSPECT_BATCH = 100;

/**
 * The keys starting with `keyPrefix` that have a holder, a waiter or a lock-delay: SCAN for their
 * lock keys (every master of a cluster), then one inspect script each. Unsorted (core sorts).
 */
export async function inspect(ctx: OpContext, keyPrefix: string): Promise<KeyState[]> {
  const pattern = lockPattern(ctx.prefix, keyPrefix);
  const locks = new Set<string>();
  try {
    for (const target of ctx.conn.scanTargets()) {
      let cursor = '0';
      do {
        const [next, found] = (await ctx.deadlines.bound(target.command(['SCAN', cursor, 'MATCH', pattern, 'COUNT', '1000']), 'scan')) as [string, string[]];
        cursor = String(next);
        for (const k of found) if (k.endsWith('}')) locks.add(k);
      } while (cursor !== '0');
    }
  } catch (error) {
    throw mapRedisError('redis', 'inspect', error);
  }
  const out: KeyState[] = [];
  const all = [...locks];
  for (let i = 0; i < all.length; i += INSPECT_BATCH) {
    const batch = all.slice(i, i + INSPECT_BATCH);
    const replies = await Promise.all(batch.map((lock) => ctx.runner.run(INSPECT, { keys: [lock], args: [ctx.retain] })));
    batch.forEach((lock, j) => {
      const r = replies[j]!;
      const holders: HolderState[] = [];
      let limit: number | undefined;
      for (let x = 3; x + 3 < r.length; x += 4) {
        const mode = String(r[x]);
        if (mode.length > 1) limit ??= Number(mode.slice(1));
        holders.push({
          mode: mode[0] === 's' ? 'shared' : 'exclusive',
          token: BigInt(String(r[x + 1])),
          expiresInMs: Math.max(0, Number(r[x + 2])),
          holder: String(r[x + 3]),
        });
      }
      const waiters = int(r[2]);
      const lockDelayRemainingMs = Number(r[1]);
      if (holders.length === 0 && waiters === 0 && lockDelayRemainingMs === 0) return;
      out.push({
        key: keyOfLock(ctx.prefix, lock),
        lastToken: BigInt(String(r[0])),
        holders,
        waiters,
        lockDelayRemainingMs,
        ...(limit !== undefined && { limit }),
      });
    });
  }
  return out;
}

import type { WatchKey } from '../../core/backend.js';
import { KeyWatchSet, type WatchedKey } from '../../core/key-watches.js';
import { BackendUnavailableError, LeaseholdError } from '../../core/errors.js';
import { luaOp } from '../lua/library.js';
import { int } from '../lua/script.js';
import type { WakeHub } from '../wake-hub.js';
import type { OpContext } from './context.js';

/** lastToken, live holders, ms until the soonest of them expires (-1: none). */
type WatchReply = readonly [lastToken: string, holders: number, soonestExpiry: number];

/**
 * watch: marks the key as watched until now + `until` (the lock hash's `w`, never moved earlier),
 * so the operations publish its changes (`notify` in `lock-hash.ts`), and reads what a watcher
 * compares between two calls: the last token and the number of live holders (every grant raises the
 * one, every release or expiry without a grant lowers the other, so the pair changes whenever the
 * holders do). Holders found expired are purged and told, as inspect does. A key that did not exist
 * gets a TTL no shorter than the mark (none while a session-bound holder keeps it).
 *
 * KEYS: lock. ARGV: until (ms), retain (ms). Reply: {lastToken, holders, ms until the soonest holder
 * expires or -1}.
 */
export const WATCH = luaOp<[lock: string], [until: string, retain: string], WatchReply>(
  'watch',
  'watch',
  `
local lk = KEYS[1]
local qk, wk, sp = other_keys(lk)
local now = clock()
local live, d, f, purged = purge(lk, sp, now)
if purged then
  gc(lk, qk, wk, live, d, now, tonumber(ARGV[2]), not queued_hint(f))
  notify(lk, f.w, now)
end
local w = now + tonumber(ARGV[1])
if not f.w or tonumber(f.w) < w then redis.call('HSET', lk, 'w', num(w)) end
local soonest, bound = -1, false
for _, h in ipairs(live) do
  if h.ses ~= '' then bound = true end
  if soonest < 0 or h.exp < soonest then soonest = h.exp end
end
if not bound then
  local p = redis.call('PTTL', lk)
  if p < 0 or now + p < w then redis.call('PEXPIREAT', lk, num(w)) end
end
if soonest >= 0 then soonest = soonest - now end
return { f.t or '0', #live, soonest }`,
);

/** Timings of key watches, each with its reason. */
export const WATCH_DEFAULTS = Object.freeze({
  /**
   * 30 s: a client that watched and vanished (crashed, without unwatching) costs the key's
   * operations a PUBLISH each for at most this long.
   */
  markMs: 30_000,
  /**
   * 10 s: the mark is renewed this often (three times per mark), and the key's state compared, so a
   * message lost while the subscriber reconnected is made up for within this long.
   */
  refreshMs: 10_000,
  /** 1 s: a refresh that failed (the server unreachable) is tried again this soon. */
  retryMs: 1_000,
});

/**
 * `Backend.watch` on Redis: change notifications of keys, pushed by the operations' scripts.
 *
 * - A watched key carries a mark (`w`, until when someone watches); every operation reads it in the
 *   command it runs anyway (the HMGET of the fast paths, purge's HGETALL) and, while it is set,
 *   PUBLISHes on `<lock key>:watch` after a grant, a release or an expiry it noticed. Keys nobody
 *   watches cost nothing: no extra command, no PUBLISH.
 * - Each client subscribes the channels of the keys it watches on its one subscriber connection
 *   (the wake-up hub's); several watchers of one key in one client share the subscription and mark.
 * - Per watched key and client, one `watch` call every `refreshMs`, or sooner at the soonest
 *   holder's expiry: it renews the mark, and purges there, so an expiry nobody else noticed is
 *   told (Redis has no expiry event for a hash field); its answer is compared with the last one,
 *   which makes up for messages lost while the subscriber was reconnecting.
 * `onChange` may fire more than once per change and spuriously; it never throws into the caller.
 */
export class KeyWatches {
  readonly #ctx: OpContext;
  readonly #wakes: WakeHub;
  readonly #set = new KeyWatchSet({ open: (key) => this.#open(key), refreshMs: WATCH_DEFAULTS.refreshMs, retryMs: WATCH_DEFAULTS.retryMs });

  constructor(ctx: OpContext, wakes: WakeHub) {
    this.#ctx = ctx;
    this.#wakes = wakes;
  }

  readonly watch: WatchKey = async (key, onChange) => {
    if (this.#set.closed) throw new BackendUnavailableError('redis', 'watch: the backend is closed');
    return this.#set.watch(key, onChange);
  };

  /** Stops every watch (timers, subscriptions); the subscriber connection itself is the hub's to close. */
  close(): void {
    this.#set.close();
  }

  #open(key: string): WatchedKey {
    const ctx = this.#ctx;
    const lock = ctx.lockKey(key);
    return {
      // Subscribed first, then marked: a change after the mark is published to a listener already there.
      listen: (heard) => this.#wakes.listen(`${lock}:watch`, heard.tell).catch(unavailable),
      look: async () => {
        const [t, holders, soonest] = await ctx.runner.run(WATCH, { keys: [lock], args: [String(WATCH_DEFAULTS.markMs), ctx.retain] }).catch(unavailable);
        const next = int(soonest);
        return { lastToken: t, holders: int(holders), soonestExpiryMs: next >= 0 ? next : undefined };
      },
    };
  }
}

function unavailable(error: unknown): never {
  if (error instanceof LeaseholdError) throw error;
  throw new BackendUnavailableError('redis', `watch: ${(error as Error).message}`, { cause: error });
}

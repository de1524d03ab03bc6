import type { WatchKey } from '../../core/backend.js';
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

interface Watched {
  readonly lock: string;
  readonly listeners: Set<() => void>;
  /** watch() calls that hold this entry (resolved or still subscribing); the entry ends at 0. */
  refs: number;
  /** Resolves once subscribed and marked. */
  ready: Promise<void>;
  /** The last token and holder count of the last refresh (`t:n`). */
  seen: string | undefined;
  timer: ReturnType<typeof setTimeout> | undefined;
  unlisten: (() => void) | undefined;
  ended: boolean;
}

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
  readonly #keys = new Map<string, Watched>();
  #closed = false;

  constructor(ctx: OpContext, wakes: WakeHub) {
    this.#ctx = ctx;
    this.#wakes = wakes;
  }

  readonly watch: WatchKey = async (key, onChange) => {
    if (this.#closed) throw new BackendUnavailableError('redis', 'watch: the backend is closed');
    const lock = this.#ctx.lockKey(key);
    let w = this.#keys.get(lock);
    if (!w) {
      const entry: Watched = {
        lock,
        listeners: new Set(),
        refs: 0,
        ready: Promise.resolve(),
        seen: undefined,
        timer: undefined,
        unlisten: undefined,
        ended: false,
      };
      entry.ready = this.#start(entry);
      this.#keys.set(lock, entry);
      w = entry;
    }
    const watched = w;
    watched.refs++;
    try {
      await watched.ready;
    } catch (error) {
      this.#release(watched);
      throw error;
    }
    // A distinct function per call: the same callback watched twice is two subscriptions.
    const listener = (): void => onChange();
    watched.listeners.add(listener);
    let done = false;
    return () => {
      if (done) return;
      done = true;
      watched.listeners.delete(listener);
      this.#release(watched);
    };
  };

  /** Stops every watch (timers, subscriptions); the subscriber connection itself is the hub's to close. */
  close(): void {
    this.#closed = true;
    for (const w of this.#keys.values()) this.#end(w);
    this.#keys.clear();
  }

  async #start(w: Watched): Promise<void> {
    try {
      // Subscribed first, then marked: a change after the mark is published to a listener already there.
      w.unlisten = await this.#wakes.listen(`${w.lock}:watch`, () => this.#fire(w));
      if (w.ended) {
        w.unlisten();
        return;
      }
      await this.#refresh(w);
    } catch (error) {
      this.#end(w);
      if (this.#keys.get(w.lock) === w) this.#keys.delete(w.lock);
      if (error instanceof LeaseholdError) throw error;
      throw new BackendUnavailableError('redis', `watch: ${(error as Error).message}`, { cause: error });
    }
  }

  async #refresh(w: Watched): Promise<void> {
    const ctx = this.#ctx;
    const [t, holders, soonest] = await ctx.runner.run(WATCH, { keys: [w.lock], args: [String(WATCH_DEFAULTS.markMs), ctx.retain] });
    if (w.ended) return;
    const seen = `${t}:${int(holders)}`;
    const changed = w.seen !== undefined && w.seen !== seen;
    w.seen = seen;
    const next = int(soonest);
    this.#arm(w, next >= 0 ? Math.min(WATCH_DEFAULTS.refreshMs, next + 1) : WATCH_DEFAULTS.refreshMs);
    if (changed) this.#fire(w);
  }

  #arm(w: Watched, ms: number): void {
    clearTimeout(w.timer);
    w.timer = setTimeout(() => {
      w.timer = undefined;
      this.#refresh(w).catch(() => {
        if (!w.ended) this.#arm(w, WATCH_DEFAULTS.retryMs);
      });
    }, ms);
    w.timer.unref?.();
  }

  #fire(w: Watched): void {
    for (const fn of [...w.listeners]) {
      try {
        fn();
      } catch {
        // a watcher's callback failing is its own business: the others are still told
      }
    }
  }

  #release(w: Watched): void {
    if (--w.refs > 0) return;
    this.#end(w);
    if (this.#keys.get(w.lock) === w) this.#keys.delete(w.lock);
  }

  #end(w: Watched): void {
    w.ended = true;
    clearTimeout(w.timer);
    w.timer = undefined;
    w.unlisten?.();
    w.unlisten = undefined;
  }
}

/**
 * The per-caller rate limit's counters, as a store for @fastify/rate-limit. Its own LocalStore hands
 * every request the same mutable record of the key and the plugin reads `current` from it only after
 * an await, so requests that arrive in one tick (pipelined on one connection, or through inject) all
 * read the final count and all of them are refused, the first `max` included. This store answers
 * each request with its own snapshot: exactly the first `max` of a window get through.
 *
 * Fixed windows per key, as the plugin's store keeps them. Keys are caller names (the auth file's,
 * or `anonymous`), so the map stays as small as the list of callers; expired windows are swept when
 * it grows anyway.
 */

/** Sweep expired windows once the map holds this many keys. */
const SWEEP_AT = 10_000;

interface Window {
  count: number;
  startedAt: number;
}

type Answer = (error: Error | null, result: { current: number; ttl: number }) => void;

export class CallerRateStore {
  readonly #windows = new Map<string, Window>();

  /** Counts one request of `key` in its window; answers its own count and the window's time left. */
  incr(key: string, answer: Answer, timeWindow: number): void {
    const now = Date.now();
    let w = this.#windows.get(key);
    if (!w || w.startedAt + timeWindow <= now) {
      if (!w && this.#windows.size >= SWEEP_AT) this.#sweep(now, timeWindow);
      w = { count: 0, startedAt: now };
      this.#windows.set(key, w);
    }
    w.count++;
    answer(null, { current: w.count, ttl: w.startedAt + timeWindow - now });
  }

  /** The count of `key` without counting (the plugin's `increment: false`). */
  read(key: string, answer: Answer, timeWindow: number): void {
    const now = Date.now();
    const w = this.#windows.get(key);
    if (!w || w.startedAt + timeWindow <= now) answer(null, { current: 0, ttl: 0 });
    else answer(null, { current: w.count, ttl: w.startedAt + timeWindow - now });
  }

  /** A route with its own limit counts on its own (unused here: one limit for every route). */
  child(): CallerRateStore {
    return new CallerRateStore();
  }

  #sweep(now: number, timeWindow: number): void {
    for (const [key, w] of this.#windows) if (w.startedAt + timeWindow <= now) this.#windows.delete(key);
  }
}

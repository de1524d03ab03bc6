import { BackendUnavailableError } from '../core/errors.js';
import { mapRedisError } from './errors.js';

/** A call watched for its deadline; `live` turns false when it settles or times out. */
export interface Watched {
  /** When it times out (performance.now() ms). */
  at: number;
  /** What the call was, for the timeout's message (`acquire`, `scan`…). */
  readonly what: string;
  readonly reject: (error: unknown) => void;
  live: boolean;
  prev: Watched | undefined;
  next: Watched | undefined;
}

/**
 * The deadlines of the Redis calls of one backend (or fence): each call in flight fails with
 * BackendUnavailableError `<what> got no answer within <ms> ms` when `ms` pass without an answer
 * (a dead or half-open connection must not hang a caller), and a late answer goes to the call's
 * `onLate` (e.g. give back a grant).
 *
 * One instance per backend, not one for the process: all of a backend's calls share one bound, so
 * its calls in flight form one doubly linked list in start order — a settled call unlinks itself in
 * O(1) and the sweep looks only at the oldest ones. One unref'd sweep timer per instance runs while
 * a call is in flight and stops with the last one; a call is timed out between `ms` and `ms` + the
 * sweep interval (a tenth of `ms`, 5 to 100 ms) after it started. (A timer per call costs more, and
 * a Set of entries instead of the list made every young-generation GC copy and scan far more under
 * 64 concurrent callers: 3–17 ms per scavenge instead of about 1 ms.)
 */
export class Deadlines {
  readonly ms: number;
  readonly #backend: string;
  readonly #every: number;
  #head: Watched | undefined;
  #tail: Watched | undefined;
  #sweeper: ReturnType<typeof setInterval> | undefined;

  constructor(ms: number, backend: string) {
    this.ms = ms;
    this.#backend = backend;
    this.#every = Math.min(100, Math.max(5, Math.floor(ms / 10)));
  }

  /** Starts watching `entry` (its `at` is set here: now + ms). */
  watch(entry: Watched): void {
    entry.at = performance.now() + this.ms;
    entry.prev = this.#tail;
    if (this.#tail) this.#tail.next = entry;
    else this.#head = entry;
    this.#tail = entry;
    if (!this.#sweeper) {
      this.#sweeper = setInterval(this.#sweep, this.#every);
      this.#sweeper.unref();
    }
  }

  /** Stops watching `entry` (it settled); it is no longer live. */
  unwatch(entry: Watched): void {
    entry.live = false;
    if (entry.prev) entry.prev.next = entry.next;
    else this.#head = entry.next;
    if (entry.next) entry.next.prev = entry.prev;
    else this.#tail = entry.prev;
    entry.prev = entry.next = undefined;
  }

  /**
   * `promise`, bounded: after `ms` it rejects with BackendUnavailableError; its own failure becomes a
   * LeaseholdError ({@link mapRedisError}); a late answer goes to `onLate`.
   */
  bound<T>(promise: Promise<T>, what: string, onLate?: (value: T) => void): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const entry: Watched = { at: 0, what, reject, live: true, prev: undefined, next: undefined };
      this.watch(entry);
      promise.then(
        (value) => {
          if (!entry.live) onLate?.(value);
          else {
            this.unwatch(entry);
            resolve(value);
          }
        },
        (error: unknown) => {
          if (entry.live) {
            this.unwatch(entry);
            reject(mapRedisError(this.#backend, what, error));
          }
        },
      );
    });
  }

  /** Times out the expired calls (they started in order and share one bound: they are at the head). */
  readonly #sweep = (): void => {
    const now = performance.now();
    while (this.#head && this.#head.at <= now) {
      const entry = this.#head;
      this.unwatch(entry);
      entry.reject(new BackendUnavailableError(this.#backend, `${entry.what} got no answer within ${this.ms} ms`));
    }
    if (!this.#head && this.#sweeper) {
      clearInterval(this.#sweeper);
      this.#sweeper = undefined;
    }
  };
}

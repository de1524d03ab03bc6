/**
 * Writes the backend finishes in the background. A write whose outcome is unknown (its answer timed
 * out) may have taken effect; writes that could leave a key held on a session lease nobody will
 * release (a release, a cancelled wait, a grant to a caller that gave up) are tried again until they
 * are known to be done (`followUp`, `untilDone`), and an acquire that failed that way is cleaned up
 * if its caller does not come back (`abandonLater`). Every timer here is unref'd, and `close()`
 * stops them all.
 */
import { mapError } from './rpc.js';

/**
 * How long a follow-up keeps trying; after that, the session ending frees the key.
 */
const FOLLOW_UP_LIMIT_MS = 120_000;
/** An acquire that failed with an unknown outcome is cleaned up if its caller has not asked again after this long (core asks within ~1 s). */
export const ABANDONED_AFTER_MS = 2_000;

export class FollowUps {
  readonly #timers = new Set<ReturnType<typeof setTimeout>>();
  readonly #cancels = new Map<ReturnType<typeof setTimeout>, () => void>();
  /** Owners whose last (non-queued, session) acquire failed with an unknown outcome; see `abandonLater`. */
  readonly #uncertain = new Map<string, { cleanup?: Promise<void> }>();
  #closed = false;

  /** Runs an idempotent write again in the background until it succeeds (see FOLLOW_UP_LIMIT_MS). */
  followUp(attempt: () => Promise<void>): void {
    void this.untilDone(attempt, 100);
  }

  /** Tries `attempt` (now, or after `firstDelayMs`) and again with backoff while it fails with a retryable error. Never rejects. */
  untilDone(attempt: () => Promise<void>, firstDelayMs = 0): Promise<void> {
    const started = performance.now();
    return new Promise<void>((resolve) => {
      const run = async (delay: number): Promise<void> => {
        if (this.#closed) return resolve();
        try {
          await attempt();
          resolve();
        } catch (error) {
          if (!mapError('follow-up', error).retryable || performance.now() - started > FOLLOW_UP_LIMIT_MS) return resolve();
          this.later(delay, () => void run(Math.min(Math.max(delay, 50) * 2, 2_000)), resolve);
        }
      };
      if (firstDelayMs > 0) this.later(firstDelayMs, () => void run(firstDelayMs), resolve);
      else void run(100);
    });
  }

  /**
   * An acquire call of `owner` failed after its transaction may have committed (a grant, or a place
   * in the queue). If the caller gave up (a tryAcquire does at once; a waiter whose first call
   * failed never gets to cancel), that entry would sit on the session's lease, owned by nobody, for
   * as long as the session lives, and block the key. Core asks again within about a second when it
   * still wants the key; if it has not after ABANDONED_AFTER_MS, `cleanUp` runs (it deletes the
   * request's keys). A call that comes back later waits for it (`resume`) and then starts over.
   */
  abandonLater(owner: string, cleanUp: () => Promise<void>): void {
    const mark: { cleanup?: Promise<void> } = {};
    this.#uncertain.set(owner, mark);
    this.later(ABANDONED_AFTER_MS, () => {
      if (this.#uncertain.get(owner) !== mark) return; // the caller came back
      mark.cleanup = cleanUp().finally(() => {
        if (this.#uncertain.get(owner) === mark) this.#uncertain.delete(owner);
      });
    });
  }

  /**
   * The caller is back after a failed call: whatever happens now decides, but first let a clean-up
   * of that call finish (it must not delete what this call finds granted). Undefined when there is
   * nothing to wait for: the caller then goes on in the same tick (a cancelWait that comes right
   * after the call started must find the request's name, see `acquire`).
   */
  resume(owner: string): Promise<void> | undefined {
    const uncertain = this.#uncertain.get(owner);
    if (!uncertain) return undefined;
    this.#uncertain.delete(owner);
    return uncertain.cleanup ?? Promise.resolve();
  }

  /** An unref'd timer that `close()` cancels (calling `onCancel`). */
  later(ms: number, fn: () => void, onCancel?: () => void): void {
    if (this.#closed) {
      onCancel?.();
      return;
    }
    const timer = setTimeout(() => {
      this.#timers.delete(timer);
      this.#cancels.delete(timer);
      fn();
    }, ms);
    timer.unref();
    this.#timers.add(timer);
    if (onCancel) this.#cancels.set(timer, onCancel);
  }

  /** Stops every timer; follow-ups still waiting resolve, and none starts afterwards. */
  close(): void {
    this.#closed = true;
    for (const timer of this.#timers) clearTimeout(timer);
    this.#timers.clear();
    for (const cancel of this.#cancels.values()) cancel();
    this.#cancels.clear();
  }
}

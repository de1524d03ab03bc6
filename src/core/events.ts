import type { LeaseholdError, LeaseLostError, LossReason } from './errors.js';
import type { LockMode } from './validate.js';

/**
 * Events of a `Locks` instance. Listeners run synchronously; an exception in a listener is caught
 * and reported as a process warning (it never breaks a renewal or reaches a timer).
 */
export interface LockEvents {
  /** A lease was granted. Does not fire for a `tryAcquire` that found the key busy. */
  acquired: { key: string; token: bigint; mode: LockMode; ttlMs: number; waitedMs: number };
  /**
   * A renewal succeeded (background or `lease.renew()`). Once per round trip: a session's keep-alive
   * renews all of its leases at once, and the event names the oldest of them, with `leases` the
   * number it renewed (1 for a lease renewed on its own).
   */
  renewed: { key: string; token: bigint; leases: number; ttlMs: number };
  /**
   * A renewal round trip failed with a transient error; the leases are still valid and it will be
   * retried. Once per round trip, named like `renewed`. Does not fire on loss.
   */
  renewFailed: { key: string; token: bigint; leases: number; error: LeaseholdError; remainingMs: number };
  /**
   * The lease was released by its holder. Does not fire for a lease that was already lost. After
   * `releaseFailed` it fires once more for that lease when the background retry of a session lease
   * gets through (`heldMs` counted to it).
   */
  released: { key: string; token: bigint; heldMs: number };
  /**
   * Releasing failed (`release()` rejected with `error`); once per release. A lease kept on its own
   * frees its key when its ttl runs out. A session lease's release is retried in the background:
   * `released` follows when a retry gets through; if none does within the ttl, the session is ended
   * (its other leases fire `lost`, reason `session-lost`) so the key is freed; a session that ends
   * first frees it with no further event.
   */
  releaseFailed: { key: string; token: bigint; error: LeaseholdError };
  /** The lease was lost; `lease.signal` was aborted with `error` at the same moment. Never fires after `released`. */
  lost: { key: string; token: bigint; reason: LossReason; error: LeaseLostError; heldMs: number };
  /**
   * `acquire` or `tryAcquire` gave up with `error`; `outcome` says why: `timeout` (waitMs ran out:
   * AcquireTimeoutError), `aborted` (the caller's signal, or `close()`), `error` (the coordinator
   * failed, or a bad argument it refused). Not fired when `tryAcquire` finds the key busy (`busy`).
   */
  acquireFailed: { key: string; waitedMs: number; outcome: AcquireFailure; error: unknown };
  /** `tryAcquire` found the key busy and returned null. */
  busy: { key: string; waitedMs: number };
}

/** Why an acquire gave up (see `acquireFailed`). */
export type AcquireFailure = 'timeout' | 'aborted' | 'error';

export type LockEventName = keyof LockEvents;
export type LockListener<E extends LockEventName> = (event: LockEvents[E]) => void;

export class TypedEmitter<Events extends object> {
  readonly #listeners = new Map<keyof Events, Set<(event: never) => void>>();

  on<E extends keyof Events>(name: E, listener: (event: Events[E]) => void): this {
    let set = this.#listeners.get(name);
    if (!set) this.#listeners.set(name, (set = new Set()));
    set.add(listener as (event: never) => void);
    return this;
  }

  off<E extends keyof Events>(name: E, listener: (event: Events[E]) => void): this {
    this.#listeners.get(name)?.delete(listener as (event: never) => void);
    return this;
  }

  once<E extends keyof Events>(name: E, listener: (event: Events[E]) => void): this {
    const wrapper = (event: Events[E]): void => {
      this.off(name, wrapper);
      listener(event);
    };
    return this.on(name, wrapper);
  }

  listenerCount(name: keyof Events): number {
    return this.#listeners.get(name)?.size ?? 0;
  }

  /** Calls every listener; never throws. */
  emit<E extends keyof Events>(name: E, event: Events[E]): void {
    const set = this.#listeners.get(name);
    if (!set) return;
    for (const listener of [...set]) {
      try {
        (listener as (event: Events[E]) => void)(event);
      } catch (error) {
        process.emitWarning(`leasehold: a "${String(name)}" listener threw: ${String(error)}`, { code: 'LEASEHOLD_LISTENER' });
      }
    }
  }
}

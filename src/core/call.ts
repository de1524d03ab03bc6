import type { Clock } from './clock.js';
import { BackendUnavailableError, LeaseholdError } from './errors.js';

/**
 * Bounding coordinator calls. Core gives every call it makes a deadline (`operationTimeoutMs`, and
 * while an acquire waits, what is left of its `waitMs`); what a late answer means is the caller's to
 * say (a grant nobody waits for is given back), so it is passed in.
 */

/** A coordinator call that got no answer in the time it was given (core's own deadline, not the backend's error). */
export class CallTimeoutError extends BackendUnavailableError {}

export interface CallBound<T> {
  readonly clock: Clock;
  readonly ms: number;
  /** The call, for the message: `acquire`, `renew`, `session open`… */
  readonly what: string;
  /** The backend's `name`, for the error. */
  readonly backend: string;
  /** A value that arrives after the deadline. */
  readonly onLate?: (value: T) => void;
  /** A failure that arrives after the deadline. */
  readonly onLateError?: (error: unknown) => void;
}

/** Rejects with CallTimeoutError when `promise` has not settled within `bound.ms`. */
export function withTimeout<T>(promise: Promise<T>, bound: CallBound<T>): Promise<T> {
  const { clock, ms } = bound;
  return new Promise<T>((resolve, reject) => {
    let timedOut = false;
    const timer = clock.setTimeout(() => {
      timedOut = true;
      reject(new CallTimeoutError(bound.backend, `${bound.what} got no answer within ${Math.round(ms)} ms`));
    }, ms);
    promise.then(
      (value) => {
        if (timedOut) bound.onLate?.(value);
        else {
          clock.clearTimeout(timer);
          resolve(value);
        }
      },
      (error: unknown) => {
        if (timedOut) bound.onLateError?.(error);
        else {
          clock.clearTimeout(timer);
          reject(error);
        }
      },
    );
  });
}

/** Backends reject with LeaseholdErrors; anything else (a bug, a driver surprise) is treated as transient unavailability of `backend`. */
export function toLeaseholdError(error: unknown, backend: string): LeaseholdError {
  if (error instanceof LeaseholdError) return error;
  return new BackendUnavailableError(backend, error instanceof Error ? error.message : String(error), { cause: error });
}

/**
 * Resolves once `p` settles or `ms` passed, whichever comes first; never rejects (a close that must
 * not hang on a frozen server). An undefined `p` resolves at once. The timer is a plain, ref'd Node
 * timer (as the adapters' copies had it): a close still pending keeps the process alive for at most `ms`.
 */
export function settleWithin(p: Promise<unknown> | undefined, ms: number): Promise<void> {
  if (p === undefined) return Promise.resolve();
  return new Promise<void>((resolve) => {
    const done = (): void => {
      clearTimeout(timer);
      resolve();
    };
    const timer = setTimeout(done, ms);
    p.then(done, done);
  });
}

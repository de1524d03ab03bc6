import { Acquisition, type AcquireContext } from './acquire.js';
import type { AcquireRequest, Backend, ReleaseRequest } from './backend.js';
import { systemClock, type Clock } from './clock.js';
import { InvalidArgumentError } from './errors.js';
import { TypedEmitter, type LockEvents } from './events.js';
import type { LeaseImpl } from './lease.js';
import { checkLabel, DEFAULTS, resolveAcquireOptions, type AcquireOptions } from './options.js';
import { checkKey } from './validate.js';

/**
 * One acquire made on someone else's behalf: the lock service (`leasehold serve`) runs core's own
 * waiting loop (`Acquisition`: FIFO places, wake-ups, the fallback poll, late grants given back, the
 * place cancelled when the wait ends) for an owner id it derives itself, and gets back the grant —
 * no `Lease`, no renewal timer, no session pool: its HTTP client renews, and keeps its session
 * alive, on its own.
 *
 * How, without a second copy of the loop: the Acquisition runs over a view of the backend that
 * puts the given `owner` (and `session`) into every request it makes — acquire, the release of a
 * late grant, cancelWait — in place of the random owner it draws for itself.
 */
export interface AcquireAsRequest {
  /** The coordinator (guarded: see `guardBackend`). */
  readonly backend: Backend;
  readonly key: string;
  /** The secret owner id every request is made with (I4). */
  readonly owner: string;
  /** The public label of the grant. */
  readonly holder: string;
  /**
   * `ttlMs`, `waitMs` (default 0: one attempt, no queue place), `mode`, `lockDelayMs`, `limit`, `fair`
   * and `signal` (aborting it ends the wait and cancels the place), as for `Locks.acquire`.
   */
  readonly options?: Omit<AcquireOptions, 'autoRenew' | 'minHoldMs' | 'label'>;
  /**
   * A session id the caller keeps alive itself: sent with every request (the lease then lives by the
   * session). A coordinator answer that the session is gone ends the call with `{ sessionLost: true }`.
   */
  readonly session?: string;
  /** Longest single coordinator call. @default 5000 */
  readonly operationTimeoutMs?: number;
  /** Ends the wait at once (the caller is shutting down), like `Locks.close()`. */
  readonly closing?: AbortSignal;
  /** Receives `acquired` and `acquireFailed`, as a `Locks` instance's events do. */
  readonly events?: TypedEmitter<LockEvents>;
  /** @default systemClock */
  readonly clock?: Clock;
}

export type AcquireAsResult =
  | {
      readonly granted: true;
      readonly token: bigint;
      /** The ttl the coordinator applied. */
      readonly ttlMs: number;
    }
  | { readonly granted: false; readonly sessionLost: true };

/** The coordinator said the session named by the request is gone: ends the Acquisition at once (not retryable). */
class SessionGone extends InvalidArgumentError {
  constructor() {
    super('session', 'the session is gone (expired, closed or unknown)');
  }
}

/**
 * Waits up to `options.waitMs` for the key on behalf of `owner`. Resolves with the grant, or with
 * `sessionLost` when the coordinator no longer knows `session`; rejects as `Locks.acquire` does
 * (`AcquireTimeoutError` with the holder's label when the key stayed busy, the signal's reason,
 * `BackendUnavailableError`, `InvalidArgumentError` naming the option as `options.<name>`). Leaves no
 * queue place behind when it does not end with the grant.
 */
export async function acquireAs(request: AcquireAsRequest): Promise<AcquireAsResult> {
  const key = checkKey(request.key);
  if (typeof request.owner !== 'string' || request.owner.length === 0) throw new InvalidArgumentError('owner', 'expected a non-empty string');
  const holder = checkLabel(request.holder, 'holder');
  // Every option the library knows keeps its own check and default; the wait defaults to one attempt.
  const options = resolveAcquireOptions(request.options, { ...DEFAULTS, waitMs: 0 }, 'options');
  const clock = request.clock ?? systemClock;
  const { backend, owner, session } = request;
  const closing = request.closing ?? new AbortController().signal;
  const asked = (req: AcquireRequest): AcquireRequest => ({ ...req, owner, ...(session !== undefined && { session }) });
  const view: Backend = {
    ...backend,
    acquire: async (req) => {
      const answer = await backend.acquire(asked(req));
      if (!answer.granted && answer.sessionLost && session !== undefined) throw new SessionGone();
      return answer;
    },
    release: (req: ReleaseRequest) => backend.release({ ...req, owner }),
    ...(backend.cancelWait && { cancelWait: (req: { key: string; owner: string }) => backend.cancelWait!({ ...req, owner }) }),
  };
  let granted: { token: bigint; ttlMs: number } | undefined;
  const events = request.events ?? new TypedEmitter<LockEvents>();
  const ctx: AcquireContext = {
    backend: view,
    clock,
    events,
    holder,
    operationTimeoutMs: request.operationTimeoutMs ?? DEFAULTS.operationTimeoutMs,
    random: Math.random,
    closing,
    sessions: undefined,
    grant: (g) => {
      granted = { token: g.token, ttlMs: g.ttlMs };
      events.emit('acquired', { key, token: g.token, mode: options.mode, ttlMs: g.ttlMs, waitedMs: clock.now() - g.start });
      // Acquisition reads only `token` and `held` of what it keeps (a kept grant is never given back
      // nor has its place cancelled): the grant is the caller's from here on, renewed by it.
      return { token: g.token, held: true } as unknown as LeaseImpl;
    },
  };
  try {
    await new Acquisition(ctx, key, { ...options, label: holder }, true).run();
  } catch (error) {
    if (error instanceof SessionGone) return { granted: false, sessionLost: true };
    throw error;
  }
  if (!granted) throw new Error('leasehold: Acquisition ended without a grant'); // unreachable: run() with wait=true grants or throws
  return { granted: true, ...granted };
}

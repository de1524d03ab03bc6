import { Acquisition, type AcquireContext } from './acquire.js';
import type { AcquireRequest, Backend, ReleaseRequest } from './backend.js';
import { systemClock, type Clock } from './clock.js';
import { AcquireTimeoutError, InvalidArgumentError } from './errors.js';
import { TypedEmitter, type LockEvents } from './events.js';
import type { LeaseImpl } from './lease.js';
import { checkLabel, DEFAULTS, resolveAcquireOptions, WAITING, type AcquireOptions } from './options.js';
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
  /**
   * A wait that runs out (`AcquireTimeoutError`, neither `signal` nor `closing` aborted) leaves the
   * owner's queue place at the coordinator instead of cancelling it: the place expires by itself
   * after the queue ttl (`WAITING.queueTtlMs`) unless the same owner asks again, which keeps it. For
   * a caller that waits in several calls (the lock service's long polls, each ending in a 409 the
   * client follows with the next poll): without it every call ends by giving its place up, and the
   * next one queues at the back, behind waiters that came later. Only for coordinators whose places
   * expire by that ttl and are granted to no one who does not ask (`capabilities.keepablePlaces`):
   * one that hands the key to a queued waiter by itself would make a grant nobody waits for. A grant answered after the wait
   * ended is kept for the next call too, shortened to the queue ttl (see `placeKeeping`). @default false
   */
  readonly keepPlaceOnTimeout?: boolean;
  /**
   * Ends the wait because a later call of the same owner takes it over (the lock service: a retry
   * with the same Idempotency-Key while this request still waits). Unlike `signal`, the owner's
   * queue place (and a grant answered late) is left as for a wait that ran out with
   * `keepPlaceOnTimeout`, for the later call to keep. The call rejects with the signal's reason.
   */
  readonly handOver?: AbortSignal;
  /**
   * Every coordinator call this wait makes (asks, give-backs of late grants, the place's cancel) is
   * added here until it settles, including those made after `acquireAs` has returned (an answer
   * that came late). A later call of the same owner that must not overlap them waits for the set
   * to empty (`settledCalls`).
   */
  readonly calls?: Set<Promise<unknown>>;
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
 * queue place behind when it does not end with the grant, except the place of a wait that ran out
 * with `keepPlaceOnTimeout`.
 */
export async function acquireAs(request: AcquireAsRequest): Promise<AcquireAsResult> {
  const key = checkKey(request.key);
  if (typeof request.owner !== 'string' || request.owner.length === 0) throw new InvalidArgumentError('owner', 'expected a non-empty string');
  const holder = checkLabel(request.holder, 'holder');
  // Every option the library knows keeps its own check and default; the wait defaults to one attempt.
  const options = resolveAcquireOptions(request.options, { ...DEFAULTS, waitMs: 0 }, 'options');
  const callerSignal = options.signal;
  const { handOver } = request;
  if (handOver) options.signal = callerSignal ? AbortSignal.any([callerSignal, handOver]) : handOver;
  const clock = request.clock ?? systemClock;
  const { backend, owner, session } = request;
  const closing = request.closing ?? new AbortController().signal;
  const asked = (req: AcquireRequest): AcquireRequest => ({ ...req, owner, ...(session !== undefined && { session }) });
  const tracked = <T>(call: Promise<T>): Promise<T> => {
    const calls = request.calls;
    if (!calls) return call;
    calls.add(call);
    const done = (): void => {
      calls.delete(call);
    };
    call.then(done, done);
    return call;
  };
  const places = placeKeeping(request, owner, holder, options);
  const cancelWait = backend.cancelWait;
  // Called through, never copied: a backend may be a class instance whose methods live on its prototype.
  const subscribe = backend.subscribe;
  const view: Backend = {
    name: backend.name,
    capabilities: backend.capabilities,
    renew: (req) => backend.renew(req),
    inspect: (prefix) => backend.inspect(prefix),
    close: () => backend.close(),
    ...(subscribe && {
      subscribe: (key: string, onChange: Parameters<typeof subscribe>[1], cursor?: unknown) => subscribe.call(backend, key, onChange, cursor),
    }),
    acquire: async (req) => {
      const answer = await tracked(backend.acquire(asked(req)));
      if (!answer.granted && answer.sessionLost && session !== undefined) throw new SessionGone();
      return answer;
    },
    // Called for late grants (and for a grant made as the server closes): see placeKeeping.
    release: (req: ReleaseRequest) => tracked(closing.aborted ? backend.release({ ...req, owner }) : places.giveBack(req)),
    ...(cancelWait && {
      cancelWait: (req: { key: string; owner: string }) => tracked(places.cancel(() => cancelWait.call(backend, { ...req, owner }))),
    }),
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
    ...(session !== undefined && { boundSession: session }),
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
    places.decide(false); // a grant: the Acquisition cancels nothing of a kept grant anyway
  } catch (error) {
    // Only a wait that ran out, or one handed over to the owner's next call, keeps its place: a caller
    // who went away or a closing server gives it up.
    const handedOver = handOver?.aborted === true && callerSignal?.aborted !== true;
    places.decide(((error instanceof AcquireTimeoutError && options.signal?.aborted !== true) || handedOver) && !closing.aborted);
    if (error instanceof SessionGone) return { granted: false, sessionLost: true };
    throw error;
  }
  if (!granted) throw new Error('leasehold: Acquisition ended without a grant'); // unreachable: run() with wait=true grants or throws
  return { granted: true, ...granted };
}

/**
 * What a wait leaves at the coordinator as it ends (`keepPlaceOnTimeout`). The Acquisition gives its
 * place up, and gives back grants whose answers came after their call's time, as it settles — before
 * `acquireAs` has seen how the wait ended: those calls wait for `decide`.
 *
 * A wait that ran out keeps its place; and a grant answered late to it (the key came free as its last
 * ask was being cut by the end of the wait: on a coordinator a round trip away, that last ask is
 * often answered after the wait's end) is the place come true: it is kept for the owner's next call,
 * which gets it back (its ttl counted from then, as for any retry), and shortened to the queue ttl
 * meanwhile, so an owner that never asks again holds the key no longer than its place would have
 * blocked it. Not a grant on a session (its ttl is the session's, it cannot be shortened) nor one
 * with a lock-delay (its expiry would start one): those are given back, and the owner's turn with them.
 */
function placeKeeping(
  request: AcquireAsRequest,
  owner: string,
  holder: string,
  options: { mode: ReleaseRequest['mode']; lockDelayMs: number; limit: number | undefined },
): { decide(keep: boolean): void; cancel(cancelWait: () => Promise<void>): Promise<void>; giveBack(req: ReleaseRequest): Promise<void> } {
  const { backend } = request;
  let decide: (keep: boolean) => void = () => {};
  const kept = new Promise<boolean>((resolve) => {
    decide = resolve;
  });
  const release = (req: ReleaseRequest): Promise<void> => backend.release({ ...req, owner });
  if (!request.keepPlaceOnTimeout) return { decide, cancel: (cancelWait) => cancelWait(), giveBack: release };
  const keepsGrants = request.session === undefined && options.lockDelayMs === 0;
  const holdForNextCall = async (req: ReleaseRequest): Promise<void> => {
    const renewal = {
      key: req.key,
      owner,
      token: req.token,
      mode: req.mode,
      ttlMs: Math.max(WAITING.queueTtlMs, backend.capabilities.minTtlMs),
      lockDelayMs: 0,
      holder,
      ...(options.limit !== undefined && { limit: options.limit }),
    };
    // Not renewed: the grant is gone already. A renewal that failed: give it back rather than leave it its full ttl.
    await backend.renew(renewal).catch(() => release(req));
  };
  return {
    decide,
    cancel: async (cancelWait) => {
      if (!(await kept)) await cancelWait();
    },
    giveBack: async (req) => {
      if (keepsGrants && (await kept)) await holdForNextCall(req);
      else await release(req);
    },
  };
}

/**
 * Resolves once `calls` (an `AcquireAsRequest.calls` set) is empty: every coordinator call of those
 * waits has settled, including give-backs started by answers that came late. Gives up after
 * `timeoutMs` of real time (a call the coordinator never answers); resolves either way.
 */
export async function settledCalls(calls: Set<Promise<unknown>>, timeoutMs: number): Promise<void> {
  const end = performance.now() + timeoutMs;
  while (calls.size > 0 && performance.now() < end) {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const left = new Promise<void>((resolve) => {
      timer = setTimeout(resolve, Math.max(1, end - performance.now()));
      timer.unref?.();
    });
    await Promise.race([Promise.allSettled([...calls]), left]);
    clearTimeout(timer);
    // A settled answer may start a give-back in its own continuation: look again after this turn.
    await new Promise<void>((resolve) => setImmediate(resolve));
  }
}

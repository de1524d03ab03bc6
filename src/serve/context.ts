import type { KeyObject } from 'node:crypto';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { Backend } from '../core/backend.js';
import { withTimeout } from '../core/call.js';
import type { Clock } from '../core/clock.js';
import type { LockEvents, TypedEmitter } from '../core/events.js';
import type { Locks } from '../core/locks.js';
import type { AuthConfig, Caller } from './auth.js';

/**
 * What the routes of one lock server share: the backend, a `Locks` client over the same backend
 * (listings, watches; the dashboard and metrics use it), the callers, and the signal that ends
 * every long poll when the server closes. Nothing in it outlives a restart, and nothing needs to.
 */
export interface ServeContext {
  /** The coordinator, guarded (closed state, inspect's order). */
  readonly backend: Backend;
  /** A client over the same backend: `inspect`, `watch`. Its own leases: none. */
  readonly locks: Locks;
  /** The `--auth` callers; undefined: every request is `anonymous`. */
  readonly auth: AuthConfig | undefined;
  readonly clock: Clock;
  /** Wall clock (ms since the epoch), for min-hold deadlines carried in lease handles. */
  readonly wallNow: () => number;
  /** Longest single backend call. */
  readonly operationTimeoutMs: number;
  /** Events of the acquires made over HTTP (`acquired`, `acquireFailed`), as a Locks instance's. */
  readonly events: TypedEmitter<LockEvents>;
  /** Aborted when the server starts closing: long polls end (503 CLOSED) instead of holding close() up. */
  readonly closing: AbortSignal;
  /** Acquire requests in flight (long polls among them): close() lets them answer before connections are cut. */
  readonly acquiring: Set<Promise<unknown>>;
  /**
   * The acquire of each owner (requests with an Idempotency-Key) on each key running in this server,
   * by `<key>\n<owner>`: a later request of the same owner on the same key hands the earlier one's
   * wait over to itself and starts once the earlier one and its backend calls are done (see
   * routes/locks.ts).
   */
  readonly ownerWaits: Map<string, OwnerWait>;
  /**
   * The `--sequencer-key` keys: the first signs the sequencers the server issues (`lh1s.`), any of
   * them verifies the ones sent to the check route. Undefined: sequencers are unsigned (`lh1.`).
   */
  readonly sequencerKey: readonly KeyObject[] | undefined;
}

/** One owner's acquire in flight (ServeContext.ownerWaits). */
export interface OwnerWait {
  /** Ends its wait for the owner's next request (409 SUPERSEDED to it), its queue place kept where places are. */
  handOver(): void;
  /** Resolves when its request has been answered and every backend call it made has settled. */
  readonly done: Promise<void>;
}

/** A route module: registers its routes on the app (see app.ts for the order). */
export type RouteModule = (app: FastifyInstance, ctx: ServeContext) => void;

/** Bounds one backend call by the server's operation timeout (a late answer is dropped, or handled by `onLate`). */
export function bounded<T>(ctx: ServeContext, what: string, call: Promise<T>, onLate?: (value: T) => void): Promise<T> {
  return withTimeout(call, { clock: ctx.clock, ms: ctx.operationTimeoutMs, what, backend: ctx.backend.name, ...(onLate && { onLate }) });
}

const callers = new WeakMap<FastifyRequest, Caller>();

/** Set by the auth hook (app.ts) before any route runs. */
export function setCaller(request: FastifyRequest, caller: Caller): void {
  callers.set(request, caller);
}

/** The authenticated caller of a request (the auth hook has run for every routed request). */
export function callerOf(request: FastifyRequest): Caller {
  const caller = callers.get(request);
  if (!caller) throw new Error('leasehold serve: a route ran before the auth hook');
  return caller;
}

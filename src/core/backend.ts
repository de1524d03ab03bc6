import type { LockMode } from './validate.js';

/**
 * The coordinator, seen from core. A backend grants and revokes leases on keys and keeps the
 * per-key token counter; everything else (waiting with backoff, renewal timers, local validity,
 * loss detection, events) lives once in core (`Locks`, `Lease`).
 *
 * Contract every implementation keeps (the conformance suite in test/conformance checks it):
 * - A grant increments the key's token counter in the same atomic step and returns the new value;
 *   the counter never goes back (I1) and two grants never share a value (I2). Shared grants get
 *   tokens too.
 * - Expiry is judged by the coordinator's own clock (I7), counted from when the request arrived,
 *   so the server-side expiry is never earlier than (client send time + ttlMs).
 * - `renew` and `release` act only when `owner` holds the key (I4); release is idempotent.
 * - A holder that expires without being released makes the key ungrantable for its `lockDelayMs` (I8).
 * - Methods reject only with `LeaseholdError`s: `BackendUnavailableError` for I/O failures,
 *   `InvalidArgumentError` for input the backend cannot store.
 */
export interface Backend {
  /** Short name for messages and metrics, e.g. `sqlite`, `redis`. */
  readonly name: string;
  readonly capabilities: BackendCapabilities;

  acquire(request: AcquireRequest): Promise<AcquireResult>;
  renew(request: RenewRequest): Promise<RenewResult>;
  release(request: ReleaseRequest): Promise<void>;
  /** Current holders and waiters of keys starting with `prefix` (all keys when empty). */
  inspect(prefix: string): Promise<KeyState[]>;
  /** Closes what the backend opened itself; never a client the user passed in. Idempotent. */
  close(): Promise<void>;

  /**
   * Optional wake-up hook: calls `onChange` when the key may have become free (released, expired,
   * a waiter ahead left). Resolves once the subscription is active, with a function that ends it.
   *
   * No lost wake-ups: when the busy answer carried a `cursor`, the backend fires `onChange` at once
   * if the key changed after that answer; without a cursor, core re-checks right after
   * subscribing. Core still re-checks at a bounded interval in case a notification is lost.
   *
   * Hand-off: a fair backend with sessions may grant the key itself to a queued waiter that asked
   * with a session (when the holder ahead releases) and pass that grant to `onChange`. The grant is
   * bound to that session, as if the waiter's own acquire had returned it. Core takes it only if it
   * names the session of the waiter's latest request and its token is above every token this wait
   * has seen; otherwise it asks again, and the backend answers an owner that already holds the key
   * with that grant (bound to the session it asks with then).
   */
  subscribe?(key: string, onChange: (handOff?: HandOff) => void, cursor?: unknown): Promise<() => void>;

  /**
   * Removes `owner` from the key's wait queue (fair backends), and gives back a hand-off granted to
   * it that core did not take; idempotent, best effort.
   */
  cancelWait?(request: { key: string; owner: string }): Promise<void>;

  /**
   * Optional sessions: one renewal per client keeps all of its leases alive. A lease acquired with
   * `session` lives as long as the session does (its own ttl is the session's); releasing it
   * removes only that lease; the session ending frees all of them.
   */
  sessions?: SessionSupport;

  /** Optional: change notifications of one key (see {@link WatchKey}); observers poll without it. */
  watch?: WatchKey;
}

/** A grant the backend made on its own to a queued, session-bound waiter (see `Backend.subscribe`). */
export interface HandOff {
  readonly token: bigint;
  /** The session the grant is bound to. */
  readonly session: string;
}

export interface BackendCapabilities {
  /** Waiters are granted in arrival order when `queue` is set (FIFO, no barging). */
  readonly fair: boolean;
  /** Smallest ttl the server supports; shorter requests are rounded up and reported in the grant. */
  readonly minTtlMs: number;
  /**
   * The coordinator waits for a busy key itself, up to this long per acquire call (a long poll:
   * the HTTP lock service, woken by its own backend's notifications). Core then puts what is left
   * of the caller's wait (at most this) in each waiting request's `waitMs`, gives the call that much
   * longer before it counts as unavailable, and asks again as soon as a busy answer comes, with no
   * pause or polling of its own between asks. Undefined: every acquire answers at once.
   */
  readonly maxWaitMs?: number;
  /**
   * Which queue places wait for their owner: a place is granted only to an owner that asks for it
   * again, and expires after `queueTtlMs` otherwise, so a wait that ends may leave it for the same
   * owner's next call (the lock service keeps a long poll's place this way: see `acquireAs`'s
   * `keepPlaceOnTimeout`). `'without-session'`: only places asked for without a session (with one,
   * the backend hands the key to the place itself, and that grant would live by a session whose
   * client may have gone). Undefined: none (etcd: a place becomes the lock by its position).
   */
  readonly keepablePlaces?: 'all' | 'without-session';
}

export interface AcquireRequest {
  readonly key: string;
  /** Secret owner id, unique per lease; never leaves the client except to the coordinator. */
  readonly owner: string;
  readonly mode: LockMode;
  readonly ttlMs: number;
  readonly lockDelayMs: number;
  /** Public label of the requester (host:pid or user-given) shown to others in diagnostics. */
  readonly holder: string;
  /**
   * The caller will wait if the key is busy: a fair backend enqueues `owner` (or refreshes its
   * place) and grants only when everyone ahead has been served. The place expires after
   * `queueTtlMs` unless the caller asks again; core asks again well within it (every third of it).
   * A backend may leave a place with at least half of `queueTtlMs` left as it is when its owner
   * asks again (no write: SQLite, PostgreSQL and MySQL do, to spare a commit per ask), so a place
   * lives at least `queueTtlMs / 2` after each ask.
   */
  readonly queue: boolean;
  readonly queueTtlMs: number;
  /** Session id from `sessions.open`, for leases kept alive by the session rather than on their own. */
  readonly session?: string;
  /**
   * How long the coordinator may keep this request waiting for a busy key before it answers busy
   * (only for backends declaring `capabilities.maxWaitMs`, and at most that; an integer). Absent:
   * answer at once.
   */
  readonly waitMs?: number;
  /**
   * Sent with `waitMs`: aborted when the caller stops waiting (its signal, `Locks.close()`), so a
   * long poll ends at once (and leaves the queue) instead of holding on until `waitMs`. The backend
   * then rejects; core gives up with the signal's reason and calls `cancelWait`.
   */
  readonly signal?: AbortSignal;
  /**
   * A semaphore permit (mode is then 'shared'): the key admits at most `limit` holders at once,
   * each with its own token, granted in the same atomic step as today's grants (FIFO where the
   * backend queues: a permit is granted only if no exclusive waiter is ahead and it is among the
   * first `limit − holders` permit waiters). The key records the limit while it has permit
   * holders: a permit request naming another limit, a permit request on a key held by plain shared
   * holders, or a plain shared request on a semaphore key is refused with
   * `InvalidArgumentError('limit', …)` naming both, and nothing is written. An exclusive request on
   * a semaphore key waits for every permit, as it waits for shared holders. Undefined: a plain lock.
   */
  readonly limit?: number;
}

/**
 * Optional change notifications for one key, for observers (an election's `observe`, the
 * dashboard): `onChange` is called (possibly more than once, possibly spuriously) after any grant,
 * release or expiry of `key` this backend can learn of. Resolves once active, with a function that
 * ends the subscription. Unlike `subscribe`, it needs no cursor and no queue place.
 */
export type WatchKey = (key: string, onChange: () => void) => Promise<() => void>;

export type AcquireResult =
  | {
      readonly granted: true;
      readonly token: bigint;
      /** The ttl the coordinator applied (may be rounded up to its minimum). */
      readonly ttlMs: number;
      /**
       * The grant's sequencer as the coordinator issued it (a lock service started with
       * `--sequencer-key` signs its sequencers, `lh1s.`); core formats one when absent. Used only if
       * it names this grant's key, mode and token: a backend cannot attach another grant's.
       */
      readonly sequencer?: string;
    }
  | {
      readonly granted: false;
      /** Public label of a current holder, when known. */
      readonly holder?: string;
      /** When the key could become free by expiry or end of lock-delay, if nothing else happens. */
      readonly retryInMs?: number;
      /** The request named a session that no longer exists; core ends it and opens a new one. */
      readonly sessionLost?: boolean;
      /** Opaque position in the key's change stream, for `subscribe` (see there). */
      readonly cursor?: unknown;
    };

export interface RenewRequest {
  readonly key: string;
  readonly owner: string;
  readonly token: bigint;
  readonly mode: LockMode;
  readonly ttlMs: number;
  /**
   * The grant's lock-delay and label, as in its AcquireRequest (core always sends them), for a
   * backend that may have to record the holder again where a server lost it (Redlock).
   */
  readonly lockDelayMs?: number;
  readonly holder?: string;
  /** The grant's semaphore limit, if it is a permit (core always sends it), for the same reason. */
  readonly limit?: number;
}

export type RenewResult = { readonly renewed: true; readonly ttlMs: number } | { readonly renewed: false };

export interface ReleaseRequest {
  readonly key: string;
  readonly owner: string;
  readonly token: bigint;
  readonly mode: LockMode;
}

export interface SessionSupport {
  /** Opens a session; it lives `ttlMs` from the request unless kept alive. */
  open(ttlMs: number): Promise<{ id: string; ttlMs: number }>;
  /** Extends the session by `ttlMs` from the request; `false` when it is already gone. */
  keepAlive(id: string, ttlMs: number): Promise<boolean>;
  /** Ends the session and frees every lease attached to it; idempotent. */
  close(id: string): Promise<void>;
}

export interface HolderState {
  readonly mode: LockMode;
  readonly token: bigint;
  /** Public label of the holder. */
  readonly holder: string;
  /** Milliseconds until the coordinator considers it expired, by the coordinator's clock. */
  readonly expiresInMs: number;
}

export interface KeyState {
  readonly key: string;
  /** Highest token ever issued for the key. */
  readonly lastToken: bigint;
  readonly holders: readonly HolderState[];
  readonly waiters: number;
  /** Remaining lock-delay after an expiry without release, 0 if none. */
  readonly lockDelayRemainingMs: number;
  /** The semaphore's limit while the key has permit holders (see `AcquireRequest.limit`); undefined otherwise. */
  readonly limit?: number;
}

import type { Backend, SessionSupport } from './backend.js';
import type { TimerHandle } from './clock.js';
import { withTimeout } from './call.js';
import { BackendUnavailableError } from './errors.js';
import { type FailedRelease, Keeper, type LeaseContext } from './lease.js';

/** An unused session is closed after max(ttl, this): long enough for back-to-back acquires to share it. */
const SESSION_IDLE_MS = 5_000;

/**
 * The first retry of a failed release comes this soon after the failure: most are a blip (a killed
 * connection, a failover) that the next call on a fresh connection gets past.
 */
const RELEASE_RETRY_FIRST_MS = 50;

/**
 * Retries then back off, doubling, to at most this (and at most a third of the ttl, the keep-alive
 * period; each keep-alive retries as well). No jitter: a client has one retry per failed release,
 * spread by when each failed, not a crowd of clients asking at one instant.
 */
const RELEASE_RETRY_CAP_MS = 1_000;

/** One failed release being retried. */
interface Retrying {
  readonly release: FailedRelease;
  /** When the session is ended if the release has not got through (clock time): `since` + the session's ttl. */
  readonly deadline: number;
  failures: number;
  lastError: unknown;
  /** The next try, or, while one is on the wire, the deadline. */
  timer: TimerHandle | undefined;
  /** A try on the wire (never rejects). */
  inFlight: Promise<void> | undefined;
}

/**
 * The releases of a session's leases that the coordinator did not take, retried until they get
 * through or the session ends. They cannot be forgotten as a lease's own release can: the holder
 * is bound to the session, and the session's keep-alive would renew it for as long as the client
 * runs. Each is retried with a bounded backoff and with every keep-alive, and watched against its
 * deadline; past it, `overdue` ends the session.
 */
class PendingReleases {
  readonly #pending = new Map<FailedRelease, Retrying>();
  #ended = false;

  constructor(
    private readonly ctx: LeaseContext,
    private readonly keeper: Keeper,
    private readonly overdue: (release: FailedRelease, lastError: unknown) => void,
  ) {}

  get size(): number {
    return this.#pending.size;
  }

  add(release: FailedRelease, error: unknown): void {
    if (this.#ended) return;
    const r: Retrying = { release, deadline: release.since + this.keeper.ttlMs, failures: 1, lastError: error, timer: undefined, inFlight: undefined };
    this.#pending.set(release, r);
    this.#schedule(r);
  }

  /** With a keep-alive: tries each pending release not on the wire already. */
  retryAll(): void {
    for (const r of this.#pending.values()) if (!r.inFlight) this.#try(r);
  }

  /** The first pending release past its deadline, if any. */
  firstOverdue(): Retrying | undefined {
    const now = this.ctx.clock.now();
    for (const r of this.#pending.values()) if (now >= r.deadline) return r;
    return undefined;
  }

  /** For `close()`: no more retries; one more try of each (joining one on the wire), awaited. */
  async flush(): Promise<void> {
    const pending = [...this.#pending.values()];
    this.end();
    await Promise.allSettled(pending.map((r) => r.inFlight ?? r.release.retry()));
  }

  /** The session ended (lost, closed, ended by us): its leases are freed with it, so nothing is retried after this. */
  end(): void {
    this.#ended = true;
    for (const r of this.#pending.values()) if (r.timer) this.ctx.clock.clearTimeout(r.timer);
    this.#pending.clear();
  }

  #schedule(r: Retrying): void {
    const clock = this.ctx.clock;
    const backoff = Math.min(RELEASE_RETRY_CAP_MS, this.keeper.ttlMs / 3, RELEASE_RETRY_FIRST_MS * 2 ** Math.min(r.failures - 1, 30));
    this.#arm(r, Math.max(0, Math.min(backoff, r.deadline - clock.now())));
  }

  #arm(r: Retrying, ms: number): void {
    const clock = this.ctx.clock;
    if (r.timer) clock.clearTimeout(r.timer);
    r.timer = clock.setTimeout(() => {
      r.timer = undefined;
      this.#due(r);
    }, ms);
  }

  #due(r: Retrying): void {
    if (this.#ended || this.#pending.get(r.release) !== r) return;
    if (this.ctx.clock.now() >= r.deadline) this.overdue(r.release, r.lastError);
    else if (r.inFlight) this.#arm(r, r.deadline - this.ctx.clock.now());
    else this.#try(r);
  }

  #try(r: Retrying): void {
    // While it is on the wire (up to operationTimeoutMs: a release waiting on a row lock), the deadline is still watched.
    this.#arm(r, Math.max(0, r.deadline - this.ctx.clock.now()));
    r.inFlight = r.release.retry().then(
      () => {
        if (r.timer) this.ctx.clock.clearTimeout(r.timer);
        r.timer = undefined;
        if (this.#pending.get(r.release) === r) this.#pending.delete(r.release);
      },
      (error: unknown) => {
        r.failures++;
        r.lastError = error;
        if (!this.#ended && this.#pending.get(r.release) === r) this.#schedule(r);
      },
    );
    const inFlight = r.inFlight;
    void inFlight.finally(() => {
      if (r.inFlight === inFlight) r.inFlight = undefined;
    });
  }
}

/** One open session: one keep-alive renews every lease acquired with it (etcd's `Session`). */
export class Session {
  /** Acquires that asked (or may be handed a grant) with this session and have not settled. */
  pending = 0;
  /** When the session last became empty (clock time); undefined while it holds leases. */
  idleSince: number | undefined;
  idleTimer: TimerHandle | undefined;
  constructor(
    readonly id: string,
    readonly ttlMs: number,
    readonly keeper: Keeper,
    /** The pool's entry that resolved to this session. */
    readonly entry: Promise<Session>,
    /** Releases of its leases that failed, retried until they get through or the session ends. */
    readonly releases: PendingReleases,
  ) {}

  /** Alive: not lost, not stopped, local validity left. A grant handed to it may be taken. */
  get usable(): boolean {
    return !this.keeper.lost && !this.keeper.stopped && this.keeper.remainingMs() > 0;
  }
}

/**
 * A client's sessions, one per ttl, opened on first use and shared by every auto-renewed lease of
 * that ttl: renewal cost grows with clients, not with locks. A session with no lease and no acquire
 * holding it is kept idle for a while (the next acquire reuses it), then closed. A lost session is
 * dropped at once, so no acquire picks it up after that.
 *
 * Failed releases. A lease's holder is bound to its session, so a release that fails (a killed
 * connection, a timeout) would leave the key renewed by every keep-alive for as long as the client
 * runs, where a lease kept on its own would expire within its ttl. So the session keeps it as a
 * pending release and retries it: 50 ms after the failure, then backing off (doubling) to at most
 * 1 s or a third of the ttl, and with every keep-alive, until the coordinator takes it (the key is
 * freed, or was no longer this owner's: release is idempotent) — the lease then emits `released` —
 * or the session ends (lost, idle-closed, `Locks.close()`), which frees its leases anyway.
 * `Locks.close()` tries each pending release once more before it closes the sessions.
 *
 * If a release has not got through a ttl after it was asked for (when the key would have expired
 * without the session), the session is ended: its other leases are signalled lost at once
 * (`session-lost`, the cause naming the release; their owners acquire again, on a new session),
 * its keep-alives stop, and it is closed on the coordinator, which frees the key. Ending one
 * session costs its other leases a re-acquire; keeping it would keep a key its holder gave up held
 * with no end, which is worse: waiters would starve while this client runs. So the key is free a
 * ttl after the failed release plus one close round trip; if the coordinator refuses the close too,
 * the session expires by the coordinator's clock at most a ttl after its last keep-alive, so within
 * 2 × ttl of the release. (A release only counts as failed once its call has failed or timed out, at
 * most `operationTimeoutMs` after it was sent: one that hangs longer than the ttl ends the session
 * as soon as it fails, without a retry.)
 */
export class SessionPool {
  readonly #sessions: SessionSupport;
  readonly #ctx: LeaseContext;
  readonly #opening = new Map<number, Promise<Session>>();
  /** The same sessions once open, so an acquire on the hot path does not await a settled promise. */
  readonly #open = new Map<number, Session>();
  /** Closes of ended sessions still on the wire: `closeAll` waits for them before the backend closes. */
  readonly #closing = new Set<Promise<void>>();

  constructor(init: { backend: Backend & { sessions: SessionSupport }; ctx: LeaseContext }) {
    this.#sessions = init.backend.sessions;
    this.#ctx = init.ctx;
  }

  /** The open session of this ttl, if there is one (no await on the hot path). */
  current(ttlMs: number): Session | undefined {
    return this.#open.get(ttlMs);
  }

  /** The session for this ttl, opened on first use (one opening shared by concurrent callers). */
  get(ttlMs: number): Promise<Session> {
    const existing = this.#opening.get(ttlMs);
    if (existing) return existing;
    const sessions = this.#sessions;
    const { clock, operationTimeoutMs } = this.#ctx;
    // `let`, assigned below: read inside the async body, after its first await
    let opening!: Promise<Session>;
    opening = (async () => {
      const sentAt = clock.now();
      const { id, ttlMs: effective } = await withTimeout(sessions.open(ttlMs), {
        clock,
        ms: operationTimeoutMs,
        what: 'session open',
        backend: this.#ctx.backendName(),
        onLate: ({ id }) => void sessions.close(id).catch(() => {}),
      });
      let session!: Session;
      const keeper = new Keeper({
        ctx: this.#ctx,
        renewOnce: async (ttl) => {
          const overdue = session.releases.firstOverdue();
          if (overdue) {
            // Not kept alive past a release's deadline (its timer may not have run yet: a busy loop).
            this.#end(session, overdue.release, overdue.lastError);
            return { renewed: false };
          }
          // With the keep-alive, not before it: a release that hangs must not hold the keep-alive back.
          session.releases.retryAll();
          return (await sessions.keepAlive(id, ttl)) ? { renewed: true, ttlMs: ttl } : { renewed: false };
        },
        sentAt,
        ttlMs: effective,
        autoRenew: true,
        onIdle: (k) => {
          if (k.lost) this.#forget(session);
          else this.#armIdle(session);
        },
        goneReason: 'session-lost',
        onReleaseFailed: (release, error) => session.releases.add(release, error),
      });
      const releases = new PendingReleases(this.#ctx, keeper, (release, lastError) => this.#end(session, release, lastError));
      session = new Session(id, ttlMs, keeper, opening, releases);
      if (this.#opening.get(ttlMs) === opening) this.#open.set(ttlMs, session);
      return session;
    })();
    this.#opening.set(ttlMs, opening);
    opening.catch(() => {
      if (this.#opening.get(ttlMs) === opening) this.#opening.delete(ttlMs);
    });
    return opening;
  }

  /** An acquire asks with this session: keep it from its idle close until `release`d. */
  hold(session: Session): void {
    session.pending++;
  }

  /** An acquire is done with the session; an empty session starts its idle period. */
  unhold(session: Session): void {
    session.pending--;
    if (session.keeper.leases.size === 0) this.#armIdle(session);
  }

  /** A lease was granted on it: in use again (its idle timer, if any, sees that and stands down). */
  used(session: Session): void {
    session.idleSince = undefined;
  }

  /**
   * Ends every session (time-boxed each), for `Locks.close()`; sessions opening now are waited for.
   * Each session's pending releases are tried once more first (a `released` for each that gets
   * through); the close then frees whatever is left of them.
   */
  async closeAll(): Promise<void> {
    const settled = await Promise.allSettled([...this.#opening.values()]);
    this.#opening.clear();
    this.#open.clear();
    const { clock, operationTimeoutMs } = this.#ctx;
    await Promise.allSettled(
      settled.map(async (s) => {
        if (s.status !== 'fulfilled') return;
        const session = s.value;
        if (session.idleTimer) clock.clearTimeout(session.idleTimer);
        await session.releases.flush();
        session.keeper.stop();
        await withTimeout(this.#sessions.close(session.id), { clock, ms: operationTimeoutMs, what: 'session close', backend: this.#ctx.backendName() });
      }),
    );
    await Promise.allSettled([...this.#closing]);
  }

  /**
   * An idle session is kept for a while, then closed. One timer per idle period, not one per
   * release: a session that is used again meanwhile is left alone.
   */
  #armIdle(session: Session): void {
    if (session.keeper.lost || session.keeper.stopped) return;
    const clock = this.#ctx.clock;
    session.idleSince ??= clock.now();
    if (session.idleTimer) return;
    const idleMs = Math.max(session.ttlMs, SESSION_IDLE_MS);
    const check = (): void => {
      session.idleTimer = undefined;
      if (session.keeper.lost || session.keeper.stopped) return;
      if (session.idleSince === undefined || session.keeper.leases.size > 0 || session.pending > 0) return; // re-armed when it empties again
      const left = session.idleSince + idleMs - clock.now();
      if (left > 0) {
        session.idleTimer = clock.setTimeout(check, left);
        return;
      }
      this.#forget(session);
      session.keeper.stop();
      this.#closeOnServer(session);
    };
    session.idleTimer = clock.setTimeout(check, idleMs);
  }

  /**
   * A release of this session has not got through within its ttl (see the class comment): the
   * session is ended so the key does not stay held. Its leases are signalled lost first (I6: before
   * the coordinator can grant their keys to anyone), then it is closed on the coordinator.
   */
  #end(session: Session, release: FailedRelease, lastError: unknown): void {
    if (session.keeper.lost || session.keeper.stopped) return;
    const backend = this.#ctx.backendName();
    const cause = new BackendUnavailableError(
      backend,
      `the release of "${release.key}" (token ${release.token}) did not get through within the ttl (${Math.round(session.keeper.ttlMs)} ms), so its session was ended rather than keep the key held`,
      { cause: lastError },
    );
    session.keeper.lose('session-lost', cause); // its onIdle forgets the session and its pending releases
    this.#forget(session);
    this.#closeOnServer(session);
  }

  /** Closes a session the pool has let go of (time-boxed, best effort: unclosed, it expires by its ttl); `closeAll` waits for it. */
  #closeOnServer(session: Session): void {
    const { clock, operationTimeoutMs } = this.#ctx;
    const closing = withTimeout(this.#sessions.close(session.id), { clock, ms: operationTimeoutMs, what: 'session close', backend: this.#ctx.backendName() })
      .catch(() => {})
      .finally(() => this.#closing.delete(closing));
    this.#closing.add(closing);
  }

  /** Drops the session from the pool at once, so no acquire picks it up after this; its pending releases end with it. */
  #forget(session: Session): void {
    if (this.#opening.get(session.ttlMs) === session.entry) this.#opening.delete(session.ttlMs);
    if (this.#open.get(session.ttlMs) === session) this.#open.delete(session.ttlMs);
    if (session.idleTimer) this.#ctx.clock.clearTimeout(session.idleTimer);
    session.idleTimer = undefined;
    session.releases.end();
  }
}

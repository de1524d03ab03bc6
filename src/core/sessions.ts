import type { Backend, SessionSupport } from './backend.js';
import type { TimerHandle } from './clock.js';
import { withTimeout } from './call.js';
import { Keeper, type LeaseContext } from './lease.js';

/** An unused session is closed after max(ttl, this): long enough for back-to-back acquires to share it. */
const SESSION_IDLE_MS = 5_000;

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
 */
export class SessionPool {
  readonly #sessions: SessionSupport;
  readonly #ctx: LeaseContext;
  readonly #opening = new Map<number, Promise<Session>>();
  /** The same sessions once open, so an acquire on the hot path does not await a settled promise. */
  readonly #open = new Map<number, Session>();

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
        renewOnce: async (ttl) => ((await sessions.keepAlive(id, ttl)) ? { renewed: true, ttlMs: ttl } : { renewed: false }),
        sentAt,
        ttlMs: effective,
        autoRenew: true,
        onIdle: (k) => {
          if (k.lost) this.#forget(session);
          else this.#armIdle(session);
        },
        goneReason: 'session-lost',
      });
      session = new Session(id, ttlMs, keeper, opening);
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

  /** Ends every session (time-boxed each), for `Locks.close()`; sessions opening now are waited for. */
  async closeAll(): Promise<void> {
    const settled = await Promise.allSettled([...this.#opening.values()]);
    this.#opening.clear();
    this.#open.clear();
    const { clock, operationTimeoutMs } = this.#ctx;
    await Promise.allSettled(
      settled.map(async (s) => {
        if (s.status !== 'fulfilled') return;
        if (s.value.idleTimer) clock.clearTimeout(s.value.idleTimer);
        s.value.keeper.stop();
        await withTimeout(this.#sessions.close(s.value.id), { clock, ms: operationTimeoutMs, what: 'session close', backend: this.#ctx.backendName() });
      }),
    );
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
      void this.#sessions.close(session.id).catch(() => {});
    };
    session.idleTimer = clock.setTimeout(check, idleMs);
  }

  /** Drops the session from the pool at once, so no acquire picks it up after this. */
  #forget(session: Session): void {
    if (this.#opening.get(session.ttlMs) === session.entry) this.#opening.delete(session.ttlMs);
    if (this.#open.get(session.ttlMs) === session) this.#open.delete(session.ttlMs);
    if (session.idleTimer) this.#ctx.clock.clearTimeout(session.idleTimer);
    session.idleTimer = undefined;
  }
}

import { setMaxListeners } from 'node:events';
import { hostname } from 'node:os';
import type { AcquireResult, Backend, HandOff, KeyState } from './backend.js';
import { fullJitter, pause } from './backoff.js';
import { systemClock, type Clock, type TimerHandle } from './clock.js';
import { AcquireTimeoutError, InvalidArgumentError, LeaseholdError, LeaseLostError } from './errors.js';
import { TypedEmitter, type LockEvents } from './events.js';
import { CallTimeoutError, Keeper, LeaseImpl, toLeaseholdError, withTimeout, type Lease, type LeaseContext } from './lease.js';
import {
  checkBoolean, checkClock, checkInteger, checkKey, checkKnownOptions, checkMode, checkObject, checkPrefix, checkSignal, checkTtl,
  checkWait, describe, MAX_DURATION_MS, type LockMode,
} from './validate.js';

/**
 * Defaults, each with the reason for its value. Frozen: copy them into your own options to change them.
 */
export const DEFAULTS = Object.freeze({
  /** 30 s: a crashed holder blocks the key this long; long enough that a GC pause or a slow renewal does not lose the lease. */
  ttlMs: 30_000,
  /** 10 s: long enough to ride out a normal hand-off, short enough that a stuck caller hears about it. */
  waitMs: 10_000,
  /** 0: resources that check tokens need no lock-delay (I8); raise it for ones that cannot. */
  lockDelayMs: 0,
  mode: 'exclusive' as LockMode,
  /** On: renew at ttl/3 until released or lost. Off: the ttl is a hard limit. */
  autoRenew: true,
  /** On: waiters are served in arrival order where the backend can queue them (no barging, no starvation). */
  fair: true,
  /** 1 %, plus 2 ms: the margin by which the client ends validity before the coordinator can (node-redlock's driftFactor). */
  driftFactor: 0.01,
  /** 5 s: the longest a single coordinator call may take before it counts as unavailable. */
  operationTimeoutMs: 5_000,
});

/**
 * Waiting constants. A backend with a wake-up hook is still polled every FALLBACK_POLL_MS in case a
 * notification is lost; one without polls with full-jitter backoff between BACKOFF_BASE_MS and
 * BACKOFF_CAP_MS (and never later than the moment the holder's ttl would run out).
 */
export const WAITING = Object.freeze({
  fallbackPollMs: 500,
  /** A queued waiter that stops asking is dropped after this long, so a crashed waiter cannot block a key. */
  queueTtlMs: 2_000,
  backoffBaseMs: 5,
  backoffCapMs: 200,
});

export interface AcquireOptions {
  /** Lease time-to-live in ms; with autoRenew, the time a crashed holder keeps the key. @default 30000 */
  ttlMs?: number;
  /** How long `acquire` waits for a busy key, in ms; `Infinity` waits forever. Ignored by `tryAcquire`. @default 10000 */
  waitMs?: number;
  /** Many `shared` holders, or one `exclusive`. @default 'exclusive' */
  mode?: LockMode;
  /** After this lease expires without a release, the key stays ungrantable this long (I8). @default 0 */
  lockDelayMs?: number;
  /** Renew in the background at ~ttl/3; `false` makes ttlMs a hard limit. @default true */
  autoRenew?: boolean;
  /** Wait in arrival order (backends with a queue). @default true */
  fair?: boolean;
  /** Aborting it stops the wait; `acquire` then rejects with the signal's reason. */
  signal?: AbortSignal;
}

const ACQUIRE_OPTION_NAMES = ['ttlMs', 'waitMs', 'mode', 'lockDelayMs', 'autoRenew', 'fair', 'signal'] as const;

export interface LocksOptions {
  /** The coordinator, or a function that loads it on first use. */
  backend: Backend | (() => Promise<Backend>);
  /** Monotonic clock for validity, renewal and waiting. @default systemClock (performance.now) */
  clock?: Clock;
  /** Public label stored with each grant and shown to others (`ls`, timeouts). Never secret. @default `${hostname}:${pid}` */
  holderName?: string;
  /** Fraction of the ttl kept as margin against clock drift, plus 2 ms. @default 0.01 */
  driftFactor?: number;
  /** Longest single coordinator call before it counts as unavailable. @default 5000 */
  operationTimeoutMs?: number;
  /** Defaults for every acquire of this instance. */
  defaults?: Omit<AcquireOptions, 'signal'>;
  /** Random source for jitter (tests inject a seeded one). @default Math.random */
  random?: () => number;
}

type ResolvedAcquire = Required<Omit<AcquireOptions, 'signal'>> & { signal: AbortSignal | undefined };

class Session {
  pending = 0;
  /** When the session last became empty (clock time); undefined while it holds leases. */
  idleSince: number | undefined;
  idleTimer: TimerHandle | undefined;
  constructor(
    readonly id: string,
    readonly keeper: Keeper,
    /** The entry of `Locks.#sessions` that resolved to this session. */
    readonly entry: Promise<Session>,
  ) {}
}

export class Locks {
  readonly #clock: Clock;
  readonly #events = new TypedEmitter<LockEvents>();
  readonly #holder: string;
  readonly #driftFactor: number;
  readonly #operationTimeoutMs: number;
  readonly #defaults: Required<Omit<AcquireOptions, 'signal'>>;
  readonly #random: () => number;
  readonly #leases = new Set<LeaseImpl>();
  readonly #sessions = new Map<number, Promise<Session>>();
  /** The same sessions once open, so an acquire on the hot path does not await a settled promise. */
  readonly #open = new Map<number, Session>();
  readonly #closing = new AbortController();
  /** Acquires under way; `close()` lets them settle (each call is time-boxed) before it closes the backend. */
  readonly #obtaining = new Set<Promise<unknown>>();
  readonly #ctx: LeaseContext;
  #backendSource: Backend | (() => Promise<Backend>);
  #backend: Promise<Backend> | undefined;
  /** The backend once loaded: the hot path skips awaiting its promise. */
  #loaded: Backend | undefined;
  #closed: Promise<void> | undefined;

  constructor(options: LocksOptions) {
    const o = checkObject(options, 'options');
    checkKnownOptions(o, ['backend', 'clock', 'holderName', 'driftFactor', 'operationTimeoutMs', 'defaults', 'random'], 'options');
    if (typeof o.backend === 'function') this.#backendSource = o.backend as () => Promise<Backend>;
    else if (isBackend(o.backend)) this.#backendSource = o.backend;
    else throw new InvalidArgumentError('backend', `expected a backend (acquire, renew, release, inspect, close), got ${describe(o.backend)}`);
    this.#clock = o.clock === undefined ? systemClock : checkClock(o.clock);
    this.#holder = o.holderName === undefined ? defaultHolderName() : checkHolderName(o.holderName);
    const driftFactor = o.driftFactor ?? DEFAULTS.driftFactor;
    if (typeof driftFactor !== 'number' || !(driftFactor >= 0 && driftFactor < 0.5)) {
      throw new InvalidArgumentError('driftFactor', `expected a number in [0, 0.5), got ${describe(driftFactor)}`);
    }
    this.#driftFactor = driftFactor;
    this.#operationTimeoutMs = o.operationTimeoutMs === undefined ? DEFAULTS.operationTimeoutMs : checkInteger(o.operationTimeoutMs, 'operationTimeoutMs', 1, MAX_DURATION_MS);
    const d = checkObject(o.defaults, 'defaults');
    checkKnownOptions(d, ACQUIRE_OPTION_NAMES.filter((n) => n !== 'signal'), 'defaults');
    this.#defaults = resolveAcquire(d, { ...DEFAULTS }, 'defaults');
    if (o.random !== undefined && typeof o.random !== 'function') throw new InvalidArgumentError('random', `expected a function returning [0, 1), got ${describe(o.random)}`);
    this.#random = (o.random as (() => number) | undefined) ?? Math.random;
    // Every waiting acquire listens to this signal while it pauses (and stops listening after): as
    // many listeners as waiters, which is not a leak, so no MaxListenersExceededWarning at 11.
    setMaxListeners(0, this.#closing.signal);
    this.#ctx = {
      clock: this.#clock,
      events: this.#events,
      drift: (ttl) => ttl * this.#driftFactor + 2,
      forget: (lease) => this.#leases.delete(lease),
      operationTimeoutMs: this.#operationTimeoutMs,
    };
  }

  /** Subscribes to an event; see {@link LockEvents} for each one and when it does not fire. */
  on<E extends keyof LockEvents>(name: E, listener: (event: LockEvents[E]) => void): this {
    this.#events.on(name, listener);
    return this;
  }

  off<E extends keyof LockEvents>(name: E, listener: (event: LockEvents[E]) => void): this {
    this.#events.off(name, listener);
    return this;
  }

  once<E extends keyof LockEvents>(name: E, listener: (event: LockEvents[E]) => void): this {
    this.#events.once(name, listener);
    return this;
  }

  /** Leases of this instance that are neither released nor lost. */
  leases(): Lease[] {
    return [...this.#leases];
  }

  /**
   * Waits up to `waitMs` for the key, then rejects with `AcquireTimeoutError`. Rejects with the
   * signal's reason when `signal` aborts, `BackendUnavailableError` when the coordinator stays
   * unreachable for the whole wait, `InvalidArgumentError` for bad input (before any I/O).
   */
  async acquire(key: string, options?: AcquireOptions): Promise<Lease> {
    const k = checkKey(key);
    const o = this.#resolve(options);
    const lease = await this.#track(this.#obtain(k, o, true));
    return lease as Lease;
  }

  /** One attempt, never waits, never queues: a Lease, or null when the key is busy. */
  async tryAcquire(key: string, options?: AcquireOptions): Promise<Lease | null> {
    const k = checkKey(key);
    const o = this.#resolve(options);
    return this.#track(this.#obtain(k, o, false));
  }

  /**
   * Acquires, runs `fn(lease)`, releases. If the lease was lost before `fn` settled, rejects with
   * `LeaseLostError` (its `cause` is `fn`'s own error, if it threw). A failing release never
   * replaces `fn`'s result or error: it is reported as a `releaseFailed` event.
   */
  async withLock<T>(key: string, options: AcquireOptions | undefined, fn: (lease: Lease) => Promise<T> | T): Promise<T> {
    if (typeof fn !== 'function') throw new InvalidArgumentError('fn', `expected a function, got ${describe(fn)}`);
    const lease = await this.acquire(key, options);
    let result: T | undefined;
    let failure: { error: unknown } | undefined;
    try {
      result = await fn(lease);
    } catch (error) {
      failure = { error };
    }
    const lost = lease.signal.aborted ? (lease.signal.reason as LeaseLostError) : undefined;
    await lease.release().catch(() => {});
    if (lost) throw new LeaseLostError(lost.key, lost.token, lost.reason, failure ? { cause: failure.error } : undefined);
    if (failure) throw failure.error;
    return result as T;
  }

  /** Holders, tokens, expiry and waiters of keys starting with `prefix` (all keys by default). */
  async inspect(prefix?: string): Promise<KeyState[]> {
    const p = checkPrefix(prefix);
    const backend = await this.#getBackend();
    return withTimeout(backend.inspect(p), this.#clock, this.#operationTimeoutMs, 'inspect');
  }

  /**
   * Releases every lease still held (time-boxed), ends sessions, closes the backend. Pending
   * acquires reject. Idempotent.
   */
  close(): Promise<void> {
    this.#closed ??= this.#close();
    return this.#closed;
  }

  async #close(): Promise<void> {
    this.#closing.abort(new InvalidArgumentError('locks', 'this Locks instance was closed'));
    // A grant on the wire when close() began is given back by its acquire: only while the backend is open.
    await Promise.allSettled([...this.#obtaining]);
    await Promise.allSettled([...this.#leases].map((lease) => lease.release()));
    const sessions = await Promise.allSettled([...this.#sessions.values()]);
    this.#sessions.clear();
    this.#open.clear();
    const backend = this.#backend ? await this.#backend.catch(() => undefined) : undefined;
    await Promise.allSettled(
      sessions.map(async (s) => {
        if (s.status !== 'fulfilled') return;
        if (s.value.idleTimer) this.#clock.clearTimeout(s.value.idleTimer);
        s.value.keeper.stop();
        await withTimeout(backend!.sessions!.close(s.value.id), this.#clock, this.#operationTimeoutMs, 'session close');
      }),
    );
    // Bounded like every other call: a coordinator that accepts connections but never answers (a
    // frozen server, a paused link) must not keep close() — and the process — waiting for ever.
    if (backend) await withTimeout(backend.close(), this.#clock, this.#operationTimeoutMs, 'close').catch(() => {});
  }

  #track<T>(obtaining: Promise<T>): Promise<T> {
    this.#obtaining.add(obtaining);
    const forget = (): void => {
      this.#obtaining.delete(obtaining);
    };
    obtaining.then(forget, forget);
    return obtaining;
  }

  #resolve(options: AcquireOptions | undefined): ResolvedAcquire {
    const o = checkObject(options, 'options');
    checkKnownOptions(o, ACQUIRE_OPTION_NAMES, 'options');
    const resolved = resolveAcquire(o, this.#defaults, 'options') as ResolvedAcquire;
    resolved.signal = o.signal === undefined ? undefined : checkSignal(o.signal, 'options.signal');
    return resolved;
  }

  #getBackend(): Promise<Backend> {
    if (this.#closing.signal.aborted) return Promise.reject(this.#closing.signal.reason);
    if (!this.#backend) {
      const source = this.#backendSource;
      this.#backend = typeof source === 'function' ? Promise.resolve().then(source) : Promise.resolve(source);
      this.#backend.then(
        (b) => {
          this.#loaded = b;
        },
        () => {},
      );
    }
    return this.#backend;
  }

  async #obtain(key: string, o: ResolvedAcquire, wait: boolean): Promise<LeaseImpl | null> {
    const backend = this.#loaded && !this.#closing.signal.aborted ? this.#loaded : await this.#getBackend();
    const clock = this.#clock;
    const signal = o.signal ? AbortSignal.any([o.signal, this.#closing.signal]) : this.#closing.signal;
    signal.throwIfAborted();
    const ttlMs = Math.max(o.ttlMs, backend.capabilities.minTtlMs);
    const start = clock.now();
    const waitMs = wait ? o.waitMs : 0;
    const deadline = start + waitMs;
    const owner = newOwnerId();
    const queue = wait && waitMs > 0 && o.fair && backend.capabilities.fair;
    const useSession = o.autoRenew && backend.sessions !== undefined;

    let attempt = 0;
    let lastBusy: Extract<AcquireResult, { granted: false }> | undefined;
    let lastError: LeaseholdError | undefined;
    let unsubscribe: (() => void) | undefined;
    let subscribed = false;
    let changed = false;
    let wakeCurrent: (() => void) | undefined;
    let queued = false;
    // A hand-off passed to the wake-up hook (see Backend.subscribe), the highest token this wait has
    // seen (a hand-off at or below it is stale), and the session of the latest request, held (kept
    // from its idle close) until this call settles: a queued waiter may be granted to it at any time.
    let handOff: HandOff | undefined;
    let highest = -1n;
    let held: Session | undefined;
    // A grant whose answer came after we stopped listening belongs to nobody and is given back, unless
    // it is the very grant this call ended with: a retry with the same owner gets an earlier grant
    // back (same token), and giving that one back would release the caller's lease behind its back.
    // Late answers that arrive while this call still runs wait until it has settled.
    let settled = false;
    let kept: LeaseImpl | undefined;
    const late: bigint[] = [];
    const giveBack = (token: bigint): void => {
      if (token !== kept?.token) void backend.release({ key, owner, token, mode: o.mode }).catch(() => {});
    };
    // A queued request may have given `owner` a place in the key's queue from the moment it was sent,
    // whether or not its answer ever reaches us in time: the place is given up when this call ends
    // without the key (cancelWait, which also gives back a hand-off made to the place). A request
    // still on the wire then can arrive after that cancel and queue the owner again, so each late
    // answer, whatever it says and in whatever order they come, cancels again (a late grant is given
    // back). Never while this call's own lease is held: a cancel ends the owner's grant too.
    let queueSent = false;
    const cancel = (): void => {
      if (backend.cancelWait && !kept?.held) void backend.cancelWait({ key, owner }).catch(() => {});
    };
    const afterSettled = (answer: AcquireResult | undefined): void => {
      if (answer?.granted) giveBack(answer.token);
      if (queue) cancel();
    };
    // Wait-bounded calls: a call cut short because the wait ran out ends the wait as a timeout (the
    // backend did not fail; the caller's time did), not as an unavailable coordinator.
    const callLimit = (): { ms: number; byWait: boolean } => {
      if (!wait || waitMs <= 0) return { ms: this.#operationTimeoutMs, byWait: false };
      const left = Math.max(1, deadline - clock.now());
      return left < this.#operationTimeoutMs ? { ms: left, byWait: true } : { ms: this.#operationTimeoutMs, byWait: false };
    };
    // A backend that no longer knows our session (its server restarted empty, say) is asked again at
    // once with a new one, within this call; a few times at most, so a backend that keeps saying so
    // cannot spin us.
    let sessionRetries = 0;

    const giveUp = (error: unknown): never => {
      this.#events.emit('acquireFailed', { key, waitedMs: clock.now() - start, error });
      throw error;
    };

    try {
      for (;;) {
        if (signal.aborted) giveUp(signal.reason);
        if (handOff) {
          const h = handOff;
          handOff = undefined;
          // Its validity is the session's: one that ran out (a pause, say) is not taken, whatever the flags say yet.
          if (held && !held.keeper.lost && !held.keeper.stopped && held.keeper.remainingMs() > 0 && h.session === held.id && h.token > highest && !this.#closing.signal.aborted) {
            queued = false;
            kept = this.#grant(backend, key, owner, o, h.token, ttlMs, clock.now(), start, held);
            return kept;
          }
          // Not one we can take as it is: ask again (an owner that holds is answered with its grant).
        }
        let session: Session | undefined;
        let result: AcquireResult | undefined;
        const sentAt = clock.now();
        let limit = callLimit();
        try {
          if (useSession) {
            session = this.#open.get(ttlMs);
            // The session is shared and stays open for the next acquire; this call waits for it only as long as its wait lasts.
            session ??= await withTimeout(this.#session(backend, ttlMs), clock, limit.ms, 'session open');
          }
          if (session !== held) {
            if (held) this.#unhold(backend, ttlMs, held);
            if (session) session.pending++;
            held = session;
          }
          limit = callLimit();
          const call = backend.acquire({ key, owner, mode: o.mode, ttlMs, lockDelayMs: o.lockDelayMs, holder: this.#holder, queue, queueTtlMs: WAITING.queueTtlMs, session: session?.id });
          if (queue) queueSent = true;
          result = await withTimeout(call, clock, limit.ms, 'acquire', (answer) => {
            if (settled) afterSettled(answer);
            else if (answer.granted) late.push(answer.token);
          }, () => {
            if (settled) afterSettled(undefined);
          });
          if (queue) queued = true;
          lastError = undefined;
        } catch (error) {
          const err = toLeaseholdError(error);
          if (!err.retryable) giveUp(err);
          if (limit.byWait && err instanceof CallTimeoutError) {
            // No answer before the wait ran out: the wait is over, and says so.
            giveUp(new AcquireTimeoutError(key, clock.now() - start, lastBusy?.holder, { cause: lastError ?? err }));
          }
          lastError = err;
        }

        if (result?.granted) {
          if (result.token > highest) highest = result.token;
          if (session?.keeper.lost || this.#closing.signal.aborted) {
            // The session died (or we were closed) while the grant was on the wire: hand it back and try again.
            await withTimeout(backend.release({ key, owner, token: result.token, mode: o.mode }), clock, this.#operationTimeoutMs, 'release').catch(() => {});
            if (this.#closing.signal.aborted) giveUp(this.#closing.signal.reason);
            continue;
          }
          queued = false;
          kept = this.#grant(backend, key, owner, o, result.token, result.ttlMs, sentAt, start, session);
          return kept;
        }
        if (result && !result.granted && result.sessionLost && session && sessionRetries < MAX_SESSION_RETRIES) {
          // The coordinator lost our session (a restart, say): end it, open a new one and ask again now.
          sessionRetries++;
          session.keeper.lose('session-lost');
          continue;
        }
        if (result && !result.granted) {
          lastBusy = result;
          if (result.sessionLost && session) session.keeper.lose('session-lost');
        }
        if (!wait) {
          if (lastError) giveUp(lastError);
          return null;
        }
        const remaining = deadline - clock.now();
        if (remaining <= 0) {
          giveUp(lastError && !lastBusy ? lastError : new AcquireTimeoutError(key, clock.now() - start, lastBusy?.holder, lastError ? { cause: lastError } : undefined));
        }
        if (!subscribed && backend.subscribe && !lastError) {
          subscribed = true;
          try {
            // Bounded like every coordinator call; a subscription that arrives too late is ended at once.
            unsubscribe = await withTimeout(
              backend.subscribe(key, (h) => {
                if (h) handOff = h;
                changed = true;
                wakeCurrent?.();
              }, lastBusy?.cursor),
              clock,
              Math.max(1, Math.min(this.#operationTimeoutMs, remaining)),
              'subscribe',
              (late) => late(),
            );
            // Without a cursor, a release before the subscription was active would be missed: re-check at once.
            if (lastBusy?.cursor === undefined) continue;
          } catch {
            unsubscribe = undefined; // no wake-ups: fall back to polling
          }
        }
        let delay: number;
        if (lastError) delay = fullJitter(attempt, 20, 1_000, this.#random) + 5;
        else if (unsubscribe) delay = WAITING.fallbackPollMs;
        else delay = WAITING.backoffBaseMs + fullJitter(attempt, WAITING.backoffBaseMs, WAITING.backoffCapMs, this.#random);
        if (lastBusy?.retryInMs !== undefined && !lastError) delay = Math.min(delay, lastBusy.retryInMs + 1);
        if (queued) delay = Math.min(delay, WAITING.queueTtlMs / 3);
        delay = Math.min(delay, remaining);
        attempt++;
        if (changed) {
          changed = false;
          continue;
        }
        const p = pause(clock, delay, signal);
        wakeCurrent = p.wake;
        await p.done;
        wakeCurrent = undefined;
        changed = false;
      }
    } finally {
      settled = true;
      for (const token of late) giveBack(token);
      unsubscribe?.();
      if ((queued || queueSent) && !kept) cancel();
      if (held) this.#unhold(backend, ttlMs, held);
    }
  }

  /** Ends an acquire's hold on its session; an empty session starts its idle period. */
  #unhold(backend: Backend, ttlMs: number, session: Session): void {
    session.pending--;
    if (session.keeper.leases.size === 0) this.#armIdle(backend, ttlMs, session);
  }

  #grant(backend: Backend, key: string, owner: string, o: ResolvedAcquire, token: bigint, ttlMs: number, sentAt: number, start: number, session: Session | undefined): LeaseImpl {
    const clock = this.#clock;
    const keeper =
      session?.keeper ??
      new Keeper(
        this.#ctx,
        (ttl) => backend.renew({ key, owner, token, mode: o.mode, ttlMs: ttl, lockDelayMs: o.lockDelayMs, holder: this.#holder }),
        sentAt,
        ttlMs,
        o.autoRenew,
        (k) => k.stop(),
      );
    if (session) session.idleSince = undefined; // in use again; its idle timer (if any) sees that and stands down
    const lease = new LeaseImpl({
      ctx: this.#ctx,
      keeper,
      key,
      token,
      mode: o.mode,
      acquiredAt: clock.now(),
      release: () => withTimeout(backend.release({ key, owner, token, mode: o.mode }), clock, this.#operationTimeoutMs, 'release'),
    });
    keeper.add(lease);
    this.#leases.add(lease);
    this.#events.emit('acquired', { key, token, mode: o.mode, ttlMs: lease.ttlMs, waitedMs: clock.now() - start });
    return lease;
  }

  /** The session for this ttl, opened on first use and shared by every autoRenew lease of that ttl. */
  #session(backend: Backend, ttlMs: number): Promise<Session> {
    const existing = this.#sessions.get(ttlMs);
    if (existing) return existing;
    const sessions = backend.sessions!;
    const clock = this.#clock;
    // eslint-disable-next-line prefer-const -- read inside the async body, after its first await
    let opening!: Promise<Session>;
    opening = (async () => {
      const sentAt = clock.now();
      const { id, ttlMs: effective } = await withTimeout(sessions.open(ttlMs), clock, this.#operationTimeoutMs, 'session open', ({ id }) => {
        void sessions.close(id).catch(() => {});
      });
      let session!: Session;
      const keeper = new Keeper(
        this.#ctx,
        async (ttl) => ((await sessions.keepAlive(id, ttl)) ? { renewed: true, ttlMs: ttl } : { renewed: false }),
        sentAt,
        effective,
        true,
        (k) => {
          if (k.lost) this.#forgetSession(ttlMs, session);
          else this.#armIdle(backend, ttlMs, session);
        },
        'session-lost',
      );
      session = new Session(id, keeper, opening);
      if (this.#sessions.get(ttlMs) === opening) this.#open.set(ttlMs, session);
      return session;
    })();
    this.#sessions.set(ttlMs, opening);
    opening.catch(() => {
      if (this.#sessions.get(ttlMs) === opening) this.#sessions.delete(ttlMs);
    });
    return opening;
  }

  /**
   * An idle session is kept for a while (the next acquire reuses it), then closed. One timer per
   * idle period, not one per release: a session that is used again meanwhile is left alone.
   */
  #armIdle(backend: Backend, ttlMs: number, session: Session): void {
    if (session.keeper.lost || session.keeper.stopped) return;
    session.idleSince ??= this.#clock.now();
    if (session.idleTimer) return;
    const idleMs = Math.max(ttlMs, SESSION_IDLE_MS);
    const check = (): void => {
      session.idleTimer = undefined;
      if (session.keeper.lost || session.keeper.stopped) return;
      if (session.idleSince === undefined || session.keeper.leases.size > 0 || session.pending > 0) return; // re-armed when it empties again
      const left = session.idleSince + idleMs - this.#clock.now();
      if (left > 0) {
        session.idleTimer = this.#clock.setTimeout(check, left);
        return;
      }
      this.#forgetSession(ttlMs, session);
      session.keeper.stop();
      void backend.sessions!.close(session.id).catch(() => {});
    };
    session.idleTimer = this.#clock.setTimeout(check, idleMs);
  }

  /** Drops the session from the table at once, so no acquire picks it up after this. */
  #forgetSession(ttlMs: number, session: Session): void {
    if (this.#sessions.get(ttlMs) === session.entry) this.#sessions.delete(ttlMs);
    if (this.#open.get(ttlMs) === session) this.#open.delete(ttlMs);
    if (session.idleTimer) this.#clock.clearTimeout(session.idleTimer);
    session.idleTimer = undefined;
  }
}

/** An unused session is closed after max(ttl, this): long enough for back-to-back acquires to share it. */
const SESSION_IDLE_MS = 5_000;

/** How often one acquire opens a new session when the coordinator says it lost ours, before it reports busy. */
const MAX_SESSION_RETRIES = 2;

function resolveAcquire(o: Record<string, unknown>, base: Required<Omit<AcquireOptions, 'signal'>>, argument: string): Required<Omit<AcquireOptions, 'signal'>> {
  return {
    ttlMs: o.ttlMs === undefined ? base.ttlMs : checkTtl(o.ttlMs, `${argument}.ttlMs`),
    waitMs: o.waitMs === undefined ? base.waitMs : checkWait(o.waitMs, `${argument}.waitMs`),
    mode: o.mode === undefined ? base.mode : checkMode(o.mode, `${argument}.mode`),
    lockDelayMs: o.lockDelayMs === undefined ? base.lockDelayMs : checkInteger(o.lockDelayMs, `${argument}.lockDelayMs`, 0, MAX_DURATION_MS),
    autoRenew: o.autoRenew === undefined ? base.autoRenew : checkBoolean(o.autoRenew, `${argument}.autoRenew`),
    fair: o.fair === undefined ? base.fair : checkBoolean(o.fair, `${argument}.fair`),
  };
}

function isBackend(value: unknown): value is Backend {
  if (typeof value !== 'object' || value === null) return false;
  const b = value as Record<string, unknown>;
  return ['acquire', 'renew', 'release', 'inspect', 'close'].every((m) => typeof b[m] === 'function') && typeof b.capabilities === 'object';
}

function checkHolderName(value: unknown): string {
  if (typeof value !== 'string' || value.length === 0 || value.length > 200 || !/^[\x20-\x7e]+$/.test(value)) {
    throw new InvalidArgumentError('holderName', `expected 1–200 printable ASCII characters, got ${describe(value)}`);
  }
  return value;
}

function defaultHolderName(): string {
  const host = hostname().replace(/[^\x20-\x7e]/g, '') || 'localhost';
  return `${host.slice(0, 100)}:${process.pid}`;
}

/** A random UUID without its dashes (122 random bits, from the platform CSPRNG): the secret that proves ownership to the coordinator (I4). */
function newOwnerId(): string {
  return globalThis.crypto.randomUUID().replace(/-/g, '');
}

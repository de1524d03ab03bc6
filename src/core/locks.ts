import { setMaxListeners } from 'node:events';
import { hostname } from 'node:os';
import { Acquisition, type AcquireContext, type Grant } from './acquire.js';
import type { Backend, KeyState, SessionSupport } from './backend.js';
import { driftMarginMs, systemClock, type Clock } from './clock.js';
import { ClosedError, InvalidArgumentError, LeaseLostError } from './errors.js';
import { Election, type ElectionOptions } from './election.js';
import { TypedEmitter, type LockEvents } from './events.js';
import { guardBackend } from './guard.js';
import { type CallBound, withTimeout } from './call.js';
import { Keeper, LeaseImpl, type Lease, type LeaseContext } from './lease.js';
import { checkLabel, DEFAULTS, resolveAcquireOptions, type AcquireDefaults, type AcquireOptions, type ResolvedAcquire } from './options.js';
import { SessionPool } from './sessions.js';
import { checkClock, checkInteger, checkKey, checkKnownOptions, checkObject, checkPrefix, describe, MAX_DURATION_MS, MIN_TTL_MS } from './validate.js';

export { DEFAULTS, WAITING, type AcquireOptions } from './options.js';

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

/** The backend once loaded, guarded (closed state, inspect's order), with the client's sessions on it. */
interface Loaded {
  readonly backend: Backend;
  readonly sessions: SessionPool | undefined;
}

/**
 * The client: acquires leases (`acquire`, `tryAcquire`, `withLock`), keeps them (renewal, loss
 * detection, events), and closes. The waiting loop is `Acquisition` (acquire.ts), the sessions are
 * `SessionPool` (sessions.ts), the leases and their keepers are lease.ts.
 */
export class Locks {
  readonly #clock: Clock;
  readonly #events = new TypedEmitter<LockEvents>();
  readonly #holder: string;
  readonly #operationTimeoutMs: number;
  readonly #defaults: AcquireDefaults;
  readonly #random: () => number;
  readonly #leases = new Set<LeaseImpl>();
  readonly #closing = new AbortController();
  /** Acquires under way; `close()` lets them settle (each call is time-boxed) before it closes the backend. */
  readonly #obtaining = new Set<Promise<unknown>>();
  readonly #ctx: LeaseContext;
  readonly #backendSource: Backend | (() => Promise<Backend>);
  #loading: Promise<Loaded> | undefined;
  /** The backend once loaded: the hot path skips awaiting its promise. */
  #loaded: Loaded | undefined;
  #acquireCtx: AcquireContext | undefined;
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
    this.#operationTimeoutMs =
      o.operationTimeoutMs === undefined ? DEFAULTS.operationTimeoutMs : checkInteger(o.operationTimeoutMs, 'operationTimeoutMs', 1, MAX_DURATION_MS);
    // `defaults` cannot name the per-call options (signal, limit, label): they come back undefined.
    const { signal: _signal, limit: _limit, label: _label, ...defaults } = resolveAcquireOptions(o.defaults, { ...DEFAULTS }, 'defaults');
    this.#defaults = defaults;
    if (o.random !== undefined && typeof o.random !== 'function')
      throw new InvalidArgumentError('random', `expected a function returning [0, 1), got ${describe(o.random)}`);
    this.#random = (o.random as (() => number) | undefined) ?? Math.random;
    // Every waiting acquire listens to this signal while it pauses (and stops listening after): as
    // many listeners as waiters, which is not a leak, so no MaxListenersExceededWarning at 11.
    setMaxListeners(0, this.#closing.signal);
    this.#ctx = {
      clock: this.#clock,
      events: this.#events,
      drift: (ttl) => driftMarginMs(ttl, driftFactor),
      forget: (lease) => this.#leases.delete(lease),
      operationTimeoutMs: this.#operationTimeoutMs,
      backendName: () => this.#loaded?.backend.name ?? 'leasehold',
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

  /** The backend's `name` (`sqlite`, `redis`, …) once it is loaded (on first use), else undefined. */
  get backendName(): string | undefined {
    return this.#loaded?.backend.name;
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

  /**
   * Leader election on `key` (see {@link Election}): `campaign`, `leader`, `observe`, `lead`. The
   * term is the leadership lease's token.
   */
  election(key: string, options?: ElectionOptions): Election {
    return new Election(this, checkKey(key), options);
  }

  /**
   * Change notifications of one key (grants, releases, expiries) where the backend sends them:
   * resolves with the function that stops them, or undefined when the backend has none (poll
   * `inspect` then). `onChange` may be called spuriously. For observers (elections, dashboards).
   */
  async watch(key: string, onChange: () => void): Promise<(() => void) | undefined> {
    const k = checkKey(key);
    if (typeof onChange !== 'function') throw new InvalidArgumentError('onChange', `expected a function, got ${describe(onChange)}`);
    const { backend } = await this.#load();
    if (!backend.watch) return undefined;
    return withTimeout(backend.watch(k, onChange), {
      clock: this.#clock,
      ms: this.#operationTimeoutMs,
      what: 'watch',
      backend: backend.name,
      onLate: (stop) => stop(),
    });
  }

  /** Holders, tokens, expiry and waiters of keys starting with `prefix` (all keys by default), sorted by key. */
  async inspect(prefix?: string): Promise<KeyState[]> {
    const p = checkPrefix(prefix);
    const { backend } = await this.#load();
    return withTimeout(backend.inspect(p), { clock: this.#clock, ms: this.#operationTimeoutMs, what: 'inspect', backend: backend.name });
  }

  /**
   * Releases every lease still held (time-boxed), tries once more each release of a session lease
   * that failed and is still being retried (see `SessionPool`), ends sessions (which frees what is
   * left of them), closes the backend. Nothing is retried after this. Pending acquires reject with
   * `ClosedError`, and so does every call after this. Idempotent.
   */
  close(): Promise<void> {
    this.#closed ??= this.#close();
    return this.#closed;
  }

  async #close(): Promise<void> {
    this.#closing.abort(new ClosedError('Locks instance'));
    // A grant on the wire when close() began is given back by its acquire: only while the backend is open.
    await Promise.allSettled([...this.#obtaining]);
    await Promise.allSettled([...this.#leases].map((lease) => lease.release()));
    const loaded = this.#loading ? await this.#loading.catch(() => undefined) : undefined;
    if (!loaded) return;
    await loaded.sessions?.closeAll();
    // Bounded like every other call: a coordinator that accepts connections but never answers (a
    // frozen server, a paused link) must not keep close() — and the process — waiting for ever.
    await withTimeout(loaded.backend.close(), { clock: this.#clock, ms: this.#operationTimeoutMs, what: 'close', backend: loaded.backend.name }).catch(
      () => {},
    );
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
    return resolveAcquireOptions(options, this.#defaults, 'options');
  }

  /** Loads the backend on first use and guards it; a closed instance rejects with ClosedError. */
  #load(): Promise<Loaded> {
    if (this.#closing.signal.aborted) return Promise.reject(this.#closing.signal.reason);
    if (!this.#loading) {
      const source = this.#backendSource;
      this.#loading = (typeof source === 'function' ? Promise.resolve().then(source) : Promise.resolve(source)).then((raw) => {
        const backend = guardBackend(raw);
        const sessions = backend.sessions ? new SessionPool({ backend: backend as Backend & { sessions: SessionSupport }, ctx: this.#ctx }) : undefined;
        return (this.#loaded = { backend, sessions });
      });
      this.#loading.catch(() => {});
    }
    return this.#loading;
  }

  async #obtain(key: string, o: ResolvedAcquire, wait: boolean): Promise<LeaseImpl | null> {
    const loaded = this.#loaded && !this.#closing.signal.aborted ? this.#loaded : await this.#load();
    this.#acquireCtx ??= {
      backend: loaded.backend,
      clock: this.#clock,
      events: this.#events,
      holder: this.#holder,
      operationTimeoutMs: this.#operationTimeoutMs,
      random: this.#random,
      closing: this.#closing.signal,
      sessions: loaded.sessions,
      grant: (g) => this.#grant(loaded, g),
    };
    return new Acquisition(this.#acquireCtx, key, o, wait).run();
  }

  #grant(loaded: Loaded, g: Grant): LeaseImpl {
    const clock = this.#clock;
    const { backend } = loaded;
    const { key, owner, token, options: o, session } = g;
    const holder = o.label ?? this.#holder;
    const renew = (ttl: number) =>
      backend.renew({ key, owner, token, mode: o.mode, ttlMs: ttl, lockDelayMs: o.lockDelayMs, holder, ...(o.limit !== undefined && { limit: o.limit }) });
    const keeper =
      session?.keeper ?? new Keeper({ ctx: this.#ctx, renewOnce: renew, sentAt: g.sentAt, ttlMs: g.ttlMs, autoRenew: o.autoRenew, onIdle: (k) => k.stop() });
    if (session) loaded.sessions!.used(session);
    const acquiredAt = clock.now();
    const bound = (what: string) => ({ clock, ms: this.#operationTimeoutMs, what, backend: backend.name });
    const lease = new LeaseImpl({
      ctx: this.#ctx,
      keeper,
      key,
      token,
      mode: o.mode,
      ...(g.sequencer !== undefined && { sequencer: g.sequencer }),
      acquiredAt,
      release: () => {
        // A minimum hold: released before it ends, the key stays ours until then, and then expires.
        const until = acquiredAt + o.minHoldMs;
        if (o.minHoldMs > 0 && until > clock.now()) return this.#holdUntil({ renew, until, ttlMs: keeper.ttlMs, bound });
        return withTimeout(backend.release({ key, owner, token, mode: o.mode }), bound('release'));
      },
    });
    keeper.add(lease);
    this.#leases.add(lease);
    this.#events.emit('acquired', { key, token, mode: o.mode, ttlMs: lease.ttlMs, waitedMs: clock.now() - g.start });
    return lease;
  }

  /**
   * Keeps a released lease's key until `until` (its grant + minHoldMs), then lets it expire: while
   * more than a ttl is left it is renewed at ttl/3 as before; then one last renewal asks for exactly
   * what is left (a backend whose leases have a fixed ttl, etcd, renews for its ttl, which is then
   * no shorter). Resolves after the first renewal; the rest runs on unref'd timers and ends quietly
   * when a renewal fails or this client is closed (the key then expires a ttl after the last
   * renewal that got through). Not released at the end: an expiry, so lock-delay (if any) follows.
   */
  async #holdUntil(h: {
    renew: (ttlMs: number) => Promise<unknown>;
    until: number;
    ttlMs: number;
    bound: (what: string) => CallBound<unknown>;
  }): Promise<void> {
    const clock = this.#clock;
    const step = async (): Promise<void> => {
      const left = h.until - clock.now();
      if (left <= 0 || this.#closing.signal.aborted) return;
      const last = left <= h.ttlMs;
      const answer = (await withTimeout(h.renew(last ? Math.max(MIN_TTL_MS, Math.ceil(left)) : h.ttlMs), h.bound('renew'))) as { renewed: boolean };
      if (!answer.renewed || last) return;
      const next = Math.min(h.ttlMs / 3, h.until - clock.now() - h.ttlMs);
      clock.setTimeout(() => void step().catch(() => {}), Math.max(0, next));
    };
    await step();
  }
}

function isBackend(value: unknown): value is Backend {
  if (typeof value !== 'object' || value === null) return false;
  const b = value as Record<string, unknown>;
  return ['acquire', 'renew', 'release', 'inspect', 'close'].every((m) => typeof b[m] === 'function') && typeof b.capabilities === 'object';
}

function checkHolderName(value: unknown): string {
  return checkLabel(value, 'holderName');
}

function defaultHolderName(): string {
  const host = hostname().replace(/[^\x20-\x7e]/g, '') || 'localhost';
  return `${host.slice(0, 100)}:${process.pid}`;
}

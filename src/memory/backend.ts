import type { AcquireRequest, AcquireResult, Backend, KeyState, ReleaseRequest, RenewRequest, RenewResult, SessionSupport } from '../core/backend.js';
import { systemClock, type Clock, type TimerHandle } from '../core/clock.js';
import { limitConflict } from '../core/errors.js';
import { checkObject, checkKnownOptions, checkBoolean, checkClock } from '../core/validate.js';
import type { LockMode } from '../core/validate.js';

export interface MemoryBackendOptions {
  /** The coordinator's clock (the one that judges expiry). @default systemClock */
  clock?: Clock;
  /**
   * Offer sessions: one keep-alive per client and ttl keeps all its leases (as Redis and etcd do).
   * Off, each lease is renewed on its own. @default false
   */
  sessions?: boolean;
}

interface Holder {
  mode: LockMode;
  token: bigint;
  holder: string;
  expiresAt: number;
  lockDelayMs: number;
  session: string | undefined;
  /** The semaphore's limit, for a permit (a shared grant asked with `limit`); undefined for a plain lock. */
  limit: number | undefined;
}

interface Waiter {
  owner: string;
  mode: LockMode;
  expiresAt: number;
}

interface KeyRecord {
  lastToken: bigint;
  holders: Map<string, Holder>;
  queue: Waiter[];
  delayUntil: number;
  /** Bumped on every change a waiter may care about; a busy answer's cursor. */
  version: number;
  timer: TimerHandle | undefined;
  timerAt: number;
}

/** Expired sessions are remembered this long, so the lock-delay of their leases can still be computed. */
const SESSION_TOMBSTONE_MS = 3_600_000;

/**
 * Leases in this process only: for tests, and for coordinating tasks inside one Node process.
 * Tokens start at 1 and live as long as the backend object; nothing survives a restart.
 * Waiters are woken on release, expiry and queue changes, and served in arrival order.
 *
 * Each call makes a new, private coordinator: two `memoryBackend()`s know nothing of each other
 * and both grant the same key. `createLocks({ url: 'memory:' })` instead uses the one coordinator
 * of the process ({@link sharedMemoryBackend}), so two of those exclude each other.
 */
export function memoryBackend(options?: MemoryBackendOptions): Backend {
  const o = checkObject(options, 'options');
  checkKnownOptions(o, ['clock', 'sessions'], 'options');
  const clock = o.clock === undefined ? systemClock : checkClock(o.clock, 'options.clock');
  const withSessions = o.sessions === undefined ? false : checkBoolean(o.sessions, 'options.sessions');
  const keys = new Map<string, KeyRecord>();
  const sessionTable = new Map<string, { expiresAt: number }>();
  const subscribers = new Map<string, Set<() => void>>();
  /** `watch` observers: told of every grant, release and expiry of their key. */
  const watchers = new Map<string, Set<() => void>>();
  // Calls after close() are refused by core's guard (guardBackend), not here.
  let closed = false;

  const record = (key: string): KeyRecord => {
    let r = keys.get(key);
    if (!r) keys.set(key, (r = { lastToken: 0n, holders: new Map(), queue: [], delayUntil: -Infinity, version: 0, timer: undefined, timerAt: Infinity }));
    return r;
  };

  const expiryOf = (h: Holder): number => {
    if (h.session === undefined) return h.expiresAt;
    return sessionTable.get(h.session)?.expiresAt ?? -Infinity;
  };

  const notify = (key: string): void => {
    const r = keys.get(key);
    if (r) r.version++;
    const set = subscribers.get(key);
    if (set) for (const fn of [...set]) fn();
  };

  /** Tells the key's observers that its holders changed (after the change is done: they may call back at once). */
  const changed = (key: string): void => {
    const set = watchers.get(key);
    if (set) for (const fn of set) queueMicrotask(fn);
  };

  /** Drops expired holders (starting their lock-delay) and expired queue places. Returns true if anything changed. */
  const purge = (key: string, r: KeyRecord, now: number): boolean => {
    let expired = false;
    for (const [owner, h] of r.holders) {
      const expiry = expiryOf(h);
      if (expiry <= now) {
        r.holders.delete(owner);
        if (h.lockDelayMs > 0 && expiry > -Infinity) r.delayUntil = Math.max(r.delayUntil, expiry + h.lockDelayMs);
        expired = true;
      }
    }
    if (expired) changed(key);
    const before = r.queue.length;
    r.queue = r.queue.filter((w) => w.expiresAt > now);
    return expired || r.queue.length !== before;
  };

  /** Arms one timer per key at its next expiry, so waiters hear about expiries, not only releases. */
  const arm = (key: string, r: KeyRecord): void => {
    const now = clock.now();
    let next = Infinity;
    for (const h of r.holders.values()) next = Math.min(next, expiryOf(h));
    for (const w of r.queue) next = Math.min(next, w.expiresAt);
    if (r.delayUntil > now) next = Math.min(next, r.delayUntil);
    if (next === r.timerAt) return;
    if (r.timer) clock.clearTimeout(r.timer);
    r.timer = undefined;
    r.timerAt = next;
    if (next === Infinity || !(subscribers.has(key) || watchers.has(key))) return;
    r.timer = clock.setTimeout(
      () => {
        r.timer = undefined;
        r.timerAt = Infinity;
        purge(key, r, clock.now());
        notify(key);
        arm(key, r);
      },
      Math.max(0, next - now),
    );
  };

  /** No holder conflicts with the mode, and a permit finds a free place (`limit` is the request's, checked against the key's first). */
  const compatible = (r: KeyRecord, mode: LockMode, limit: number | undefined): boolean => {
    if (r.holders.size === 0) return true;
    if (mode === 'exclusive') return false;
    for (const h of r.holders.values()) if (h.mode !== 'shared') return false;
    return limit === undefined || r.holders.size < limit;
  };

  /**
   * Under fairness, a request may go only when everyone queued ahead of it could go with it: no
   * exclusive request ahead (nor anyone ahead of an exclusive one), and for a permit fewer waiters
   * ahead than the free places (`room`), so the first ones take them.
   */
  const clearAhead = (r: KeyRecord, owner: string, mode: LockMode, room: number): boolean => {
    let ahead = 0;
    for (const w of r.queue) {
      if (w.owner === owner) return true;
      if (mode === 'exclusive' || w.mode === 'exclusive' || ++ahead >= room) return false;
    }
    return true;
  };

  const sessions: SessionSupport | undefined = withSessions
    ? {
        async open(ttlMs) {
          const id = globalThis.crypto.randomUUID();
          sessionTable.set(id, { expiresAt: clock.now() + ttlMs });
          return { id, ttlMs };
        },
        async keepAlive(id, ttlMs) {
          const now = clock.now();
          const s = sessionTable.get(id);
          if (!s || s.expiresAt <= now) return false;
          s.expiresAt = now + ttlMs;
          for (const [key, r] of keys) if ([...r.holders.values()].some((h) => h.session === id)) arm(key, r);
          return true;
        },
        async close(id) {
          const s = sessionTable.get(id);
          if (!s) return;
          const now = clock.now();
          // A live session closed on purpose releases its leases (no lock-delay); an expired one keeps
          // its tombstone so purge can start the lock-delay of its leases.
          if (s.expiresAt > now) sessionTable.delete(id);
          for (const [key, r] of keys) {
            if (purge(key, r, now)) {
              notify(key);
              arm(key, r);
            }
          }
        },
      }
    : undefined;

  const backend: Backend = {
    name: 'memory',
    capabilities: Object.freeze({ fair: true, minTtlMs: 0, keepablePlaces: 'all' }),

    async acquire(req: AcquireRequest): Promise<AcquireResult> {
      const now = clock.now();
      const r = record(req.key);
      purge(req.key, r, now);
      for (const [id, s] of sessionTable) if (s.expiresAt < now - SESSION_TOMBSTONE_MS) sessionTable.delete(id);
      if (req.session !== undefined) {
        const s = sessionTable.get(req.session);
        if (!s || s.expiresAt <= now) return { granted: false, sessionLost: true };
      }
      const mine = r.holders.get(req.owner);
      if (mine) {
        // A retry whose earlier answer was lost: the same grant, its expiry counted from this request (I5).
        if (mine.session === undefined) mine.expiresAt = now + req.ttlMs;
        arm(req.key, r);
        return { granted: true, token: mine.token, ttlMs: req.ttlMs };
      }

      // A permit records its limit; the key refuses another limit, or permits mixed with plain shared holders, writing nothing.
      const limit = req.mode === 'shared' ? req.limit : undefined;
      if (req.mode === 'shared') {
        for (const h of r.holders.values()) {
          if (h.mode === 'shared' && h.limit !== limit) throw limitConflict(req.key, h.limit, limit);
        }
      }
      const free = compatible(r, req.mode, limit) && now >= r.delayUntil;
      const inQueue = r.queue.findIndex((w) => w.owner === req.owner);
      const room = limit === undefined ? Infinity : limit - r.holders.size;
      // A queued request goes when everyone ahead could go with it; an unqueued one (tryAcquire) never barges past waiters.
      const mayGo = free && (req.queue ? clearAhead(r, req.owner, req.mode, room) : r.queue.length === 0);
      if (mayGo) {
        r.lastToken += 1n;
        r.holders.set(req.owner, {
          mode: req.mode,
          token: r.lastToken,
          holder: req.holder,
          expiresAt: now + req.ttlMs,
          lockDelayMs: req.lockDelayMs,
          session: req.session,
          limit,
        });
        if (inQueue >= 0) {
          r.queue.splice(inQueue, 1);
          notify(req.key); // the next shared waiter may now be at the head
        }
        changed(req.key);
        arm(req.key, r);
        return { granted: true, token: r.lastToken, ttlMs: req.ttlMs };
      }
      if (req.queue) {
        if (inQueue >= 0) r.queue[inQueue]!.expiresAt = now + req.queueTtlMs;
        else r.queue.push({ owner: req.owner, mode: req.mode, expiresAt: now + req.queueTtlMs });
      }
      arm(req.key, r);
      let soonest = r.delayUntil > now ? r.delayUntil : Infinity;
      let holder: string | undefined;
      for (const h of r.holders.values()) {
        holder ??= h.holder;
        soonest = Math.min(soonest, Math.max(expiryOf(h), r.delayUntil));
      }
      const busy = { granted: false as const, holder, cursor: r.version };
      return soonest === Infinity ? busy : { ...busy, retryInMs: Math.max(0, soonest - now) };
    },

    async renew(req: RenewRequest): Promise<RenewResult> {
      const now = clock.now();
      const r = keys.get(req.key);
      if (!r) return { renewed: false };
      purge(req.key, r, now);
      const h = r.holders.get(req.owner);
      if (!h || h.token !== req.token) return { renewed: false };
      if (h.session === undefined) h.expiresAt = now + req.ttlMs;
      else if (!sessions || !(await sessions.keepAlive(h.session, req.ttlMs))) return { renewed: false };
      arm(req.key, r);
      return { renewed: true, ttlMs: req.ttlMs };
    },

    async release(req: ReleaseRequest): Promise<void> {
      const r = keys.get(req.key);
      if (!r) return;
      purge(req.key, r, clock.now());
      const h = r.holders.get(req.owner);
      if (!h || h.token !== req.token) return;
      r.holders.delete(req.owner);
      notify(req.key);
      changed(req.key);
      arm(req.key, r);
    },

    async cancelWait({ key, owner }) {
      const r = keys.get(key);
      if (!r) return;
      const i = r.queue.findIndex((w) => w.owner === owner);
      if (i < 0) return;
      r.queue.splice(i, 1);
      notify(key);
      arm(key, r);
    },

    async subscribe(key: string, onChange: () => void, cursor?: unknown) {
      let set = subscribers.get(key);
      if (!set) subscribers.set(key, (set = new Set()));
      set.add(onChange);
      const r = keys.get(key);
      // The key changed between the busy answer and this subscription: say so now.
      if (r && typeof cursor === 'number' && cursor !== r.version) queueMicrotask(onChange);
      if (r) {
        r.timerAt = NaN; // force re-arm now that someone listens
        arm(key, r);
      }
      return () => {
        set.delete(onChange);
        if (set.size === 0) subscribers.delete(key);
      };
    },

    async watch(key: string, onChange: () => void) {
      let set = watchers.get(key);
      if (!set) watchers.set(key, (set = new Set()));
      set.add(onChange);
      const r = keys.get(key);
      if (r) {
        r.timerAt = NaN; // force re-arm: expiries are heard from now on
        arm(key, r);
      }
      return () => {
        set.delete(onChange);
        if (set.size === 0 && watchers.get(key) === set) watchers.delete(key);
      };
    },

    async inspect(prefix: string): Promise<KeyState[]> {
      const now = clock.now();
      const out: KeyState[] = [];
      for (const [key, r] of keys) {
        // core orders the answer (guardBackend)
        if (!key.startsWith(prefix)) continue;
        purge(key, r, now);
        const delay = Math.max(0, r.delayUntil - now);
        if (r.holders.size === 0 && r.queue.length === 0 && delay === 0) continue;
        const holders = [...r.holders.values()];
        const limit = holders.find((h) => h.limit !== undefined)?.limit;
        out.push({
          key,
          lastToken: r.lastToken,
          holders: holders.map((h) => ({ mode: h.mode, token: h.token, holder: h.holder, expiresInMs: Math.max(0, expiryOf(h) - now) })),
          waiters: r.queue.length,
          lockDelayRemainingMs: delay,
          ...(limit !== undefined && { limit }),
        });
      }
      return out;
    },

    async close() {
      if (closed) return;
      closed = true;
      for (const r of keys.values()) if (r.timer) clock.clearTimeout(r.timer);
      for (const set of subscribers.values()) for (const fn of set) fn();
      subscribers.clear();
      for (const set of watchers.values()) for (const fn of set) fn();
      watchers.clear();
    },
  };
  if (sessions) backend.sessions = sessions;
  return backend;
}

/**
 * The refusal of a request whose limit is not the key's (see `AcquireRequest.limit`): `held` is the
 * limit of the key's shared holders (undefined: plain shared), `asked` the request's.
 */

/** The coordinator behind `memory:` URLs, created on first use and never closed. */
let shared: Backend | undefined;

/**
 * A client of the one in-process coordinator that every `memory:` URL names, as
 * `createLocks({ url: 'memory:' })` uses it: two such `Locks` in one process exclude each other and
 * share the tokens of each key, like two clients of one server. (One coordinator per copy of
 * leasehold that the process loaded.) Its `close()` closes only this client — its own calls fail
 * afterwards and its waiters are woken — never the shared coordinator, which lives as long as the
 * process, and whose timers never keep the process alive. Call {@link memoryBackend} for a private one.
 */
export function sharedMemoryBackend(): Backend {
  const core = (shared ??= memoryBackend());
  /** This client's wake-up subscriptions: woken and ended when it closes, as a private backend does. */
  const mine = new Map<() => void, () => void>();
  let closed = false;
  /** Keeps a subscription of this client's: woken and ended when the client closes. */
  const own = (off: () => void, onChange: () => void): (() => void) => {
    const wake = (): void => onChange();
    const end = (): void => {
      mine.delete(wake);
      off();
    };
    mine.set(wake, end);
    return end;
  };
  return {
    name: core.name,
    capabilities: core.capabilities,
    async acquire(req) {
      return core.acquire(req);
    },
    async renew(req) {
      return core.renew(req);
    },
    async release(req) {
      return core.release(req);
    },
    async cancelWait(req) {
      return core.cancelWait?.(req);
    },
    async watch(key, onChange) {
      return own(await core.watch!(key, onChange), onChange);
    },
    async subscribe(key, onChange, cursor) {
      return own(await core.subscribe!(key, onChange, cursor), () => onChange());
    },
    async inspect(prefix) {
      return core.inspect(prefix);
    },
    async close() {
      if (closed) return;
      closed = true;
      for (const [wake, end] of [...mine]) {
        end();
        wake();
      }
    },
  };
}

/**
 * Core client behaviour on an injected clock: local validity (I5), renewal cadence and overlap,
 * loss signalling (I6), events, withLock, timeouts. The coordinator is the memory backend on the
 * same manual clock, sometimes behind a wrapper that injects failures.
 */
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { flush, advance } from '../helpers/clock.js';
import type { AcquireRequest, Backend, HandOff, RenewRequest, RenewResult } from '../../src/core/backend.js';
import { manualClock, type Clock, type ManualClock } from '../../src/core/clock.js';
import { AcquireTimeoutError, BackendUnavailableError, InvalidArgumentError, LeaseLostError } from '../../src/core/errors.js';
import type { LockEvents } from '../../src/core/events.js';
import { onLoss, type Lease } from '../../src/core/lease.js';
import { Locks, WAITING } from '../../src/core/locks.js';
import { memoryBackend } from '../../src/memory/index.js';

/** A backend wrapper whose renew/release/acquire can be made to fail or hang (core logic under test, not a server). */
function faulty(inner: Backend) {
  const control = {
    renew: 'ok' as 'ok' | 'fail' | 'hang' | 'gone',
    release: 'ok' as 'ok' | 'fail',
    acquireHang: false,
    /** The coordinator grants at once, but its answer is held back until released from `hung`. */
    acquireAnswerLate: false,
    renewCalls: 0,
    inFlight: 0,
    maxInFlight: 0,
    hung: [] as (() => void)[],
  };
  const backend: Backend = {
    ...inner,
    name: 'faulty',
    capabilities: inner.capabilities,
    acquire: async (req) => {
      if (control.acquireHang) return new Promise((resolve) => control.hung.push(() => resolve(inner.acquire(req))));
      if (control.acquireAnswerLate) {
        const answer = await inner.acquire(req);
        return new Promise((resolve) => control.hung.push(() => resolve(answer)));
      }
      return inner.acquire(req);
    },
    renew: async (req: RenewRequest): Promise<RenewResult> => {
      control.renewCalls++;
      control.inFlight++;
      control.maxInFlight = Math.max(control.maxInFlight, control.inFlight);
      try {
        if (control.renew === 'fail') throw new BackendUnavailableError('faulty', 'connection refused');
        if (control.renew === 'gone') return { renewed: false };
        if (control.renew === 'hang') await new Promise<void>((r) => control.hung.push(r));
        return await inner.renew(req);
      } finally {
        control.inFlight--;
      }
    },
    release: async (req) => {
      if (control.release === 'fail') throw new BackendUnavailableError('faulty', 'connection reset');
      return inner.release(req);
    },
  };
  return { backend, control };
}

describe('Lease on an injected clock', () => {
  let clock: ManualClock;
  let coordinator: Backend;
  const unhandled: unknown[] = [];
  const onUnhandled = (reason: unknown): void => {
    unhandled.push(reason);
  };

  beforeEach(() => {
    clock = manualClock(1_000);
    coordinator = memoryBackend({ clock });
    unhandled.length = 0;
    process.on('unhandledRejection', onUnhandled);
  });
  afterEach(async () => {
    await flush();
    process.off('unhandledRejection', onUnhandled);
    expect(unhandled).toEqual([]); // never an unhandled rejection, whatever failed
  });

  /** Each client gets its own handle on the shared coordinator, so closing one client does not close it for the others. */
  const handle = (backend: Backend): Backend => Object.create(backend, { close: { value: async () => {} } }) as Backend;
  const newLocks = (backend: Backend = coordinator) => new Locks({ backend: handle(backend), clock, holderName: 'unit' });

  it('I5: validity is send time + ttl − drift (1 % + 2 ms), on the injected clock', async () => {
    const locks = newLocks();
    const lease = await locks.acquire('k', { ttlMs: 1_000, autoRenew: false });
    expect(lease.remainingMs()).toBe(1_000 - 12);
    clock.advance(987);
    expect(lease.held).toBe(true);
    clock.advance(1);
    expect(lease.held).toBe(false);
    expect(lease.signal.aborted).toBe(true);
    expect((lease.signal.reason as LeaseLostError).reason).toBe('expired');
  });

  it('I5: a slow grant counts from when the request was sent, not when the answer came', async () => {
    const { backend, control } = faulty(coordinator);
    const locks = newLocks(backend);
    control.acquireHang = true;
    const pending = locks.acquire('k', { ttlMs: 1_000, autoRenew: false });
    await flush();
    clock.advance(300);
    control.acquireHang = false;
    control.hung.shift()!();
    const lease = await pending;
    expect(lease.remainingMs()).toBe(1_000 - 12 - 300);
  });

  it('renews at ttl/3, one renewal at a time, and a manual renew joins the one in flight', async () => {
    const { backend, control } = faulty(coordinator);
    const locks = newLocks(backend);
    const lease = await locks.acquire('k', { ttlMs: 900 });
    await advance(clock, 299);
    expect(control.renewCalls).toBe(0);
    await advance(clock, 2);
    expect(control.renewCalls).toBe(1);
    await advance(clock, 300);
    expect(control.renewCalls).toBe(2);
    control.renew = 'hang';
    await advance(clock, 300);
    expect(control.renewCalls).toBe(3);
    const manual = lease.renew();
    await advance(clock, 300);
    expect(control.renewCalls).toBe(3); // no second renewal while one is in flight
    expect(control.maxInFlight).toBe(1);
    control.renew = 'ok';
    control.hung.shift()!();
    await manual;
    expect(lease.held).toBe(true);
    await lease.release();
  });

  it('I6: transient renewal failures are retried within validity; loss is signalled before the coordinator could regrant', async () => {
    const { backend, control } = faulty(coordinator);
    const holder = newLocks(backend);
    const other = newLocks();
    const events: LockEvents['renewFailed'][] = [];
    holder.on('renewFailed', (e) => events.push(e));
    const lease = await holder.acquire('k', { ttlMs: 1_000 });
    control.renew = 'fail';
    let abortedAt = -1;
    lease.signal.addEventListener('abort', () => (abortedAt = clock.now()));
    const waiting = other.acquire('k', { ttlMs: 1_000, waitMs: 5_000 });
    let grantedAt = -1;
    void waiting.then(() => (grantedAt = clock.now()));
    await advance(clock, 1_200, 2);
    expect(events.length).toBeGreaterThan(3); // retried, not given up after one failure
    expect(events.every((e) => e.remainingMs >= 0)).toBe(true);
    expect(abortedAt).toBe(1_000 + 988);
    expect(grantedAt).toBeGreaterThanOrEqual(2_000); // the coordinator's own expiry
    expect(abortedAt).toBeLessThan(grantedAt);
    expect((await waiting).token).toBeGreaterThan(lease.token);
  });

  it("a renewal carries the grant's lock-delay and label (a backend may have to record the holder again)", async () => {
    const sent: RenewRequest[] = [];
    const backend: Backend = Object.create(coordinator, {
      renew: { value: (req: RenewRequest) => (sent.push(req), coordinator.renew(req)) },
    }) as Backend;
    const locks = newLocks(backend);
    const lease = await locks.acquire('k', { ttlMs: 900, lockDelayMs: 250 });
    await lease.renew();
    clock.advance(300); // and the background renewal at ttl/3
    await flush();
    expect(sent.length).toBeGreaterThanOrEqual(2);
    for (const req of sent) expect(req).toMatchObject({ key: 'k', token: lease.token, ttlMs: 900, lockDelayMs: 250, holder: 'unit' });
    await lease.release();
  });

  it('a renewal answered "not held" loses the lease at once', async () => {
    const { backend, control } = faulty(coordinator);
    const locks = newLocks(backend);
    const lost: LockEvents['lost'][] = [];
    locks.on('lost', (e) => lost.push(e));
    const lease = await locks.acquire('k', { ttlMs: 900 });
    control.renew = 'gone';
    await expect(lease.renew()).rejects.toMatchObject({ code: 'LEASE_LOST', reason: 'not-held', key: 'k', token: lease.token });
    expect(lease.signal.aborted).toBe(true);
    expect(lost).toHaveLength(1);
    expect(lost[0]!.reason).toBe('not-held');
    await lease.release(); // resolves quietly after a loss
    expect(locks.leases()).toEqual([]);
  });

  it('a late renewal answer cannot revive a lease whose validity ran out', async () => {
    const { backend, control } = faulty(coordinator);
    const locks = newLocks(backend);
    const lease = await locks.acquire('k', { ttlMs: 900 });
    control.renew = 'hang';
    await advance(clock, 1_000);
    expect(lease.signal.aborted).toBe(true);
    control.renew = 'ok';
    for (const resume of control.hung.splice(0)) resume();
    await flush();
    expect(lease.held).toBe(false);
  });

  it('events: acquired with wait time, renewed, released with hold time', async () => {
    const locks = newLocks();
    const seen: string[] = [];
    locks.on('acquired', (e) => seen.push(`acquired ${e.key} ${e.token} waited ${e.waitedMs}`));
    locks.on('renewed', (e) => seen.push(`renewed ${e.token}`));
    locks.on('released', (e) => seen.push(`released ${e.token} held ${e.heldMs}`));
    const lease = await locks.acquire('k', { ttlMs: 300 });
    await advance(clock, 150);
    await lease.release();
    expect(seen).toEqual(['acquired k 1 waited 0', 'renewed 1', 'released 1 held 150']);
  });

  it('a throwing listener never breaks the client', async () => {
    const locks = newLocks();
    locks.on('acquired', () => {
      throw new Error('listener bug');
    });
    const warnings: string[] = [];
    const onWarning = (w: Error): void => {
      warnings.push(w.message);
    };
    process.on('warning', onWarning);
    const lease = await locks.acquire('k', { ttlMs: 300 });
    await flush();
    process.off('warning', onWarning);
    expect(lease.held).toBe(true);
    expect(warnings.some((w) => w.includes('listener threw'))).toBe(true);
  });

  it('withLock: a failing release never replaces the result or the error of fn', async () => {
    const { backend, control } = faulty(coordinator);
    const locks = newLocks(backend);
    const failures: unknown[] = [];
    locks.on('releaseFailed', (e) => failures.push(e.error));
    control.release = 'fail';
    expect(await locks.withLock('k', {}, async () => 42)).toBe(42);
    const own = new Error('fn failed');
    await expect(
      locks.withLock('k2', {}, async () => {
        throw own;
      }),
    ).rejects.toBe(own);
    expect(failures).toHaveLength(2);
    expect(failures[0]).toBeInstanceOf(BackendUnavailableError);
  });

  it('release(): idempotent, rejects once when the coordinator is unreachable, then resolves', async () => {
    const { backend, control } = faulty(coordinator);
    const locks = newLocks(backend);
    const lease = await locks.acquire('k', { ttlMs: 300 });
    control.release = 'fail';
    await expect(lease.release()).rejects.toBeInstanceOf(BackendUnavailableError);
    await expect(lease.release()).resolves.toBeUndefined();
    await expect(lease.renew()).rejects.toMatchObject({ reason: 'released' });
    // no more renewals after release: the key frees itself when the ttl runs out
    const calls = control.renewCalls;
    await advance(clock, 1_000);
    expect(control.renewCalls).toBe(calls);
    expect(await newLocks().tryAcquire('k', { ttlMs: 300 })).not.toBeNull();
  });

  it('waits with the clock: AcquireTimeoutError after waitMs, holder named', async () => {
    const a = newLocks();
    const b = new Locks({ backend: handle(coordinator), clock });
    await a.acquire('k', { ttlMs: 10_000 });
    const pending = b.acquire('k', { waitMs: 500 }).catch((e: unknown) => e);
    await advance(clock, 600);
    const error = await pending;
    expect(error).toBeInstanceOf(AcquireTimeoutError);
    expect(error).toMatchObject({ key: 'k', holder: 'unit', waitedMs: 500 });
  });

  it('a coordinator call that hangs counts as unavailable, and a grant that arrives later is given back', async () => {
    const { backend, control } = faulty(coordinator);
    const locks = new Locks({ backend, clock, operationTimeoutMs: 1_000 });
    control.acquireHang = true;
    const pending = locks.tryAcquire('k', { ttlMs: 5_000 }).catch((e: unknown) => e);
    await flush(); // the request is on the wire
    expect(control.hung).toHaveLength(1);
    await advance(clock, 1_001);
    expect(await pending).toBeInstanceOf(BackendUnavailableError);
    control.hung.shift()!(); // the request finally reaches the coordinator and is granted…
    await flush();
    control.acquireHang = false;
    expect(await newLocks().tryAcquire('k', { ttlMs: 300 })).not.toBeNull(); // …and released at once
  });

  it('a late answer to a timed-out acquire never gives back the grant that the retry of the same request got', async () => {
    // The first attempt is granted at the coordinator but its answer is late: core times it out and
    // asks again with the same owner, which gets the same grant back. When the late answer finally
    // arrives, giving "it" back would release the caller's live lease behind its back.
    const { backend, control } = faulty(coordinator);
    const locks = new Locks({ backend, clock, operationTimeoutMs: 1_000, random: () => 0 });
    control.acquireAnswerLate = true;
    const pending = locks.acquire('k', { ttlMs: 10_000, waitMs: 5_000 });
    await flush();
    expect(control.hung).toHaveLength(1);
    control.acquireAnswerLate = false;
    await advance(clock, 1_050); // timed out; the retry gets the grant
    const lease = await pending;
    control.hung.shift()!(); // the first answer arrives at last
    await flush();
    expect(lease.held).toBe(true);
    expect(await newLocks().tryAcquire('k')).toBeNull(); // still held at the coordinator
    await lease.release();
    expect(await newLocks().tryAcquire('k')).not.toBeNull();
  });

  it('close() releases held leases and rejects pending acquires', async () => {
    const a = newLocks();
    const b = newLocks();
    await a.acquire('k', { ttlMs: 10_000 });
    const pending = b.acquire('k', { waitMs: Infinity }).catch((e: unknown) => e);
    await flush();
    await b.close();
    expect(await pending).toMatchObject({ code: 'CLOSED', name: 'ClosedError', retryable: false });
    await a.close();
    expect(await newLocks().tryAcquire('k')).not.toBeNull();
  });

  it('close() during an acquire whose answer is on the wire gives the grant back before closing the backend', async () => {
    // A backend handle that refuses calls once closed, as real ones do.
    let closed = false;
    const hung: (() => void)[] = [];
    const backend = Object.create(coordinator, {
      acquire: { value: (req: Parameters<Backend['acquire']>[0]) => new Promise((resolve) => hung.push(() => resolve(coordinator.acquire(req)))) },
      release: {
        value: async (req: Parameters<Backend['release']>[0]) => {
          if (closed) throw new InvalidArgumentError('backend', 'closed');
          return coordinator.release(req);
        },
      },
      close: {
        value: async () => {
          closed = true;
        },
      },
    }) as Backend;
    const locks = new Locks({ backend, clock });
    const pending = locks.acquire('k', { ttlMs: 10_000 }).catch((e: unknown) => e);
    await flush();
    const closing = locks.close();
    await flush();
    hung.shift()!(); // granted, after close() began
    await closing;
    expect(await pending).toMatchObject({ code: 'CLOSED' });
    expect(await newLocks().tryAcquire('k')).not.toBeNull(); // not left held until its ttl
  });

  it('Symbol.asyncDispose releases; toJSON is loggable', async () => {
    const locks = newLocks();
    const lease = await locks.acquire('doc:1', { ttlMs: 300 });
    expect(JSON.parse(JSON.stringify(lease))).toEqual({ key: 'doc:1', token: '1', mode: 'exclusive', sequencer: lease.sequencer });
    await lease[Symbol.asyncDispose]();
    expect(lease.held).toBe(false);
    expect(lease.signal.aborted).toBe(false); // release is not a loss
    expect(await locks.tryAcquire('doc:1')).not.toBeNull();
  });

  it('tryAcquire never waits and never queues', async () => {
    const a = newLocks();
    const b = newLocks();
    await a.acquire('k', { ttlMs: 10_000 });
    expect(await b.tryAcquire('k')).toBeNull();
    expect((await a.inspect('k'))[0]?.waiters).toBe(0);
  });

  it('sessions: one keep-alive renews every lease of the session; leases live and die with it', async () => {
    const withSessions = memoryBackend({ clock, sessions: true });
    const { backend } = faulty(withSessions);
    let keepAlives = 0;
    const sessions = withSessions.sessions!;
    let sessionGone = false;
    backend.sessions = { ...sessions, keepAlive: async (id, ttl) => (keepAlives++, sessionGone ? false : sessions.keepAlive(id, ttl)) };
    const locks = newLocks(backend);
    const leases = await Promise.all(Array.from({ length: 20 }, (_, i) => locks.acquire(`k${i}`, { ttlMs: 900 })));
    await advance(clock, 1_000);
    expect(keepAlives).toBe(3);
    expect(leases.every((l) => l.held)).toBe(true);
    sessionGone = true;
    await advance(clock, 400);
    expect(leases.every((l) => (l.signal.reason as LeaseLostError | undefined)?.reason === 'session-lost')).toBe(true);
  });
});

describe('after a pause', () => {
  it('a renewal due after validity ran out reports the loss as expired, without asking the coordinator', async () => {
    const clock = manualClock(0);
    let renewCalls = 0;
    const inner = memoryBackend({ clock });
    const backend: Backend = { ...inner, renew: (req) => (renewCalls++, inner.renew(req)) };
    const locks = new Locks({ backend, clock });
    const lease = await locks.acquire('k', { ttlMs: 300 });
    // The process was frozen: both timers are overdue; the renewal timer (due first) runs first.
    clock.jump(1_000);
    await flush();
    expect(renewCalls).toBe(0);
    expect((lease.signal.reason as LeaseLostError).reason).toBe('expired');
  });
});

describe('code that resumes before the overdue timers', () => {
  /** Time moves, timers never fire: what the holder's own code sees first after a freeze or a blocked loop. */
  function frozenTimers(): { clock: Clock; now: { t: number } } {
    const now = { t: 0 };
    return { now, clock: { now: () => now.t, setTimeout: () => ({}), clearTimeout: () => {} } };
  }

  it('held, signal and release agree: the lease is lost (expired), not released', async () => {
    const { clock, now } = frozenTimers();
    const locks = new Locks({ backend: memoryBackend({ clock }), clock });
    const lost: string[] = [];
    locks.on('lost', (e) => lost.push(e.reason));
    const lease = await locks.acquire('k', { ttlMs: 100 });
    now.t = 300; // the process was frozen (or its loop blocked) past the ttl
    expect(lease.held).toBe(false);
    expect(lease.signal.aborted).toBe(true);
    expect((lease.signal.reason as LeaseLostError).reason).toBe('expired');
    await lease.release();
    expect(lost).toEqual(['expired']);
  });

  it('onLoss: a freeze right after the first look at the lease still ends in the listener, exactly once', async () => {
    // The process freezes past the ttl right after its first clock reading once `freeze` is set:
    // what `leasehold verify` does to a worker when it pauses it the moment it reports a grant.
    const now = { t: 0 };
    let freeze = false;
    const clock: Clock = {
      now: () => {
        const t = now.t;
        if (freeze) {
          freeze = false;
          now.t += 1_000;
        }
        return t;
      },
      setTimeout: () => ({}),
      clearTimeout: () => {},
    };
    const locks = new Locks({ backend: memoryBackend({ clock }), clock });
    const watch = async (key: string): Promise<{ lease: Lease; calls: string[] }> => {
      const lease = await locks.acquire(key, { ttlMs: 100 });
      const calls: string[] = [];
      freeze = true;
      onLoss(lease, (reason) => calls.push(reason.reason));
      return { lease, calls };
    };

    // Control: the idiom onLoss must not use. Its first look sees a valid lease; its second finds
    // the validity gone, aborts the signal, and only then adds the listener, which never runs.
    const a = await locks.acquire('a', { ttlMs: 100 });
    const missed: string[] = [];
    freeze = true;
    if (a.signal.aborted) missed.push('at once');
    else a.signal.addEventListener('abort', () => missed.push('listener'), { once: true });
    expect(a.signal.aborted).toBe(true);
    expect(missed).toEqual([]);

    const b = await watch('b');
    expect(b.lease.held).toBe(false); // the next look (or the overdue timer) makes the loss official
    await b.lease.release();
    expect(b.calls).toEqual(['expired']);

    // Already lost when watched: the listener runs at once. Watched, then unwatched: it never runs.
    const c = await locks.acquire('c', { ttlMs: 100 });
    now.t += 1_000;
    const cCalls: string[] = [];
    onLoss(c, (reason) => cCalls.push(reason.reason));
    expect(cCalls).toEqual(['expired']);
    const d = await locks.acquire('d', { ttlMs: 100 });
    const dCalls: string[] = [];
    onLoss(d, () => dCalls.push('unwatched'))();
    now.t += 1_000;
    expect(d.held).toBe(false);
    expect(dCalls).toEqual([]);
  });

  it('withLock reports the loss even when fn returns before any timer ran', async () => {
    const { clock, now } = frozenTimers();
    const locks = new Locks({ backend: memoryBackend({ clock }), clock });
    const error = await locks
      .withLock('k', { ttlMs: 100 }, async () => {
        now.t = 300; // a long synchronous stretch inside fn
        return 'x';
      })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(LeaseLostError);
    expect((error as LeaseLostError).reason).toBe('expired');
  });
});

describe('idle sessions', () => {
  it('are reused by back-to-back acquires and closed only after a whole idle period', async () => {
    const clock = manualClock(0);
    const inner = memoryBackend({ clock, sessions: true });
    const calls = { open: 0, close: 0 };
    const s = inner.sessions!;
    const backend: Backend = {
      ...inner,
      sessions: { open: (t) => (calls.open++, s.open(t)), keepAlive: (id, t) => s.keepAlive(id, t), close: (id) => (calls.close++, s.close(id)) },
    };
    const locks = new Locks({ backend, clock });
    const cycle = async (): Promise<void> => (await locks.acquire('k', { ttlMs: 1_000 })).release();
    await cycle();
    await advance(clock, 4_000, 50);
    await cycle(); // used again 4 s into the 5 s idle period
    await advance(clock, 4_000, 50);
    expect(calls).toEqual({ open: 1, close: 0 }); // 8 s after the first release, 4 s after the last
    await advance(clock, 1_100, 50);
    expect(calls).toEqual({ open: 1, close: 1 });
    await cycle();
    expect(calls.open).toBe(2);
    await locks.close();
  });
});

describe('a backend whose wake-up hook hangs', () => {
  it('acquire still waits by polling and gets the key; the late subscription is ended', async () => {
    const clock = manualClock(0);
    const inner = memoryBackend({ clock });
    let ended = 0;
    let resolveLate: ((unsub: () => void) => void) | undefined;
    const backend: Backend = {
      ...inner,
      subscribe: () => new Promise((resolve) => (resolveLate = resolve)),
    };
    const locks = new Locks({ backend, clock, operationTimeoutMs: 1_000 });
    const other = new Locks({ backend: Object.create(inner, { close: { value: async () => {} } }) as Backend, clock });
    const held = await other.acquire('k', { ttlMs: 10_000 });
    const waiting = locks.acquire('k', { waitMs: 5_000 });
    await advance(clock, 1_100, 10);
    expect(resolveLate).toBeDefined();
    await held.release();
    await advance(clock, 1_000, 10);
    const lease = await waiting;
    expect(lease.token).toBe(2n);
    resolveLate!(() => ended++);
    await flush();
    expect(ended).toBe(1);
  });
});

/**
 * How a waiter waits, counted in coordinator calls on the injected clock: woken by the backend's
 * hook where it has one (no fallback polls), otherwise exponential backoff with full jitter.
 * The wrapper drops the busy answers' retryInMs, so a timely grant can only come from the hook.
 */
describe('waiting for a busy key', () => {
  /** Counts acquire calls (with the clock time of each) and hides retry hints; `subscribe: false` removes the wake-up hook. */
  function counted(inner: Backend, clock: Clock, { subscribe }: { subscribe: boolean }) {
    const calls: number[] = [];
    const backend: Backend = {
      ...inner,
      close: async () => {},
      subscribe: subscribe ? inner.subscribe : undefined,
      acquire: async (req) => {
        calls.push(clock.now());
        const r = await inner.acquire(req);
        if (r.granted) return r;
        const { retryInMs: _hidden, ...busy } = r;
        return busy;
      },
    };
    return { backend, calls };
  }

  it('with a wake-up hook (memory), a release grants the waiter at once, with no fallback poll', async () => {
    const clock = manualClock(0);
    const inner = memoryBackend({ clock });
    for (const withHook of [true, false]) {
      const { backend, calls } = counted(inner, clock, { subscribe: withHook });
      const locks = new Locks({ backend, clock });
      const holder = new Locks({ backend: { ...inner, close: async () => {} }, clock });
      const key = `release-${withHook}`;
      const held = await holder.acquire(key, { ttlMs: 60_000, autoRenew: false });
      let lease: Awaited<ReturnType<Locks['acquire']>> | undefined;
      const waiting = locks.acquire(key, { ttlMs: 60_000, waitMs: 60_000, autoRenew: false }).then((l) => (lease = l));
      await flush();
      if (withHook) {
        const before = calls.length;
        await advance(clock, WAITING.fallbackPollMs - 10); // less than one fallback poll: the waiter stays quiet
        expect(calls.length).toBe(before);
        await held.release(); // no clock movement from here on: only the hook can wake the waiter
        await flush();
        expect(lease?.token).toBeGreaterThan(held.token);
        expect(calls.length).toBe(before + 1);
        await lease!.release();
      } else {
        // control: without the hook, the same release is only noticed by a later timed attempt
        await advance(clock, 100);
        await held.release();
        await flush();
        expect(lease).toBeUndefined();
        await advance(clock, WAITING.backoffBaseMs + WAITING.backoffCapMs + 1);
        expect((await waiting).token).toBeGreaterThan(held.token);
        await lease!.release();
      }
      await locks.close();
      await holder.close();
    }
  });

  it('with a wake-up hook (memory), an expiry grants the waiter at the expiry, before any fallback poll', async () => {
    const clock = manualClock(0);
    const inner = memoryBackend({ clock });
    const { backend, calls } = counted(inner, clock, { subscribe: true });
    const locks = new Locks({ backend, clock });
    const holder = new Locks({ backend: { ...inner, close: async () => {} }, clock });
    const ttlMs = 200; // expires well before the first fallback poll (WAITING.fallbackPollMs)
    const held = await holder.acquire('k', { ttlMs, autoRenew: false });
    const expiresAt = clock.now() + ttlMs;
    let grantedAt: number | undefined;
    const waiting = locks.acquire('k', { ttlMs: 60_000, waitMs: 60_000, autoRenew: false }).then((l) => {
      grantedAt = clock.now();
      return l;
    });
    await flush();
    const before = calls.length;
    await advance(clock, ttlMs + 2, 1);
    expect(grantedAt, 'granted by the time the key expired').toBeDefined();
    expect(grantedAt).toBeLessThanOrEqual(expiresAt + 1);
    const lease = await waiting;
    expect(lease.token).toBeGreaterThan(held.token);
    expect(calls.length).toBe(before + 1);
    await lease.release();
    await locks.close();
    await holder.close();
  });

  it('without a wake-up hook, attempts back off exponentially with full jitter: base + random·min(cap, base·2^n)', async () => {
    const clock = manualClock(0);
    const inner = memoryBackend({ clock });
    const { backend, calls } = counted(inner, clock, { subscribe: false });
    const draws = [1, 0, 0.5, 1, 1, 0.25, 1, 1, 1, 0];
    let used = 0;
    const locks = new Locks({ backend, clock, random: () => draws[used++ % draws.length]! });
    const holder = new Locks({ backend: { ...inner, close: async () => {} }, clock });
    const held = await holder.acquire('k', { ttlMs: 60_000, autoRenew: false });
    const waiting = locks.acquire('k', { ttlMs: 60_000, waitMs: 60_000, autoRenew: false });
    await advance(clock, 2_000, 1);
    expect(calls.length).toBeGreaterThan(draws.length);
    const { backoffBaseMs: base, backoffCapMs: cap } = WAITING;
    for (let n = 0; n < draws.length; n++) {
      const gap = calls[n + 1]! - calls[n]!;
      const expected = base + draws[n]! * Math.min(cap, base * 2 ** n);
      // the clock moves in 1 ms steps, so an attempt is seen up to 1 ms after it was due
      expect(Math.abs(gap - expected), `attempt ${n + 1}: gap ${gap}, expected ${expected}`).toBeLessThanOrEqual(1);
      expect(gap).toBeGreaterThanOrEqual(base - 1);
      expect(gap).toBeLessThanOrEqual(base + cap + 1);
    }
    expect(used).toBeGreaterThanOrEqual(draws.length); // each wait drew from the injected random
    await held.release();
    await advance(clock, base + cap + 1, 1);
    await (await waiting).release();
    await locks.close();
    await holder.close();
  });
});

/**
 * Hand-off: a fair backend with sessions may grant the key to a queued waiter itself and pass the
 * grant to the wake-up hook (the Redis release script does). Here the test plays that backend: it
 * grants the waiter's place in the memory backend and hands the grant over, on the injected clock.
 */
describe('hand-off through the wake-up hook', () => {
  function handing(inner: Backend) {
    const asks: AcquireRequest[] = [];
    const closed: string[] = [];
    let notify: ((handOff?: HandOff) => void) | undefined;
    const s = inner.sessions!;
    const backend: Backend = {
      ...inner,
      close: async () => {},
      acquire: (r) => {
        asks.push(r);
        return inner.acquire(r);
      },
      subscribe: async (_key, onChange) => {
        notify = onChange;
        return () => (notify = undefined);
      },
      sessions: { open: (t) => s.open(t), keepAlive: (id, t) => s.keepAlive(id, t), close: (id) => (closed.push(id), s.close(id)) },
    };
    return { backend, asks, closed, hand: (h: HandOff) => notify?.(h) };
  }

  async function waitingFor(clock: ManualClock, ttlMs = 60_000) {
    const inner = memoryBackend({ clock, sessions: true });
    const t = handing(inner);
    const locks = new Locks({ backend: t.backend, clock });
    const holder = new Locks({ backend: { ...inner, close: async () => {} }, clock });
    const held = await holder.acquire('k', { ttlMs: 60_000, autoRenew: false });
    let lease: Lease | undefined;
    const waiting = locks.acquire('k', { ttlMs, waitMs: 60_000 }).then((l) => (lease = l));
    await flush();
    return { ...t, inner, locks, holder, held, waiting, lease: () => lease };
  }

  it('the waiter takes a grant handed to its session: no further acquire call, and the lease lives with the session', async () => {
    const clock = manualClock(0);
    const w = await waitingFor(clock);
    const last = w.asks.at(-1)!;
    expect(last.session).toBeDefined();
    const before = w.asks.length;
    await w.held.release();
    const g = await w.inner.acquire(last); // the coordinator grants the head waiter's place
    if (!g.granted) throw new Error('not granted');
    w.hand({ token: g.token, session: last.session! });
    await flush();
    expect(w.lease()?.token).toBe(g.token);
    expect(w.asks.length).toBe(before); // taken as it came: the waiter did not ask again
    await advance(clock, 120_000, 1_000); // twice the ttl: the session's keep-alives carry the lease
    expect(w.lease()!.signal.aborted).toBe(false);
    expect((await w.inner.inspect('k'))[0]!.holders.map((h) => h.token)).toEqual([g.token]);
    await w.lease()!.release();
    expect(await w.inner.inspect('k')).toEqual([]);
    await w.locks.close();
    await w.holder.close();
  });

  it('a hand-off naming another session is not taken: the waiter asks again instead', async () => {
    const clock = manualClock(0);
    const w = await waitingFor(clock);
    const before = w.asks.length;
    w.hand({ token: 1_000_000n, session: 'not-this-waiters' });
    await flush();
    expect(w.lease()).toBeUndefined();
    expect(w.asks.length).toBe(before + 1); // asked again (and was told busy: nothing was granted)
    await w.held.release();
    await advance(clock, WAITING.fallbackPollMs + 1, 10);
    expect((await w.waiting).token).toBeGreaterThan(w.held.token);
    await w.lease()!.release();
    await w.locks.close();
    await w.holder.close();
  });

  it('a long wait keeps its session open (a hand-off may come at any time), then lets it go idle', async () => {
    const clock = manualClock(0);
    const w = await waitingFor(clock, 2_000); // a session of ttl 2 s is closed after 5 s idle
    await advance(clock, 20_000, 100); // four times the idle period, a third of the holder's ttl
    expect(w.closed).toEqual([]);
    expect(new Set(w.asks.map((a) => a.session)).size).toBe(1);
    await w.held.release();
    await advance(clock, WAITING.fallbackPollMs + 1, 10);
    const lease = await w.waiting;
    await lease.release();
    await advance(clock, 5_000 + 100, 100); // idle now: closed after max(ttl, 5 s)
    expect(w.closed.length).toBe(1);
    await w.locks.close();
    await w.holder.close();
  });
});

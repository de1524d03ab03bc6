/**
 * Core's waiting loop when the coordinator's answers come late or never, on an injected clock: a
 * wait that gave up leaves no queue place behind (whatever order the late answers come in), a wait
 * ends by its waitMs with ACQUIRE_TIMEOUT, a coordinator that lost our session is asked again within
 * the same call, renewal failures are one event per round trip, and many waiters raise no
 * MaxListenersExceededWarning. The coordinator is the memory backend on the same clock, behind a
 * wrapper that holds answers back (core logic under test; the same scenarios run against real
 * Redis and etcd through a delaying proxy in test/redis and test/etcd).
 */
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { flush, advance } from '../helpers/clock.js';
import type { AcquireRequest, AcquireResult, Backend } from '../../src/core/backend.js';
import { manualClock, type ManualClock } from '../../src/core/clock.js';
import { AcquireTimeoutError, BackendUnavailableError } from '../../src/core/errors.js';
import type { LockEvents } from '../../src/core/events.js';
import { Locks } from '../../src/core/locks.js';
import { memoryBackend } from '../../src/memory/index.js';

/**
 * The memory coordinator behind a link that holds every acquire request (the coordinator sees it
 * only when `deliver` is called) and counts cancelWait calls.
 */
function slowLink(inner: Backend) {
  const held: { req: AcquireRequest; resolve: (r: AcquireResult) => void; reject: (e: unknown) => void }[] = [];
  const calls = { cancelWait: 0, release: 0 };
  let holding = true;
  const backend: Backend = {
    ...inner,
    name: 'slow-link',
    acquire: (req) => {
      if (!holding) return inner.acquire(req);
      return new Promise((resolve, reject) => held.push({ req, resolve, reject }));
    },
    release: (req) => {
      calls.release++;
      return inner.release(req);
    },
    cancelWait: async (req) => {
      calls.cancelWait++;
      await inner.cancelWait!(req);
    },
    close: async () => {},
  };
  return {
    backend,
    calls,
    held,
    stopHolding: () => (holding = false),
    /** Lets the held requests reach the coordinator, in the given order, and their answers back. */
    deliver: async (order: number[] = held.map((_, i) => i)) => {
      const batch = held.splice(0);
      for (const i of order) {
        const h = batch[i]!;
        await inner.acquire(h.req).then(h.resolve, h.reject);
        await flush();
      }
    },
  };
}

describe('a wait whose answers come late', () => {
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
    expect(unhandled).toEqual([]);
  });
  const own = (b: Backend): Backend => Object.create(b, { close: { value: async () => {} } }) as Backend;
  const client = (b: Backend = coordinator) => new Locks({ backend: own(b), clock, holderName: 'other', random: () => 0 });

  it("ends by waitMs with ACQUIRE_TIMEOUT, not with the coordinator call's own 5 s timeout", async () => {
    const holder = await client().acquire('k', { ttlMs: 60_000 });
    const link = slowLink(coordinator);
    const slow = new Locks({ backend: link.backend, clock, holderName: 'slow', random: () => 0 });
    const failed = slow.acquire('k', { ttlMs: 60_000, waitMs: 1_500 }).catch((e: unknown) => e);
    let settledAt = -1;
    void failed.then(() => (settledAt = clock.now()));
    await advance(clock, 2_000);
    const error = (await failed) as AcquireTimeoutError;
    expect(error).toBeInstanceOf(AcquireTimeoutError);
    expect(error.code).toBe('ACQUIRE_TIMEOUT');
    expect(error.cause).toBeInstanceOf(BackendUnavailableError); // why no answer came: said, not hidden
    expect(error.cause).toMatchObject({ backend: 'slow-link', message: 'slow-link: acquire got no answer within 1500 ms' }); // named after the backend, not 'leasehold'
    expect(settledAt).toBeGreaterThanOrEqual(1_000 + 1_500);
    expect(settledAt).toBeLessThanOrEqual(1_000 + 1_500 + 10); // within a step of the manual clock
    await holder.release();
  });

  it('a wait that saw only failures, its last ask cut by the wait, ends with the failure: nobody was seen holding the key', async () => {
    let asks = 0;
    const down: Backend = {
      ...coordinator,
      name: 'down',
      close: async () => {},
      // The first ask fails at once (a refused connection); the next ones get no answer in time.
      acquire: () => (asks++ === 0 ? Promise.reject(new BackendUnavailableError('down', 'connection refused')) : new Promise<AcquireResult>(() => {})),
    };
    const locks = new Locks({ backend: down, clock, holderName: 'w', random: () => 0 });
    const failed = locks.acquire('k', { ttlMs: 60_000, waitMs: 1_000 }).catch((e: unknown) => e);
    await advance(clock, 1_100);
    const error = await failed;
    expect(asks).toBeGreaterThanOrEqual(2); // the last ask was cut by the end of the wait
    expect(error).toBeInstanceOf(BackendUnavailableError); // not ACQUIRE_TIMEOUT: "still busy" would be a claim nobody made
    expect(error).not.toBeInstanceOf(AcquireTimeoutError);
    expect((error as Error).message).toMatch(/connection refused/);
  });

  it('leaves no queue place when every answer came after it gave up (the cancel is sent, and sent again after each late answer)', async () => {
    const holder = await client().acquire('k', { ttlMs: 60_000 });
    const link = slowLink(coordinator);
    const slow = new Locks({ backend: link.backend, clock, holderName: 'slow', random: () => 0 });
    const failed = slow.acquire('k', { ttlMs: 60_000, waitMs: 1_000 }).catch((e: unknown) => e);
    await advance(clock, 1_100);
    expect(await failed).toBeInstanceOf(AcquireTimeoutError);
    expect(link.held.length).toBeGreaterThanOrEqual(1);
    expect(link.calls.cancelWait).toBe(1); // sent when the call ended, although no answer had come
    link.stopHolding();
    await link.deliver(); // the late requests reach the coordinator now: each queues the owner again…
    expect(link.calls.cancelWait).toBeGreaterThanOrEqual(2); // …and each late answer cancels again
    const [state] = await coordinator.inspect('k');
    expect(state!.waiters).toBe(0);
    await holder.release();
    // Nobody is handed the key behind the back of the caller that gave up: a third client gets it at once.
    const third = await client().tryAcquire('k', { ttlMs: 1_000 });
    expect(third).not.toBeNull();
    await third!.release();
  });

  it('gives back a grant whose answer came after it gave up, in whatever order the late answers come', async () => {
    const holder = await client().acquire('k', { ttlMs: 60_000 });
    const link = slowLink(coordinator);
    const slow = new Locks({ backend: link.backend, clock, holderName: 'slow', operationTimeoutMs: 300, random: () => 0 });
    const failed = slow.acquire('k', { ttlMs: 60_000, waitMs: 2_000 }).catch((e: unknown) => e);
    await advance(clock, 2_100);
    expect(await failed).toBeInstanceOf(AcquireTimeoutError);
    const requests = link.held.length;
    expect(requests).toBeGreaterThanOrEqual(2);
    await holder.release(); // the key is free now: the late requests are granted, newest first
    link.stopHolding();
    await link.deliver([...Array(requests).keys()].reverse());
    await flush();
    const [state] = await coordinator.inspect('k');
    expect(state?.holders ?? []).toEqual([]);
    expect(state?.waiters ?? 0).toBe(0);
    const third = await client().tryAcquire('k', { ttlMs: 1_000 });
    expect(third).not.toBeNull();
  });
});

describe('a coordinator that lost our session', () => {
  it('is asked again with a new session within the same tryAcquire (no false "busy")', async () => {
    const clock = manualClock(1_000);
    const inner = memoryBackend({ clock, sessions: true });
    let forget = false;
    const opened: string[] = [];
    const backend: Backend = {
      ...inner,
      sessions: {
        open: async (ttl) => {
          const s = await inner.sessions!.open(ttl);
          opened.push(s.id);
          return s;
        },
        keepAlive: (id, ttl) => inner.sessions!.keepAlive(id, ttl),
        close: (id) => inner.sessions!.close(id),
      },
      // As a restarted server would: the first session it sees after the "restart" is unknown to it.
      acquire: async (req) => (forget && req.session === opened[0] ? { granted: false, sessionLost: true } : inner.acquire(req)),
    };
    const locks = new Locks({ backend, clock });
    const first = await locks.tryAcquire('a', { ttlMs: 10_000 });
    await first!.release();
    forget = true;
    const lease = await locks.tryAcquire('b', { ttlMs: 10_000 });
    expect(lease).not.toBeNull();
    expect(opened).toHaveLength(2);
    await locks.close();
  });
});

describe('renewal failures of a session with many leases', () => {
  it('are one renewFailed event per round trip, retried no closer than the floor', async () => {
    const clock = manualClock(1_000);
    const inner = memoryBackend({ clock, sessions: true });
    let failing = false;
    let keepAlives = 0;
    const backend: Backend = {
      ...inner,
      sessions: {
        ...inner.sessions!,
        keepAlive: async (id, ttl) => {
          keepAlives++;
          if (failing) throw new BackendUnavailableError('test', 'unreachable');
          return inner.sessions!.keepAlive(id, ttl);
        },
      },
    };
    const locks = new Locks({ backend, clock });
    const events: LockEvents['renewFailed'][] = [];
    locks.on('renewFailed', (e) => events.push(e));
    await Promise.all(Array.from({ length: 500 }, (_, i) => locks.acquire(`k${i}`, { ttlMs: 3_000 })));
    failing = true;
    await advance(clock, 3_100, 1);
    expect(events.length).toBe(keepAlives); // one event per failed keep-alive, not one per lease
    expect(events.every((e) => e.leases === 500)).toBe(true);
    // ttl/3 = 1 s to the first try, then retries at least max(20 ms, ttl/100) apart until validity ends: at most ~2 s / 30 ms of them
    expect(keepAlives).toBeLessThanOrEqual(1 + Math.ceil(2_000 / 30));
    expect(locks.leases()).toHaveLength(0); // lost at the end of validity
    await locks.close();
  });
});

describe('many waiters on one Locks', () => {
  it('print no MaxListenersExceededWarning', async () => {
    const warnings: Error[] = [];
    const onWarning = (w: Error): void => {
      warnings.push(w);
    };
    process.on('warning', onWarning);
    try {
      const locks = new Locks({ backend: memoryBackend() });
      const signal = new AbortController().signal;
      const lease = await locks.acquire('busy', { ttlMs: 10_000 });
      const waits = Array.from({ length: 30 }, (_, i) =>
        locks.acquire('busy', { ttlMs: 10_000, waitMs: 200, fair: i % 2 === 0, ...(i % 3 === 0 ? { signal } : {}) }).catch((e: unknown) => e),
      );
      const results = await Promise.all(waits);
      expect(results.every((r) => r instanceof AcquireTimeoutError)).toBe(true);
      await lease.release();
      await locks.close();
      await new Promise((r) => setImmediate(r));
    } finally {
      process.off('warning', onWarning);
    }
    expect(warnings.filter((w) => w.name === 'MaxListenersExceededWarning')).toEqual([]);
  });
});

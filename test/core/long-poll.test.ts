/**
 * Core's waiting loop over a backend that waits for a busy key itself (`capabilities.maxWaitMs`, a
 * long poll: the HTTP lock service), on an injected clock. A waiting acquire puts what is left of
 * its wait in `waitMs` (at most the backend's limit), the call is not cut by the 5 s operation
 * timeout while the coordinator holds it, nothing polls between asks, aborting the caller's signal
 * reaches the request, and `tryAcquire` (or a backend without the capability) never sends `waitMs`.
 * The coordinator is the memory backend on the same clock, behind a wrapper that does the waiting
 * as a lock service would (its own wake-ups, its own deadline).
 */
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { AcquireRequest, AcquireResult, Backend } from '../../src/core/backend.js';
import { pause } from '../../src/core/backoff.js';
import { manualClock, type ManualClock } from '../../src/core/clock.js';
import { AcquireTimeoutError, BackendUnavailableError } from '../../src/core/errors.js';
import { Locks } from '../../src/core/locks.js';
import { memoryBackend } from '../../src/memory/index.js';
import { advance, flush } from '../helpers/clock.js';

/** A long-polling coordinator over `inner`: holds a request with `waitMs` until the key is granted, the wait runs out or its signal aborts. */
function longPolling(inner: Backend, clock: ManualClock, maxWaitMs: number | undefined) {
  const asks: AcquireRequest[] = [];
  const backend: Backend = {
    ...inner,
    name: 'long-poll',
    capabilities: { ...inner.capabilities, ...(maxWaitMs !== undefined && { maxWaitMs }) },
    close: async () => {},
    acquire: async (req) => {
      asks.push(req);
      const { waitMs, signal, ...plain } = req;
      const deadline = clock.now() + (waitMs ?? 0);
      for (;;) {
        if (signal?.aborted) throw new BackendUnavailableError('long-poll', 'the request was aborted');
        const answer: AcquireResult = await inner.acquire(plain);
        const left = deadline - clock.now();
        if (answer.granted || left <= 0) return answer;
        const p = pause(clock, left, signal);
        const end = await inner.subscribe!(req.key, p.wake);
        await p.done;
        end();
      }
    },
  };
  return { backend, asks };
}

describe('a backend that waits for the key itself (capabilities.maxWaitMs)', () => {
  let clock: ManualClock;
  let coordinator: Backend;
  let clients: Locks[];
  beforeEach(() => {
    clock = manualClock(1_000);
    coordinator = memoryBackend({ clock });
    clients = [];
  });
  afterEach(async () => {
    await Promise.all(clients.map((c) => c.close()));
    await flush();
  });
  const own = (b: Backend): Backend => Object.create(b, { close: { value: async () => {} } }) as Backend;
  const client = (b: Backend = own(coordinator)): Locks => {
    const locks = new Locks({ backend: b, clock, random: () => 0 });
    clients.push(locks);
    return locks;
  };

  it('is asked once with the time left of the wait, held past the operation timeout, and granted on release without a second ask', async () => {
    const holder = await client().acquire('k', { ttlMs: 60_000 });
    const { backend, asks } = longPolling(coordinator, clock, 60_000);
    const waiting = client(backend).acquire('k', { ttlMs: 60_000, waitMs: 20_000 });
    await flush();
    expect(asks).toHaveLength(1);
    expect(asks[0]!.waitMs).toBe(20_000);
    expect(asks[0]!.signal).toBeInstanceOf(AbortSignal);
    await advance(clock, 15_000, 100); // three times the 5 s operation timeout: the long poll still runs
    expect(asks).toHaveLength(1);
    await holder.release();
    await flush();
    const lease = await waiting;
    expect(lease.token).toBeGreaterThan(holder.token);
    expect(asks).toHaveLength(1); // woken at the coordinator: no client-side poll, no second ask
  });

  it('caps waitMs at the backend limit and asks again at once when a long poll ends busy', async () => {
    const holder = await client().acquire('k', { ttlMs: 600_000 });
    const { backend, asks } = longPolling(coordinator, clock, 1_000);
    const failed = client(backend)
      .acquire('k', { ttlMs: 60_000, waitMs: 3_500 })
      .catch((e: unknown) => e);
    await advance(clock, 3_600, 50);
    const error = await failed;
    expect(error).toBeInstanceOf(AcquireTimeoutError);
    expect(asks.map((a) => a.waitMs)).toEqual([1_000, 1_000, 1_000, 500]);
    await holder.release();
  });

  it('aborting the caller aborts the request in flight; tryAcquire sends no waitMs', async () => {
    const holder = await client().acquire('k', { ttlMs: 60_000 });
    const { backend, asks } = longPolling(coordinator, clock, 60_000);
    const c = client(backend);
    const controller = new AbortController();
    const waiting = c.acquire('k', { ttlMs: 60_000, waitMs: 30_000, signal: controller.signal }).catch((e: unknown) => e);
    await flush();
    const reason = new Error('caller gave up');
    controller.abort(reason);
    await flush();
    expect(asks[0]!.signal!.aborted).toBe(true);
    expect(await waiting).toBe(reason);
    expect(await c.tryAcquire('k', { ttlMs: 1_000 })).toBeNull();
    expect(asks.at(-1)!.waitMs).toBeUndefined();
    expect(asks.at(-1)!.signal).toBeUndefined();
    await holder.release();
  });

  it('a backend without the capability is never sent waitMs (core waits on its own)', async () => {
    const holder = await client().acquire('k', { ttlMs: 60_000 });
    const { backend, asks } = longPolling(coordinator, clock, undefined);
    const waiting = client(backend).acquire('k', { ttlMs: 60_000, waitMs: 5_000 });
    await advance(clock, 1_000, 50);
    await holder.release();
    await advance(clock, 600, 50);
    await waiting;
    expect(asks.length).toBeGreaterThan(1);
    expect(asks.every((a) => a.waitMs === undefined && a.signal === undefined)).toBe(true);
  });
});

/**
 * The acquire options of the recipes (issue 16), in core: `limit` (a semaphore permit) validated
 * and sent as a shared request with its limit, `label` as the grant's public label, and
 * `minHoldMs` (ShedLock's lockAtLeastFor): an early release keeps the key until the minimum hold
 * has passed, then it expires. The memory coordinator on an injected clock.
 */
import { describe, expect, it } from 'vitest';
import { advance as advanceBy } from '../helpers/clock.js';
import type { AcquireRequest, Backend } from '../../src/core/backend.js';
import { manualClock, type ManualClock } from '../../src/core/clock.js';
import { InvalidArgumentError } from '../../src/core/errors.js';
import { Locks } from '../../src/core/locks.js';
import { memoryBackend } from '../../src/memory/index.js';

const advance = (clock: ManualClock, ms: number, step = 50): Promise<void> => advanceBy(clock, ms, step);

/** The memory coordinator, recording what core sends. */
function recording(clock: ManualClock): { backend: Backend; sent: AcquireRequest[] } {
  const inner = memoryBackend({ clock });
  const sent: AcquireRequest[] = [];
  return { backend: { ...inner, acquire: (req) => (sent.push(req), inner.acquire(req)) }, sent };
}

describe('limit', () => {
  it('is validated at the boundary: 1 … 10,000, and not with an explicit exclusive mode above 1', async () => {
    const locks = new Locks({ backend: memoryBackend() });
    for (const limit of [0, 10_001, 1.5, '3', -1]) {
      await expect(locks.acquire('k', { limit } as never)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'options.limit' });
    }
    await expect(locks.acquire('k', { limit: 3, mode: 'exclusive' })).rejects.toThrow(/contradicts/);
    expect(() => new Locks({ backend: memoryBackend(), defaults: { limit: 3 } as never })).toThrow(InvalidArgumentError); // per call only
    await locks.close();
  });

  it('asks for a permit: mode shared with the limit; an explicit exclusive of 1 is a plain lock', async () => {
    const clock = manualClock(0);
    const { backend, sent } = recording(clock);
    const locks = new Locks({ backend, clock });
    await (await locks.acquire('a', { limit: 3 })).release();
    await (await locks.acquire('b', { limit: 1, mode: 'exclusive' })).release();
    await (await locks.acquire('c', { limit: 2, mode: 'shared' })).release();
    expect(sent.map((r) => [r.key, r.mode, r.limit])).toEqual([
      ['a', 'shared', 3],
      ['b', 'exclusive', undefined],
      ['c', 'shared', 2],
    ]);
    await locks.close();
  });
});

describe('label', () => {
  it("is the grant's public label, shown by inspect; bounded and printable", async () => {
    const locks = new Locks({ backend: memoryBackend(), holderName: 'web-3' });
    const lease = await locks.acquire('job', { label: 'nightly export (web-3)' });
    const other = await locks.acquire('other');
    expect((await locks.inspect('')).map((s) => s.holders[0]?.holder)).toEqual(['nightly export (web-3)', 'web-3']);
    for (const label of ['', 'x'.repeat(201), 'tab\there', 42]) {
      await expect(locks.acquire('k', { label } as never)).rejects.toMatchObject({ argument: 'options.label' });
    }
    await lease.release();
    await other.release();
    await locks.close();
  });
});

describe('minHoldMs', () => {
  it('an early release keeps the key until the minimum hold has passed, then it expires (a second cron skips)', async () => {
    const clock = manualClock(1_000);
    const coordinator = memoryBackend({ clock });
    const own = (): Backend => Object.create(coordinator, { close: { value: async () => {} } }) as Backend;
    const first = new Locks({ backend: own(), clock });
    const second = new Locks({ backend: own(), clock });
    const lease = await first.acquire('nightly', { ttlMs: 10_000, minHoldMs: 60_000 });
    await advance(clock, 2_000);
    await lease.release(); // the job took 2 s
    expect(lease.held).toBe(false);
    await advance(clock, 5_000);
    expect(await second.tryAcquire('nightly', { ttlMs: 10_000 })).toBeNull(); // the other machine's cron, 7 s after the grant: skips
    await advance(clock, 50_000); // 57 s after the grant: still held (renewed while more than a ttl was left)
    expect(await second.tryAcquire('nightly', { ttlMs: 10_000 })).toBeNull();
    await advance(clock, 3_200); // past grant + 60 s: it expired
    const next = await second.tryAcquire('nightly', { ttlMs: 10_000 });
    expect(next).not.toBeNull();
    expect(next!.token).toBeGreaterThan(lease.token);
    await first.close();
    await second.close();
  });

  it('a release after the minimum hold frees the key at once', async () => {
    const clock = manualClock(0);
    const locks = new Locks({ backend: memoryBackend({ clock }), clock });
    const lease = await locks.acquire('k', { ttlMs: 10_000, minHoldMs: 1_000 });
    await advance(clock, 1_500);
    await lease.release();
    expect(await locks.tryAcquire('k')).not.toBeNull();
    await locks.close();
  });

  it('is validated', async () => {
    const locks = new Locks({ backend: memoryBackend() });
    await expect(locks.acquire('k', { minHoldMs: -1 })).rejects.toMatchObject({ argument: 'options.minHoldMs' });
    await locks.close();
  });
});

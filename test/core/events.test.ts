/**
 * The events that monitoring is built on (leasehold/metrics, tracing): each acquire ends in exactly
 * one of `acquired`, `busy` or `acquireFailed` with an outcome that says why, and the client names
 * its backend once loaded. Memory backend on the real clock (short waits).
 */
import { describe, expect, it } from 'vitest';
import { AcquireTimeoutError, BackendUnavailableError, ClosedError } from '../../src/core/errors.js';
import type { LockEvents } from '../../src/core/events.js';
import { Locks } from '../../src/core/locks.js';
import type { Backend } from '../../src/core/backend.js';
import { memoryBackend } from '../../src/memory/index.js';

function record(locks: Locks): string[] {
  const seen: string[] = [];
  locks.on('acquired', (e) => seen.push(`acquired ${e.key}`));
  locks.on('busy', (e) => seen.push(`busy ${e.key}`));
  locks.on('acquireFailed', (e: LockEvents['acquireFailed']) => seen.push(`failed ${e.key} ${e.outcome} ${(e.error as Error).name}`));
  return seen;
}

describe('acquire outcomes as events', () => {
  it('acquired, busy (tryAcquire null), timeout, aborted (signal, already aborted, close) and error', async () => {
    const coordinator = memoryBackend();
    const own = (): Backend => Object.create(coordinator, { close: { value: async () => {} } }) as Backend;
    const holder = new Locks({ backend: own() });
    const locks = new Locks({ backend: own() });
    const seen = record(locks);
    expect(locks.backendName).toBeUndefined(); // loaded on first use
    await holder.acquire('k', { ttlMs: 10_000 });
    expect(await locks.tryAcquire('k')).toBeNull();
    expect(locks.backendName).toBe('memory');
    await expect(locks.acquire('k', { waitMs: 30 })).rejects.toBeInstanceOf(AcquireTimeoutError);
    const controller = new AbortController();
    const waiting = locks.acquire('k', { waitMs: 10_000, signal: controller.signal }).catch((e: unknown) => e);
    setTimeout(() => controller.abort(new Error('user gave up')), 20);
    expect(await waiting).toMatchObject({ message: 'user gave up' });
    await expect(locks.acquire('k', { signal: AbortSignal.abort() })).rejects.toMatchObject({ name: 'AbortError' });
    await locks.acquire('free', { ttlMs: 10_000 });
    const closing = locks.acquire('k', { waitMs: 10_000 }).catch((e: unknown) => e);
    setTimeout(() => void locks.close(), 20);
    expect(await closing).toBeInstanceOf(ClosedError);
    expect(seen).toEqual([
      'busy k',
      'failed k timeout AcquireTimeoutError',
      'failed k aborted Error',
      'failed k aborted AbortError',
      'acquired free',
      'failed k aborted ClosedError',
    ]);
    await holder.close();
  });

  it('a coordinator failure is outcome error', async () => {
    const failing: Backend = { ...memoryBackend(), acquire: async () => Promise.reject(new BackendUnavailableError('test', 'down')) };
    const locks = new Locks({ backend: failing });
    const seen = record(locks);
    await expect(locks.tryAcquire('k')).rejects.toBeInstanceOf(BackendUnavailableError);
    expect(seen).toEqual(['failed k error BackendUnavailableError']);
    await locks.close();
  });
});

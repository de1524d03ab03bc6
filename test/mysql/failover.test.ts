/**
 * Server restart (issue 18, point 4): a client holds auto-renewed leases on a MariaDB of the test's
 * own (./server.ts) that is killed with SIGKILL and started again on the same datadir. While it is
 * down, calls fail with BackendUnavailableError, never a raw driver error and never a hang; renewals
 * are retried within validity, so a lease survives a restart that comes back in time; a server that
 * stays down past the ttl makes the lease's signal abort before the coordinator could grant the key
 * to anyone else (I6); tokens keep rising after the restart (I1: the counter is a committed InnoDB row).
 */
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import type { Backend } from '../../src/core/backend.js';
import { AcquireTimeoutError, BackendUnavailableError, LeaseLostError, type LeaseholdError } from '../../src/core/errors.js';
import { createLocks, type Locks } from '../../src/index.js';
import { mysqlBackend } from '../../src/mysql/index.js';
import { acquireRequest, eventually, uniqueName } from '../helpers/env.js';
import { errorOf, recording, untilAvailable, within } from './faults.js';
import { startMariaDb, type MariaDb } from './server.js';

/** Longer than any bounded call should take on a loaded 2-core machine (core's own bound is 5 s). */
const BOUND_MS = 20_000;

let server: MariaDb | undefined;
const opened: Locks[] = [];

beforeAll(async () => {
  server = await startMariaDb();
}, 120_000);

/** A test that failed half-way may have left the server down: each starts with it running. */
async function running(): Promise<void> {
  if (server && server.pid === undefined) await server.start();
}

beforeEach(running, 60_000);

afterAll(async () => {
  await running().catch(() => {});
  for (const locks of opened) await within(locks.close(), BOUND_MS);
  await server?.destroy();
}, 120_000);

function open(backend: Backend): Locks {
  const locks = createLocks({ backend });
  opened.push(locks);
  return locks;
}

const backendFor = (table: string): Backend => mysqlBackend({ uri: server!.url, table });

describe('mysql: the server is killed and restarted', () => {
  it('down: tryAcquire, acquire and the raw backend calls fail with BackendUnavailableError; back within the ttl: the leases survive and tokens keep rising (I1)', async () => {
    const table = uniqueName('lh_restart');
    const locks = open(backendFor(table));
    const failures: LeaseholdError[] = [];
    locks.on('renewFailed', (e) => failures.push(e.error));
    const renewedAt: number[] = [];
    locks.on('renewed', () => renewedAt.push(performance.now()));

    // Tokens before the crash: a few grants of 'cycled', and two leases held through it.
    const before: bigint[] = [];
    for (let i = 0; i < 5; i++) {
      const l = await locks.acquire('cycled', { ttlMs: 10_000 });
      before.push(l.token);
      await l.release();
    }
    const held = [await locks.acquire('held-a', { ttlMs: 10_000 }), await locks.acquire('held-b', { ttlMs: 10_000 })];
    const raw = backendFor(table);

    await server!.kill();
    const tried = await within(locks.tryAcquire('while-down', { ttlMs: 5_000 }), BOUND_MS);
    expect(errorOf(tried, 'tryAcquire while down')).toBeInstanceOf(BackendUnavailableError);
    // While waiting, core retries within waitMs; it ends with the backend's error, or as a timeout
    // caused by it when the last retry's pause ran past the deadline (core's rule, either way typed).
    const waited = errorOf(await within(locks.acquire('while-down', { ttlMs: 5_000, waitMs: 1_000 }), BOUND_MS), 'acquire while down');
    const unavailable = waited instanceof AcquireTimeoutError ? waited.cause : waited;
    expect(unavailable, String(waited)).toBeInstanceOf(BackendUnavailableError);
    // The backend itself (not only core's guard around it) answers with typed errors, and does not hang.
    const calls: [string, () => Promise<unknown>][] = [
      ['acquire', () => raw.acquire(acquireRequest('raw', 'o1'))],
      ['renew', () => raw.renew({ key: 'held-a', owner: 'nobody', token: held[0]!.token, mode: 'exclusive', ttlMs: 10_000 })],
      ['release', () => raw.release({ key: 'held-a', owner: 'nobody', token: held[0]!.token, mode: 'exclusive' })],
      ['inspect', () => raw.inspect('')],
    ];
    for (const [name, call] of calls)
      expect(errorOf(await within(call(), BOUND_MS), `backend.${name} while down`), name).toBeInstanceOf(BackendUnavailableError);

    // A renewal (due every ~3.3 s) fails while the server is down and is retried; then it comes back.
    expect(await eventually(() => failures.length > 0, 8_000, 20)).toBe(true);
    const restartedAt = performance.now();
    await server!.start();
    expect(await eventually(() => renewedAt.filter((t) => t > restartedAt).length >= 2, 15_000, 20)).toBe(true);
    for (const lease of held) {
      expect(lease.signal.aborted, lease.key).toBe(false);
      expect(lease.held, lease.key).toBe(true);
    }
    expect(failures.every((e) => e instanceof BackendUnavailableError)).toBe(true);

    // I1 after the restart: every grant exceeds every grant before it.
    const highest = before.reduce((m, t) => (t > m ? t : m), 0n);
    const again = (await untilAvailable(() => locks.acquire('cycled', { ttlMs: 10_000 }))).value;
    expect(again.token).toBeGreaterThan(highest);
    await again.release();
    for (const lease of held) {
      const old = lease.token;
      await lease.release();
      const next = await locks.acquire(lease.key, { ttlMs: 10_000, waitMs: 5_000 });
      expect(next.token, lease.key).toBeGreaterThan(old);
      await next.release();
    }
    // The raw backend, whose pool lost its connections, works again too.
    const grant = (await untilAvailable(() => raw.acquire(acquireRequest('raw', 'o2')))).value;
    expect(grant.granted).toBe(true);
    await raw.close();
  }, 90_000);

  it('down past the ttl: the signal aborts before the coordinator could grant the key to anyone else (I6); after the restart the key is granted with a higher token', async () => {
    const table = uniqueName('lh_loss');
    const { backend, lastKeptAt } = recording(backendFor(table));
    const locks = open(backend);
    const failures: { error: LeaseholdError; remainingMs: number }[] = [];
    locks.on('renewFailed', (e) => failures.push(e));
    const ttlMs = 1_500;
    const lease = await locks.acquire('lost', { ttlMs });
    let abortedAt = Number.NaN;
    lease.signal.addEventListener('abort', () => (abortedAt = performance.now()));

    await server!.kill();
    expect(await eventually(() => lease.signal.aborted, ttlMs + 5_000, 5)).toBe(true);
    // On the client's clock, before the earliest moment the server could have let the lease go.
    expect(abortedAt).toBeLessThanOrEqual(lastKeptAt() + ttlMs);
    const reason = lease.signal.reason as LeaseLostError;
    expect(reason).toBeInstanceOf(LeaseLostError);
    expect(reason.reason).toBe('expired');
    expect(failures.length).toBeGreaterThan(0); // retried within validity, not given up at the first failure
    expect(failures.every((f) => f.error instanceof BackendUnavailableError && f.remainingMs >= 0)).toBe(true);
    expect(lease.held).toBe(false);
    expect(await within(lease.release(), BOUND_MS)).toEqual({ value: undefined }); // quiet after a loss, even while down
    expect(errorOf(await within(lease.renew(), BOUND_MS), 'renew after loss')).toBeInstanceOf(LeaseLostError);

    await server!.start();
    const other = open(backendFor(table));
    const next = (await untilAvailable(() => other.acquire('lost', { ttlMs: 10_000, waitMs: 10_000 }))).value;
    expect(next.token).toBeGreaterThan(lease.token);
    await next.release();
  }, 90_000);

  it('a backend first used while the server is down fails with BackendUnavailableError, then works once it is back (a failed schema check is not remembered)', async () => {
    const table = uniqueName('lh_cold');
    const locks = open(backendFor(table));
    await server!.kill();
    const tried = await within(locks.tryAcquire('cold', { ttlMs: 5_000 }), BOUND_MS);
    expect(errorOf(tried, 'first tryAcquire while down')).toBeInstanceOf(BackendUnavailableError);
    await server!.start();
    const lease = (await untilAvailable(() => locks.acquire('cold', { ttlMs: 5_000, waitMs: 1_000 }))).value;
    expect(lease.token).toBeGreaterThan(0n);
    await lease.release();
  }, 90_000);

  it('a clean shutdown and restart (SIGTERM) while a lease is held: the lease survives, its token is not granted again', async () => {
    const table = uniqueName('lh_clean');
    const locks = open(backendFor(table));
    const lease = await locks.acquire('clean', { ttlMs: 10_000 });
    await server!.restart('clean');
    const busy = (await untilAvailable(() => locks.tryAcquire('clean', { ttlMs: 5_000 }))).value;
    expect(busy).toBeNull(); // still held after the restart: the holder row is durable
    await untilAvailable(() => lease.renew());
    expect(lease.held).toBe(true);
    const old = lease.token;
    await lease.release();
    const next = await locks.acquire('clean', { ttlMs: 5_000, waitMs: 5_000 });
    expect(next.token).toBeGreaterThan(old);
    await next.release();
  }, 90_000);
});

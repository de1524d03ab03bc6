/**
 * A frozen server (issue 18, point 4): mariadbd stopped with SIGSTOP keeps its sockets (the kernel
 * accepts connections and acknowledges bytes) and answers nothing. Calls fail with a typed error
 * within their bound instead of hanging, through core and from the backend itself; a freeze shorter
 * than the lease's validity costs nothing; close() returns within a bound and leaves no socket
 * behind; after SIGCONT the backend works again.
 *
 * On a MariaDB of the test's own (./server.ts); the backend logs in as a user of its own so that
 * its connections can be counted in PROCESSLIST.
 */
import mysql from 'mysql2/promise';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AcquireTimeoutError, BackendUnavailableError, type LeaseholdError } from '../../src/core/errors.js';
import { createLocks } from '../../src/index.js';
import { mysqlBackend } from '../../src/mysql/index.js';
import { acquireRequest, eventually, uniqueName } from '../helpers/env.js';
import { connectionIds, errorOf, untilAvailable, within } from './faults.js';
import { startMariaDb, type MariaDb } from './server.js';

const BACKEND_USER = 'lh_frozen';
/** Core's bound on each coordinator call in these tests. */
const OPERATION_TIMEOUT_MS = 2_000;
/**
 * How long the backend itself may take to give up on a server that does not answer (its own
 * connect and statement timeouts, without core's bound around it): generous, the point is "not forever".
 */
const BACKEND_BOUND_MS = 30_000;

let server: MariaDb | undefined;
let admin: mysql.Pool | undefined;
let backendUrl = '';

beforeAll(async () => {
  server = await startMariaDb();
  backendUrl = await server.addUser(BACKEND_USER);
  admin = mysql.createPool({ uri: server.url, connectionLimit: 1 });
}, 120_000);

afterAll(async () => {
  server?.thaw();
  await admin?.end().catch(() => {});
  await server?.destroy();
}, 120_000);

function tcpHandles(): number {
  return process.getActiveResourcesInfo().filter((r) => r === 'TCPWrap' || r === 'TCPSocketWrap').length;
}

describe('mysql: a frozen server (SIGSTOP)', () => {
  it('calls fail typed within their bound, a freeze shorter than the validity keeps the lease, and after SIGCONT the backend works again', async () => {
    const backend = mysqlBackend({ uri: backendUrl, table: uniqueName('lh_frozen') });
    const locks = createLocks({ backend, operationTimeoutMs: OPERATION_TIMEOUT_MS });
    const failures: LeaseholdError[] = [];
    locks.on('renewFailed', (e) => failures.push(e.error));
    const renewedAt: number[] = [];
    locks.on('renewed', () => renewedAt.push(performance.now()));
    // A second backend, used only while frozen: its first call needs a new connection (connect timeout).
    const cold = mysqlBackend({ uri: backendUrl, table: uniqueName('lh_cold') });
    try {
      const lease = await locks.acquire('held', { ttlMs: 9_000 });
      server!.freeze();
      try {
        const tried = await within(locks.tryAcquire('other', { ttlMs: 5_000 }), OPERATION_TIMEOUT_MS + 10_000);
        expect(errorOf(tried, 'tryAcquire while frozen')).toBeInstanceOf(BackendUnavailableError);
        const waited = await within(locks.acquire('other', { ttlMs: 5_000, waitMs: 1_000 }), OPERATION_TIMEOUT_MS + 10_000);
        const waitError = errorOf(waited, 'acquire while frozen');
        expect(waitError instanceof AcquireTimeoutError || waitError instanceof BackendUnavailableError, String(waitError)).toBe(true);
        // A renewal (every 3 s) has failed and is being retried; the lease is still valid.
        expect(await eventually(() => failures.length > 0, 6_000, 20)).toBe(true);
        expect(lease.signal.aborted).toBe(false);
      } finally {
        server!.thaw();
      }
      const thawedAt = performance.now();
      expect(await eventually(() => renewedAt.some((t) => t > thawedAt), 8_000, 20)).toBe(true);
      expect(lease.held).toBe(true);
      expect(lease.signal.aborted).toBe(false);
      expect(failures.every((e) => e instanceof BackendUnavailableError)).toBe(true);
      await untilAvailable(() => lease.release());

      // Without core's bound: the backend's own calls give up too (on a pooled connection, and on a new one).
      server!.freeze();
      try {
        const [pooled, fresh] = await Promise.all([
          within(backend.acquire(acquireRequest('raw', 'o1')), BACKEND_BOUND_MS),
          within(cold.acquire(acquireRequest('raw', 'o2')), BACKEND_BOUND_MS),
        ]);
        expect(errorOf(pooled, 'backend.acquire on a pooled connection while frozen')).toBeInstanceOf(BackendUnavailableError);
        expect(errorOf(fresh, 'backend.acquire on a new connection while frozen')).toBeInstanceOf(BackendUnavailableError);
      } finally {
        server!.thaw();
      }
      // Everything works again, the backend's own calls included.
      const other = (await untilAvailable(() => locks.acquire('other', { ttlMs: 5_000, waitMs: 5_000 }))).value;
      expect(other.token).toBeGreaterThan(0n);
      await other.release();
      expect((await untilAvailable(() => cold.acquire(acquireRequest('raw-2', 'o3')))).value.granted).toBe(true);
    } finally {
      server!.thaw();
      await within(locks.close(), 20_000);
      await within(cold.close(), 20_000);
    }
  }, 120_000);

  it('close() with a lease held and a waiter given up returns within a bound while frozen, and leaves no socket behind', async () => {
    const before = tcpHandles();
    const locks = createLocks({ backend: mysqlBackend({ uri: backendUrl, table: uniqueName('lh_close') }) });
    try {
      const lease = await locks.acquire('frozen-close', { ttlMs: 10_000 });
      const waited = await locks.acquire('frozen-close', { ttlMs: 10_000, waitMs: 300 }).catch((e: unknown) => e);
      expect((waited as { code?: string }).code).toBe('ACQUIRE_TIMEOUT');
      expect(lease.held).toBe(true);
      server!.freeze();
      const closed = await within(locks.close(), 20_000);
      expect(closed).not.toBe('hung');
      // Still frozen: every socket of ours is closed (none left waiting for the server's goodbye).
      expect(await eventually(() => tcpHandles() <= before, 15_000, 50)).toBe(true);
    } finally {
      server!.thaw();
    }
    // The server, running again, sees none of the backend's connections left.
    expect(await eventually(async () => (await connectionIds(admin!, BACKEND_USER)).length === 0, 15_000, 100)).toBe(true);
  }, 120_000);
});

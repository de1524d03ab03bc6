/**
 * The lock service is stateless, seen from its client: two servers over one PostgreSQL (and over
 * one Redis), each with its own connections as two processes would have, serve one set of leases —
 * an httpBackend waiter long-polling server 2 is woken by a release made through server 1, with no
 * polling of its own; and a server closed and started again on the same port while a client holds
 * session leases loses the client nothing (its keep-alives go through the new process).
 */
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import type { Backend } from '../../src/core/backend.js';
import type { LockEvents } from '../../src/core/events.js';
import { Locks } from '../../src/core/locks.js';
import { httpBackend } from '../../src/http/index.js';
import { postgresBackend } from '../../src/postgres/index.js';
import { redisBackend } from '../../src/redis/index.js';
import { type RunningLockServer, startLockServer } from '../../src/serve/index.js';
import { eventually, PG_URL, sleep, uniqueName } from '../helpers/env.js';
import { deleteKeys, REDIS_URL } from '../redis/servers.js';

/** Counts a client's acquire calls (its public surface). */
function countingAcquires(backend: Backend): { backend: Backend; acquires: () => number } {
  let n = 0;
  const wrapped = Object.create(backend) as Backend;
  Object.defineProperty(wrapped, 'acquire', { value: (req: Parameters<Backend['acquire']>[0]) => (n++, backend.acquire(req)) });
  return { backend: wrapped, acquires: () => n };
}

const schema = uniqueName('lh_http_scale');
const redisPrefix = `${uniqueName('lhhttpscale')}:`;
afterAll(async () => {
  const admin = new pg.Client({ connectionString: PG_URL });
  await admin.connect();
  try {
    await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
  } finally {
    await admin.end();
  }
  await deleteKeys(REDIS_URL, redisPrefix);
});

const coordinators: [string, () => Backend][] = [
  ['PostgreSQL', () => postgresBackend({ connectionString: PG_URL, schema, poolSize: 4 })],
  ['Redis', () => redisBackend({ url: REDIS_URL, prefix: redisPrefix })],
];

describe.each(coordinators)('two lock servers over one %s', (_name, open) => {
  it('a waiter long-polling server 2 is woken by a release made through server 1', async () => {
    const backends = [open(), open()];
    const servers = await Promise.all(backends.map((backend) => startLockServer({ backend, port: 0 })));
    const one = new Locks({ backend: httpBackend({ url: servers[0]!.url }) });
    const probe = countingAcquires(httpBackend({ url: servers[1]!.url }));
    const two = new Locks({ backend: probe.backend });
    try {
      const key = uniqueName('handoff');
      const held = await one.acquire(key, { ttlMs: 30_000 });
      const waiting = two.acquire(key, { ttlMs: 30_000, waitMs: 30_000 });
      await eventually(async () => (await one.inspect(key))[0]?.waiters === 1, 10_000); // queued at the shared coordinator
      await held.release();
      const lease = await waiting;
      expect(lease.token).toBeGreaterThan(held.token);
      expect(probe.acquires()).toBe(1); // one long poll, woken through the coordinator's notifications
      await lease.release();
    } finally {
      await Promise.allSettled([one.close(), two.close()]);
      await Promise.allSettled(servers.map((s) => s.close()));
      await Promise.allSettled(backends.map((b) => b.close()));
    }
  });
});

describe('a lock server restarted on the same port', () => {
  it('loses nothing of a client holding session leases: its keep-alives go through the new process', async () => {
    let backend = postgresBackend({ connectionString: PG_URL, schema, poolSize: 4 });
    let server: RunningLockServer = await startLockServer({ backend, port: 0 });
    const port = Number(new URL(server.url).port);
    const locks = new Locks({ backend: httpBackend({ url: server.url }) });
    const lost: LockEvents['lost'][] = [];
    let renewedAfterRestart = 0;
    let restarted = false;
    locks.on('lost', (e) => lost.push(e));
    let sessionRenewals = 0;
    locks.on('renewed', (e) => {
      if (restarted) renewedAfterRestart++;
      if (e.leases === 3) sessionRenewals++; // one keep-alive renewed all three: they live by a session
    });
    try {
      const base = uniqueName('restart');
      const leases = await Promise.all([0, 1, 2].map((i) => locks.acquire(`${base}/${i}`, { ttlMs: 3_000 })));
      // the process goes away (its connections with it), and a new one starts on the same address
      await server.close();
      await backend.close();
      await sleep(300);
      backend = postgresBackend({ connectionString: PG_URL, schema, poolSize: 4 });
      server = await startLockServer({ backend, port });
      restarted = true;
      await sleep(4_000); // longer than the ttl: only keep-alives through the new server keep them
      expect(lost).toEqual([]);
      expect(leases.every((l) => l.held)).toBe(true);
      expect(renewedAfterRestart).toBeGreaterThan(0);
      expect(sessionRenewals).toBeGreaterThan(0);
      const other = new Locks({ backend: httpBackend({ url: server.url }) });
      expect(await other.tryAcquire(`${base}/0`, { ttlMs: 1_000 })).toBeNull(); // still held, as the coordinator sees it
      await Promise.all(leases.map((l) => l.release()));
      expect(await other.tryAcquire(`${base}/0`, { ttlMs: 1_000 })).not.toBeNull();
      await other.close();
    } finally {
      await locks.close();
      await server.close();
      await backend.close();
    }
  });
});

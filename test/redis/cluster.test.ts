/**
 * Redis Cluster: a one-node cluster (all 16384 slots on one cluster-enabled redis-server) enforces
 * the same slot rules as a big one — a script whose keys hash to different slots fails with
 * CROSSSLOT — and is reached through ioredis's Cluster client.
 */
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Cluster, Redis } from 'ioredis';
import { InvalidArgumentError } from '../../src/core/errors.js';
import { Locks } from '../../src/core/locks.js';
import { redisBackend } from '../../src/redis/index.js';
import { eventually, tempDir } from '../helpers/env.js';
import { startRedis, stopAll, type RedisServer } from './servers.js';

let server: RedisServer;
let dir: { path: string; cleanup: () => void };
let cluster: Cluster;

beforeAll(async () => {
  dir = tempDir('leasehold-cluster-');
  server = await startRedis(['--cluster-enabled', 'yes', '--cluster-config-file', join(dir.path, 'nodes.conf'), '--cluster-announce-ip', '127.0.0.1']);
  const admin = new Redis(server.url);
  await admin.call('CLUSTER', 'ADDSLOTSRANGE', '0', '16383');
  await eventually(async () => /cluster_state:ok/.test(String(await admin.call('CLUSTER', 'INFO'))), 10_000, 100);
  admin.disconnect();
  cluster = new Cluster([{ host: '127.0.0.1', port: server.port }]);
  cluster.on('error', () => {});
  await eventually(() => cluster.status === 'ready', 10_000);
});
afterAll(async () => {
  cluster?.disconnect();
  await stopAll();
  dir?.cleanup();
});

describe('redis on a Redis Cluster', () => {
  it('every key of a lock shares a slot: grants, hand-offs, lock-delay and inspect work through a Cluster client', async () => {
    const backend = redisBackend({ client: cluster });
    expect(backend.sessions).toBeUndefined(); // sessions are off on a Cluster client
    const a = new Locks({ backend });
    const b = new Locks({ backend: redisBackend({ client: cluster }) });
    try {
      for (const key of ['plain', 'with}brace', '{tag}x', '100%']) {
        const lease = await a.acquire(key, { ttlMs: 5_000 });
        const waiting = b.acquire(key, { ttlMs: 5_000, waitMs: 5_000 });
        await eventually(async () => (await a.inspect(key)).find((s) => s.key === key)?.waiters === 1, 5_000);
        const [state] = (await a.inspect(key)).filter((s) => s.key === key);
        expect(state?.holders[0]?.token).toBe(lease.token);
        await lease.release();
        const next = await waiting;
        expect(next.token).toBeGreaterThan(lease.token);
        await next.release();
      }
    } finally {
      await a.close();
      await b.close();
      expect(cluster.status).toBe('ready'); // the user's client stays open
    }
  });

  it('sessions forced on over a cluster fail with a typed error naming the option', async () => {
    const locks = new Locks({ backend: redisBackend({ client: cluster, sessions: true }) });
    try {
      const e = await locks.acquire('cross', { ttlMs: 5_000 }).catch((x: unknown) => x);
      expect(e).toBeInstanceOf(InvalidArgumentError);
      expect((e as InvalidArgumentError).argument).toBe('options.sessions');
    } finally {
      await locks.close();
    }
  });
});

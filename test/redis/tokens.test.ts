/**
 * I1 when Redis loses its data: a real redis-server without persistence is killed (-9) and
 * restarted empty, and a replica that missed the last writes is promoted. The next token is still
 * larger (the grant floors it by the server's TIME in µs).
 */
import { afterAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { Locks } from '../../src/core/locks.js';
import type { LeaseLostError } from '../../src/core/errors.js';
import { redisBackend } from '../../src/redis/index.js';
import { eventually } from '../helpers/env.js';
import { startRedis, stopAll } from './servers.js';

afterAll(stopAll);

const request = (key: string, owner: string) => ({
  key,
  owner,
  mode: 'exclusive' as const,
  ttlMs: 5_000,
  lockDelayMs: 0,
  holder: 'test',
  queue: false,
  queueTtlMs: 2_000,
});

describe('redis tokens survive data loss', () => {
  it('kill -9 and restart empty: the next token is still greater', async () => {
    const server = await startRedis();
    const backend = redisBackend({ url: server.url });
    try {
      const tokens: bigint[] = [];
      for (let i = 0; i < 3; i++) {
        const g = await backend.acquire(request('job', `o${i}`));
        expect(g.granted).toBe(true);
        if (g.granted) tokens.push(g.token);
        await backend.release({ key: 'job', owner: `o${i}`, token: tokens[i]!, mode: 'exclusive' });
      }
      await server.kill('SIGKILL');
      await server.start();
      const probe = new Redis(server.url);
      expect(await probe.dbsize()).toBe(0); // really empty
      probe.disconnect();
      const after = await eventually(async () => (await backend.acquire(request('job', 'after')).catch(() => undefined))?.granted === true, 10_000, 50);
      expect(after).toBe(true);
      const [state] = await backend.inspect('job');
      expect(state!.holders[0]!.token).toBeGreaterThan(tokens[2]!);
      expect(tokens[1]!).toBeGreaterThan(tokens[0]!);
    } finally {
      await backend.close();
      await server.kill();
    }
  });

  it('storage layout: a failover to a replica that missed the last writes (the lock hash deleted): the next token is still greater', async () => {
    const primary = await startRedis(['--repl-diskless-sync-delay', '0']);
    const replica = await startRedis(['--replicaof', '127.0.0.1', '0']);
    const admin = new Redis(replica.url);
    const onPrimary = redisBackend({ url: primary.url });
    const onReplica = redisBackend({ url: replica.url });
    try {
      await admin.replicaof('127.0.0.1', primary.port);
      const g1 = await onPrimary.acquire(request('acct', 'a'));
      if (!g1.granted) throw new Error('not granted');
      await onPrimary.release({ key: 'acct', owner: 'a', token: g1.token, mode: 'exclusive' });
      expect(await eventually(async () => (await admin.exists('leasehold:{acct}')) === 1, 5_000)).toBe(true);
      // The replica stops following, then the primary grants twice more: writes the replica never sees.
      await admin.replicaof('NO', 'ONE');
      let last = g1.token;
      for (const owner of ['b', 'c']) {
        const g = await onPrimary.acquire(request('acct', owner));
        if (!g.granted) throw new Error('not granted');
        last = g.token;
        await onPrimary.release({ key: 'acct', owner, token: g.token, mode: 'exclusive' });
      }
      expect(last).toBeGreaterThan(g1.token);
      // Failover: clients now talk to the replica, whose counter is behind.
      const g4 = await onReplica.acquire(request('acct', 'd'));
      if (!g4.granted) throw new Error('not granted');
      expect(g4.token).toBeGreaterThan(last);
    } finally {
      admin.disconnect();
      await Promise.all([onPrimary.close(), onReplica.close()]);
      await Promise.all([primary.kill(), replica.kill()]);
    }
  });

  it('a lease held through the restart is signalled lost (its session is gone), and the client recovers', async () => {
    const server = await startRedis();
    const locks = new Locks({ backend: redisBackend({ url: server.url }) });
    try {
      const lease = await locks.acquire('held', { ttlMs: 600 });
      await server.kill('SIGKILL');
      await server.start();
      expect(await eventually(() => lease.signal.aborted, 5_000)).toBe(true);
      expect(['session-lost', 'expired']).toContain((lease.signal.reason as LeaseLostError).reason);
      const again = await locks.acquire('held', { ttlMs: 600, waitMs: 5_000 });
      expect(again.token).toBeGreaterThan(lease.token);
    } finally {
      await locks.close();
      await server.kill();
    }
  });
});

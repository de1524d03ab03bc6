/**
 * Sessions: one renewal command per client per interval, whatever the number of leases, counted
 * by the server itself (INFO commandstats) on a redis-server of our own.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { Locks } from '../../src/core/locks.js';
import type { LeaseLostError } from '../../src/core/errors.js';
import { redisBackend } from '../../src/redis/index.js';
import { eventually, sleep } from '../helpers/env.js';
import { commandStats, delta, scriptCalls, startRedis, stopAll } from './servers.js';

afterAll(stopAll);

describe('redis sessions', () => {
  it('a client holding 10,000 leases sends one renewal command per interval', async () => {
    const server = await startRedis();
    const admin = new Redis(server.url);
    const locks = new Locks({ backend: redisBackend({ url: server.url }) });
    try {
      const ttlMs = 3_000;
      const leases = [];
      for (let i = 0; i < 10_000; i += 500) {
        leases.push(...(await Promise.all(Array.from({ length: 500 }, (_, j) => locks.acquire(`bulk/${i + j}`, { ttlMs })))));
      }
      expect(leases).toHaveLength(10_000);
      const before = await commandStats(admin);
      await sleep(2 * ttlMs); // ~6 renewal intervals of ttl/3
      const d = delta(before, await commandStats(admin));
      // Operations run through FCALL (or EVALSHA); every renewal is one call. `info` is our own probe.
      const calls = scriptCalls(d);
      expect(calls).toBeGreaterThanOrEqual(4);
      expect(calls).toBeLessThanOrEqual(12); // ≈ 6 keep-alives, not 60,000 renewals
      expect(d.pexpire ?? 0).toBe(0);
      expect(leases.every((l) => l.held)).toBe(true);
      expect(await admin.dbsize()).toBeGreaterThanOrEqual(10_000);
    } finally {
      await locks.close();
      admin.disconnect();
      await server.kill();
    }
  });

  it('storage layout: losing the session (its key deleted) aborts the signal of every lease of the client', async () => {
    const server = await startRedis();
    const admin = new Redis(server.url);
    const locks = new Locks({ backend: redisBackend({ url: server.url }) });
    try {
      const leases = await Promise.all(Array.from({ length: 20 }, (_, i) => locks.acquire(`s/${i}`, { ttlMs: 900 })));
      const sessionKeys = await admin.keys('leasehold:session:*');
      expect(sessionKeys).toHaveLength(1);
      await admin.del(sessionKeys[0]!); // an operator (or a data loss) ends the session
      expect(await eventually(() => leases.every((l) => l.signal.aborted), 3_000)).toBe(true);
      for (const l of leases) expect((l.signal.reason as LeaseLostError).reason).toBe('session-lost');
      // every lock bound to it is free at once
      const other = new Locks({ backend: redisBackend({ url: server.url }) });
      expect(await other.tryAcquire('s/3', { ttlMs: 900 })).not.toBeNull();
      await other.close();
    } finally {
      await locks.close();
      admin.disconnect();
      await server.kill();
    }
  });

  it('a crashed client: its session-bound leases become free when the session expires, with lock-delay', async () => {
    const server = await startRedis();
    const crashed = redisBackend({ url: server.url });
    const locks = new Locks({ backend: redisBackend({ url: server.url }) });
    try {
      const session = await crashed.sessions!.open(300);
      const g = await crashed.acquire({
        key: 'c',
        owner: 'crasher',
        mode: 'exclusive',
        ttlMs: 300,
        lockDelayMs: 400,
        holder: 'crasher',
        queue: false,
        queueTtlMs: 2_000,
        session: session.id,
      });
      expect(g.granted).toBe(true);
      await crashed.close(); // no keep-alive from now on
      expect(await locks.tryAcquire('c', { ttlMs: 300 })).toBeNull();
      await sleep(450); // session expired; lock-delay runs until ~700 ms
      const [state] = await locks.inspect('c');
      expect(state?.holders).toEqual([]);
      expect(state?.lockDelayRemainingMs).toBeGreaterThan(0);
      const lease = await locks.acquire('c', { ttlMs: 300, waitMs: 3_000 });
      expect(lease.token).toBeGreaterThan(g.granted ? g.token : 0n);
    } finally {
      await locks.close();
      await server.kill();
    }
  });
});

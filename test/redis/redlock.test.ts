/**
 * Redlock against three real redis-servers of our own: one killed, one restarted empty, tokens
 * still increasing; concurrent grants still get distinct tokens; and when servers lose a lock
 * (so two clients hold it at once), the fence still refuses the older holder. Then failures with
 * servers of each test's own: a majority down or frozen, a quorum that answers after the validity
 * is used up, a holder re-recorded on servers that restarted empty (lock-delay kept), scripts
 * flushed from the servers.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { createClient } from 'redis';
import type { Backend } from '../../src/core/backend.js';
import { BackendUnavailableError, StaleTokenError } from '../../src/core/errors.js';
import { Locks } from '../../src/core/locks.js';
import { memoryFence } from '../../src/memory/index.js';
import { redlockBackend } from '../../src/redis/index.js';
import { acquireRequest, eventually, sleep } from '../helpers/env.js';
import { commandStats, delta, startRedis, stopAll, type RedisServer } from './servers.js';

let servers: RedisServer[];
const clients: Locks[] = [];
const client = (): Locks => {
  const l = new Locks({ backend: redlockBackend({ urls: servers.map((s) => s.url) }) });
  clients.push(l);
  return l;
};

beforeAll(async () => {
  servers = await Promise.all([startRedis(), startRedis(), startRedis()]);
});
afterAll(async () => {
  await Promise.allSettled(clients.map((c) => c.close()));
  await stopAll();
});

describe('redlock', () => {
  it('one server killed and another restarted empty: grants go on, tokens keep increasing, a held lease survives', async () => {
    const a = client();
    const b = client();
    const t1 = await a.withLock('k', { ttlMs: 2_000 }, (l) => l.token);
    await servers[0]!.kill('SIGKILL'); // stays down
    const held = await a.acquire('k', { ttlMs: 900 });
    expect(held.token).toBeGreaterThan(t1);
    expect(await b.tryAcquire('k', { ttlMs: 900 })).toBeNull(); // 2 of 3 still exclude
    await servers[1]!.kill('SIGKILL');
    await servers[1]!.start(); // empty: only servers[2] remembers the lease and the counter
    await sleep(1_500); // renewals (every 300 ms) need a majority: servers[2] plus servers[1], taken again
    expect(held.signal.aborted).toBe(false);
    expect(await b.tryAcquire('k', { ttlMs: 900 })).toBeNull();
    await held.release();
    const t3 = await b.withLock('k', { ttlMs: 2_000 }, (l) => l.token);
    expect(t3).toBeGreaterThan(held.token);
    await servers[0]!.start();
    const t4 = await a.withLock('k', { ttlMs: 2_000 }, (l) => l.token);
    expect(t4).toBeGreaterThan(t3);
  });

  it('concurrent grants never share a token (shared holders commit their tokens at the same time)', async () => {
    const workers = Array.from({ length: 6 }, () => client());
    const leases = await Promise.all(workers.flatMap((w) => [0, 1, 2].map(() => w.acquire('shared', { ttlMs: 5_000, mode: 'shared', waitMs: 10_000 }))));
    const tokens = leases.map((l) => l.token);
    expect(new Set(tokens).size).toBe(tokens.length);
    await Promise.all(leases.map((l) => l.release()));
  });

  it('when servers lose a lock, two clients can hold it at once; the fence refuses the older one', async () => {
    const a = client();
    const b = client();
    const old = await a.acquire('lost', { ttlMs: 5_000 });
    // Two of the three servers lose the lock (a restart without persistence, an operator, a clock jump).
    for (const s of servers.slice(1)) {
      const r = new Redis(s.url);
      await r.del('leasehold:{lost}', 'leasehold:{lost}:h');
      r.disconnect();
    }
    const newer = await b.acquire('lost', { ttlMs: 5_000 });
    expect(old.held && newer.held).toBe(true); // Redlock's known limit: both believe they hold it
    expect(newer.token).toBeGreaterThan(old.token);
    const fence = memoryFence();
    await fence.write('doc', newer.token, () => {});
    await expect(fence.write('doc', old.token, () => {})).rejects.toBeInstanceOf(StaleTokenError);
    await old.release();
    await newer.release();
  });

  it('a frozen server (SIGSTOP) counts as failed: grants go on without it', async () => {
    const a = client();
    servers[2]!.pause();
    try {
      const lease = await a.acquire('frozen', { ttlMs: 3_000, waitMs: 5_000 });
      expect(lease.token).toBeGreaterThan(0n);
      await lease.release();
    } finally {
      servers[2]!.resume();
    }
  });
});

const req = acquireRequest;

/** Three servers of the test's own, an admin connection to each, killed and closed by `done`. */
async function trio(): Promise<{ servers: RedisServer[]; admins: Redis[]; done: () => Promise<void> }> {
  const own = await Promise.all([startRedis(), startRedis(), startRedis()]);
  const admins = own.map((s) => {
    const r = new Redis(s.url, { retryStrategy: () => 50 });
    r.on('error', () => {});
    return r;
  });
  return {
    servers: own,
    admins,
    done: async () => {
      for (const a of admins) a.disconnect();
      await Promise.all(own.map((s) => s.kill()));
    },
  };
}

describe('redlock failures', () => {
  it('a majority of servers down: acquire fails with BackendUnavailableError, promptly, killed or frozen', async () => {
    const { servers: own, done } = await trio();
    const locks = new Locks({ backend: redlockBackend({ urls: own.map((s) => s.url), commandTimeoutMs: 300 }) });
    try {
      await (await locks.acquire('warm', { ttlMs: 2_000 })).release(); // connected to all three
      await own[0]!.kill();
      await own[1]!.kill();
      let started = performance.now();
      await expect(locks.tryAcquire('k', { ttlMs: 2_000 })).rejects.toBeInstanceOf(BackendUnavailableError);
      await expect(locks.acquire('k', { ttlMs: 2_000, waitMs: 1_000 })).rejects.toBeInstanceOf(BackendUnavailableError);
      expect(performance.now() - started).toBeLessThan(10_000); // not a hang (1 s of waitMs, retried)

      await own[0]!.start();
      await own[1]!.start();
      own[0]!.pause(); // frozen: connections stay open, nothing answers
      own[1]!.pause();
      started = performance.now();
      await expect(locks.acquire('k', { ttlMs: 2_000, waitMs: 1_000 })).rejects.toBeInstanceOf(BackendUnavailableError);
      expect(performance.now() - started).toBeLessThan(10_000);
    } finally {
      own[0]!.resume();
      own[1]!.resume();
      await locks.close();
      await done();
    }
  });

  it('a quorum that answers after the validity is used up: nothing is handed out, and what was recorded is released', async () => {
    const { servers: own, admins, done } = await trio();
    const backend = redlockBackend({ urls: own.map((s) => s.url), commandTimeoutMs: 5_000 });
    const other = redlockBackend({ urls: own.map((s) => s.url) });
    try {
      await backend.release({ key: 'warm', owner: 'w', token: 0n, mode: 'exclusive' }); // connected to all three
      // Two of three frozen for longer than the ttl: the quorum's answers come 1 s after the request.
      own[1]!.pause();
      own[2]!.pause();
      setTimeout(() => {
        own[1]!.resume();
        own[2]!.resume();
      }, 1_000);
      const started = performance.now();
      // lock-delay tells a release from an expiry: an expired record would keep the key 20 s
      const result = await backend.acquire(req('late', 'late-owner', { ttlMs: 200, lockDelayMs: 20_000 }));
      expect(performance.now() - started).toBeGreaterThan(200);
      expect(result.granted).toBe(false);
      // Given back on the two servers where the record was still live (on the first it had expired: its lock-delay runs there, a minority).
      const holders = async (i: number): Promise<number> => admins[i]!.hlen('leasehold:{late}:h');
      expect(await eventually(async () => (await holders(1)) === 0 && (await holders(2)) === 0, 5_000, 50)).toBe(true);
      expect(await admins[1]!.hget('leasehold:{late}', 'd')).toBeNull();
      expect(await admins[2]!.hget('leasehold:{late}', 'd')).toBeNull();
      const next = await other.acquire(req('late', 'next'));
      expect(next.granted).toBe(true); // a majority is free, no lock-delay: the late grant did not linger
    } finally {
      own[1]!.resume();
      own[2]!.resume();
      await backend.close();
      await other.close();
      await done();
    }
  });

  it('renew re-records the holder identically (lock-delay, label) on servers restarted empty; its expiry keeps the key for lock-delay', async () => {
    const { servers: own, admins, done } = await trio();
    const backend = redlockBackend({ urls: own.map((s) => s.url) });
    const other = redlockBackend({ urls: own.map((s) => s.url) });
    const r = req('ld', 'owner-1', { ttlMs: 3_000, lockDelayMs: 30_000, holder: 'worker-7' });
    try {
      const g = await backend.acquire(r);
      if (!g.granted) throw new Error('not granted');
      // As core sends it: the grant's lock-delay and label ride along with every renewal.
      const renew = { key: 'ld', owner: 'owner-1', token: g.token, mode: 'exclusive' as const, ttlMs: 3_000, lockDelayMs: 30_000, holder: 'worker-7' };
      // The grant returned with a majority; the third server's write may still be landing (seen under CI load).
      await eventually(async () => (await admins[2]!.hget('leasehold:{ld}:h', 'owner-1')) !== null, 5_000, 10);
      const original = await admins[2]!.hget('leasehold:{ld}:h', 'owner-1');
      expect(original).toMatch(/^e\|\d+\|\d+\|30000\|\|worker-7$/);
      // Two of the three restart empty, one after the other; renewals record the lease there again.
      for (const i of [0, 1]) {
        await own[i]!.kill();
        await own[i]!.start();
        let record: string | null = null;
        for (let attempt = 0; attempt < 50 && record === null; attempt++) {
          expect((await backend.renew(renew)).renewed).toBe(true); // a majority renews while one reconnects
          record = await admins[i]!.hget('leasehold:{ld}:h', 'owner-1');
          if (record === null) await sleep(100);
        }
        expect(record).toMatch(new RegExp(`^e\\|${g.token}\\|\\d+\\|30000\\|\\|worker-7$`));
      }
      // Renewals stop without a release (a crashed holder): after the expiry the key stays ungrantable
      // on every server, so on every majority — the two re-recorded servers alone are one.
      await sleep(3_500);
      const refused = await other.acquire(req('ld', 'owner-2'));
      expect(refused.granted).toBe(false);
      expect(refused.granted === false && refused.retryInMs).toBeGreaterThan(10_000);
      own[2]!.pause(); // the server that never restarted out of the way: the two re-recorded ones still refuse
      const stillRefused = await other.acquire(req('ld', 'owner-3')).catch((e: unknown) => e);
      expect(stillRefused).toMatchObject({ granted: false });
      own[2]!.resume();
      const [state] = await other.inspect('ld');
      expect(state?.lockDelayRemainingMs).toBeGreaterThan(10_000);
    } finally {
      own[2]!.resume();
      await backend.close();
      await other.close();
      await done();
    }
  });

  for (const driver of ['ioredis (urls)', 'node-redis (clients)'] as const) {
    it(`${driver}: after SCRIPT FLUSH on every server, EVALSHA falls back to EVAL and operations go on`, async () => {
      const { servers: own, admins, done } = await trio();
      const nodeClients =
        driver === 'node-redis (clients)'
          ? await Promise.all(
              own.map(async (s) => {
                const c = createClient({ url: s.url });
                c.on('error', () => {});
                await c.connect();
                return c;
              }),
            )
          : [];
      const backend: Backend = nodeClients.length > 0 ? redlockBackend({ clients: nodeClients }) : redlockBackend({ urls: own.map((s) => s.url) });
      try {
        const g1 = await backend.acquire(req('flush', 'a'));
        if (!g1.granted) throw new Error('not granted');
        await backend.release({ key: 'flush', owner: 'a', token: g1.token, mode: 'exclusive' });
        await Promise.all(admins.map((a) => a.call('SCRIPT', 'FLUSH')));
        const before = await Promise.all(admins.map((a) => commandStats(a)));
        const g2 = await backend.acquire(req('flush', 'b', { ttlMs: 5_000 }));
        if (!g2.granted) throw new Error('not granted');
        expect(g2.token).toBeGreaterThan(g1.token);
        expect((await backend.renew({ key: 'flush', owner: 'b', token: g2.token, mode: 'exclusive', ttlMs: 5_000 })).renewed).toBe(true);
        await backend.release({ key: 'flush', owner: 'b', token: g2.token, mode: 'exclusive' });
        // Every server answered NOSCRIPT and ran the script through EVAL, which cached it again: each
        // of the four scripts (acquire, commit, renew, release) falls back at most once per server.
        // Under load a call to a server slower than the quorum can time out (the operation went ahead
        // without it), so a server can count fewer than four (and a late call may still be on its way).
        const evals = async (): Promise<number[]> => Promise.all(admins.map(async (a, i) => delta(before[i]!, await commandStats(a)).eval ?? 0));
        expect(await eventually(async () => (await evals()).every((n) => n >= 1), 5_000, 50)).toBe(true);
        for (const n of await evals()) expect(n).toBeLessThanOrEqual(4);
        expect((await evals()).reduce((a, b) => a + b, 0)).toBeGreaterThanOrEqual(8); // at least a quorum (2 of 3) answered each of the four calls
        const g3 = await backend.acquire(req('flush', 'c'));
        expect(g3.granted).toBe(true);
      } finally {
        await backend.close();
        await Promise.allSettled(nodeClients.map((c) => c.close()));
        await done();
      }
    });
  }
});

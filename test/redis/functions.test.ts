/**
 * How the redis backend ships its Lua: one Functions library (FCALL) where the server allows it,
 * scripts (EVALSHA) where it does not, the library loaded again after the server lost it, and
 * concurrent calls batched into one call whose operations fail alone. Counted by the server
 * itself (INFO commandstats) on redis-servers of our own.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { acquireRequest } from '../helpers/env.js';
import { Redis } from 'ioredis';
import { createClient } from 'redis';
import type { Backend } from '../../src/core/backend.js';
import { InvalidArgumentError } from '../../src/core/errors.js';
import { Locks } from '../../src/core/locks.js';
import { BATCH_SIZE } from '../../src/redis/lua/runner.js';
import { redisBackend } from '../../src/redis/index.js';
import { commandStats, delta, scriptCalls, startRedis, stopAll } from './servers.js';

afterAll(stopAll);

const req = acquireRequest;

async function grantAndRelease(backend: Backend, key: string, owner: string): Promise<bigint> {
  const g = await backend.acquire(req(key, owner));
  if (!g.granted) throw new Error(`${key} not granted`);
  await backend.release({ key, owner, token: g.token, mode: 'exclusive' });
  return g.token;
}

/** The backend over each driver: a URL (ioredis, ours) or a node-redis client the user opened (closed by `close`). */
const drivers = [
  { name: 'ioredis (url)', open: async (url: string) => ({ backend: redisBackend({ url }), close: async () => {} }) },
  {
    name: 'node-redis (client)',
    open: async (url: string) => {
      const client = createClient({ url });
      client.on('error', () => {});
      await client.connect();
      return { backend: redisBackend({ client }), close: () => client.close() };
    },
  },
];

describe('redis functions and scripts', () => {
  it('runs through FCALL, and loads the library again after FUNCTION FLUSH and after a restart empty', async () => {
    const server = await startRedis();
    const admin = new Redis(server.url);
    const backend = redisBackend({ url: server.url });
    try {
      const before = await commandStats(admin);
      const t1 = await grantAndRelease(backend, 'f', 'a');
      const d = delta(before, await commandStats(admin));
      expect(d['function|load']).toBe(1); // loaded on first use, once
      expect(d.fcall).toBe(3); // the first call found no function, then acquire and release
      expect(d.evalsha ?? 0).toBe(0);
      const libraries = (await admin.call('FUNCTION', 'LIST')) as unknown[];
      expect(libraries).toHaveLength(1);

      await admin.call('FUNCTION', 'FLUSH');
      const t2 = await grantAndRelease(backend, 'f', 'b');
      expect(t2).toBeGreaterThan(t1);
      expect((await admin.call('FUNCTION', 'LIST')) as unknown[]).toHaveLength(1);

      admin.disconnect();
      await server.kill();
      await server.start();
      let t3: bigint | undefined;
      for (let i = 0; i < 100 && t3 === undefined; i++) {
        t3 = await grantAndRelease(backend, 'f', `c${i}`).catch(async () => {
          await new Promise((r) => setTimeout(r, 50)); // reconnecting
          return undefined;
        });
      }
      expect(t3).toBeGreaterThan(t2);
    } finally {
      admin.disconnect();
      await backend.close();
      await server.kill();
    }
  });

  it('a server without FUNCTION (as Redis 6) gets scripts through EVALSHA', async () => {
    const server = await startRedis(['--rename-command', 'FUNCTION', '']);
    const admin = new Redis(server.url);
    const backend = redisBackend({ url: server.url });
    try {
      await grantAndRelease(backend, 'old', 'warm-up'); // finds out, then stays with scripts
      const before = await commandStats(admin);
      const t1 = await grantAndRelease(backend, 'old', 'a');
      const t2 = await grantAndRelease(backend, 'old', 'b');
      const d = delta(before, await commandStats(admin));
      expect(t2).toBeGreaterThan(t1);
      expect(d.fcall ?? 0).toBe(0);
      expect((d.evalsha ?? 0) + (d.eval ?? 0)).toBe(4);
    } finally {
      admin.disconnect();
      await backend.close();
      await server.kill();
    }
  });

  it('a user whose ACL refuses FCALL gets scripts through EVALSHA', async () => {
    const server = await startRedis();
    const admin = new Redis(server.url);
    await admin.call('ACL', 'SETUSER', 'scripts-only', 'on', 'nopass', '~*', '&*', '+@all', '-fcall', '-function');
    const locks = new Locks({ backend: redisBackend({ url: server.url.replace('redis://', 'redis://scripts-only@') }) });
    try {
      const before = await commandStats(admin);
      const first = await locks.acquire('acl', { ttlMs: 5_000 });
      await first.release();
      const second = await locks.acquire('acl', { ttlMs: 5_000 });
      await second.release();
      const d = delta(before, await commandStats(admin));
      expect(second.token).toBeGreaterThan(first.token);
      expect(d.evalsha ?? 0).toBeGreaterThanOrEqual(4);
    } finally {
      admin.disconnect();
      await locks.close();
      await server.kill();
    }
  });

  it('calls made while others are in flight go out together in batches, in order, each failing alone', async () => {
    const server = await startRedis();
    const admin = new Redis(server.url);
    const backend = redisBackend({ url: server.url });
    try {
      await grantAndRelease(backend, 'warm', 'w'); // library loaded
      await admin.set('leasehold:{wrong}', 'a string, not our hash');
      const before = await commandStats(admin);
      const keys = Array.from({ length: 50 }, (_, i) => `b/${i}`);
      const results = await Promise.allSettled([
        ...keys.map((k) => backend.acquire(req(k, `o-${k}`))),
        backend.acquire(req('wrong', 'o-wrong')),
        backend.acquire(req('b/0', 'second')), // after the first grant of b/0 in the same batch: busy
      ]);
      const d = delta(before, await commandStats(admin));
      // the first BATCH_SIZE alone (the connection was not busy yet), then the rest in batches of BATCH_SIZE
      expect(scriptCalls(d)).toBeLessThanOrEqual(BATCH_SIZE + Math.ceil((52 - BATCH_SIZE) / BATCH_SIZE));
      const granted = results.slice(0, 50).map((r) => (r.status === 'fulfilled' && r.value.granted ? r.value.token : undefined));
      expect(granted.every((t) => typeof t === 'bigint')).toBe(true);
      const wrong = results[50]!;
      expect(wrong.status).toBe('rejected');
      expect((wrong as PromiseRejectedResult).reason).toBeInstanceOf(InvalidArgumentError);
      const second = results[51]!;
      expect(second.status === 'fulfilled' && second.value.granted).toBe(false);
    } finally {
      admin.disconnect();
      await backend.close();
      await server.kill();
    }
  });
  for (const driver of drivers) {
    it(`${driver.name}: after FUNCTION FLUSH the library is loaded again; after SCRIPT FLUSH EVALSHA falls back to EVAL`, async () => {
      const server = await startRedis();
      const noFunctions = await startRedis(['--rename-command', 'FUNCTION', '']);
      const admin = new Redis(server.url);
      const admin2 = new Redis(noFunctions.url);
      const fn = await driver.open(server.url);
      const sc = await driver.open(noFunctions.url);
      try {
        const t1 = await grantAndRelease(fn.backend, 'f', 'a');
        await admin.call('FUNCTION', 'FLUSH');
        const before = await commandStats(admin);
        const t2 = await grantAndRelease(fn.backend, 'f', 'b');
        const d = delta(before, await commandStats(admin));
        expect(t2).toBeGreaterThan(t1);
        expect(d['function|load']).toBe(1); // the ERR reply of the missing function was recognised
        expect(d.fcall).toBe(3);

        const s1 = await grantAndRelease(sc.backend, 's', 'a'); // finds out there are no Functions
        await admin2.call('SCRIPT', 'FLUSH');
        const before2 = await commandStats(admin2);
        const s2 = await grantAndRelease(sc.backend, 's', 'b');
        const d2 = delta(before2, await commandStats(admin2));
        expect(s2).toBeGreaterThan(s1);
        expect(d2.evalsha).toBe(2); // both answered NOSCRIPT…
        expect(d2.eval).toBe(2); // …and were sent again with EVAL
        const s3 = await grantAndRelease(sc.backend, 's', 'c');
        expect(s3).toBeGreaterThan(s2);
      } finally {
        admin.disconnect();
        admin2.disconnect();
        await fn.close();
        await sc.close();
        await fn.backend.close();
        await sc.backend.close();
        await server.kill();
        await noFunctions.kill();
      }
    });

    it(`${driver.name}: an error element inside a batch reply keeps its code (WRONGTYPE → InvalidArgumentError)`, async () => {
      const server = await startRedis();
      const admin = new Redis(server.url);
      const { backend, close } = await driver.open(server.url);
      try {
        await grantAndRelease(backend, 'warm', 'w');
        await admin.set('leasehold:{wrong}', 'a string, not our hash');
        const results = await Promise.allSettled([
          ...Array.from({ length: 2 * BATCH_SIZE }, (_, i) => backend.acquire(req(`b/${i}`, `o-${i}`))),
          backend.acquire(req('wrong', 'o-wrong')), // queued behind the others: goes out inside a batch
        ]);
        expect(results.slice(0, -1).every((r) => r.status === 'fulfilled' && r.value.granted)).toBe(true);
        const wrong = results.at(-1)!;
        expect(wrong.status).toBe('rejected');
        expect((wrong as PromiseRejectedResult).reason).toBeInstanceOf(InvalidArgumentError);
        // alone, too (not batched)
        await expect(backend.acquire(req('wrong', 'o-wrong-2'))).rejects.toBeInstanceOf(InvalidArgumentError);
      } finally {
        admin.disconnect();
        await close();
        await backend.close();
        await server.kill();
      }
    });
  }
});

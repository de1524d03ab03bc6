/**
 * The database a redis:// URL names, on the backend itself (`redisBackend({ url })`, not only
 * `createLocks({ url })`): a number, checked at once; a database the server does not have, refused
 * on first use (Redis would otherwise carry on in database 0 without a word); the one it has, used.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import type { AcquireRequest } from '../../src/core/backend.js';
import { InvalidArgumentError } from '../../src/core/errors.js';
import { createLocks } from '../../src/index.js';
import { redisBackend } from '../../src/redis/index.js';
import { startRedis, stopAll } from './servers.js';

afterAll(stopAll);

const req = (key: string, owner: string): AcquireRequest => ({
  key,
  owner,
  mode: 'exclusive',
  ttlMs: 10_000,
  lockDelayMs: 0,
  holder: owner,
  queue: false,
  queueTtlMs: 2_000,
});

/** Number of keys in each of the server's first `n` databases. */
async function sizes(url: string, n: number): Promise<number[]> {
  const out: number[] = [];
  for (let db = 0; db < n; db++) {
    const admin = new Redis(`${url}/${db}`);
    out.push(await admin.dbsize());
    admin.disconnect();
  }
  return out;
}

describe('redisBackend({ url }) and the database in the URL', () => {
  it('a database the server does not have is an InvalidArgumentError naming options.url on first use, every time; nothing lands in database 0', async () => {
    const server = await startRedis(['--databases', '4']);
    const backend = redisBackend({ url: `${server.url}/9` });
    try {
      for (const attempt of [1, 2]) {
        const error = await backend.acquire(req('k', `o${attempt}`)).then(
          () => undefined,
          (e: unknown) => e,
        );
        expect(error, `attempt ${attempt}`).toBeInstanceOf(InvalidArgumentError);
        expect(error).toMatchObject({ argument: 'options.url', retryable: false });
        expect((error as Error).message).toMatch(/selects database 9, which the server refuses: ERR/);
      }
      // Through Locks (with its session) the same error reaches the caller, not a retry.
      const locks = createLocks({ backend: redisBackend({ url: `${server.url}?db=9` }) });
      const viaLocks = await locks.acquire('k', { ttlMs: 10_000, waitMs: 1_000 }).then(
        () => undefined,
        (e: unknown) => e,
      );
      await locks.close();
      expect(viaLocks).toBeInstanceOf(InvalidArgumentError);
      expect(await sizes(server.url, 4)).toEqual([0, 0, 0, 0]);
    } finally {
      await backend.close();
      await server.kill();
    }
  });

  it('a database the server has is where the keys land (path or db=)', async () => {
    const server = await startRedis(['--databases', '4']);
    try {
      for (const [url, db] of [
        [`${server.url}/2`, 2],
        [`${server.url}?db=3`, 3],
      ] as const) {
        const backend = redisBackend({ url });
        const g = await backend.acquire(req(`k${db}`, 'o'));
        expect(g.granted).toBe(true);
        await backend.close();
        const got = await sizes(server.url, 4);
        expect(got[0]).toBe(0);
        expect(got[db]).toBeGreaterThan(0);
      }
    } finally {
      await server.kill();
    }
  });

  it('a path that is not a database number is refused at once, naming options.url', () => {
    for (const url of ['redis://127.0.0.1:1/abc', 'redis://127.0.0.1:1/1/2', 'redis://127.0.0.1:1/-1', 'redis://127.0.0.1:1?db=x']) {
      let error: unknown;
      try {
        redisBackend({ url });
      } catch (e) {
        error = e;
      }
      expect(error, url).toBeInstanceOf(InvalidArgumentError);
      expect(error).toMatchObject({ argument: 'options.url' });
      expect((error as Error).message).toMatch(/database number/);
    }
  });
});

/**
 * After Redis restarts empty, a long-lived client's session is gone. Its next tryAcquire on a
 * free key must open a new session and take the key in the same call, not answer "busy" (issue
 * 13, item 5: `leasehold run --wait 0` would skip a job that should run).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BackendUnavailableError } from '../../src/core/errors.js';
import type { Lease } from '../../src/core/lease.js';
import { Locks } from '../../src/core/locks.js';
import { redisBackend } from '../../src/redis/index.js';
import { sleep } from '../helpers/env.js';
import { startRedis, stopAll, type RedisServer } from './servers.js';

let server: RedisServer;
beforeAll(async () => {
  server = await startRedis();
});
afterAll(stopAll);

describe('redis restarted empty', () => {
  it('the first tryAcquire of a free key after the restart gets it (a new session is opened within the call)', async () => {
    const locks = new Locks({ backend: redisBackend({ url: server.url }) });
    try {
      const warm = await locks.tryAcquire('restart/a', { ttlMs: 20_000 });
      expect(warm).not.toBeNull();
      await warm!.release(); // the session stays open, idle, for the next acquire
      await server.kill();
      await server.start();
      // The client reconnects on its own; until it has, calls fail as unavailable (retryable).
      let answer: Lease | null | undefined;
      for (let i = 0; i < 100 && answer === undefined; i++) {
        try {
          answer = await locks.tryAcquire('restart/b', { ttlMs: 20_000 });
        } catch (error) {
          if (!(error instanceof BackendUnavailableError)) throw error;
          await sleep(50);
        }
      }
      expect(answer).toBeDefined();
      expect(answer).not.toBeNull(); // the key is free: busy would be a lie
      await answer!.release();
    } finally {
      await locks.close();
    }
  });
});

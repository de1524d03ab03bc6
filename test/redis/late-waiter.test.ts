/**
 * A waiter whose requests arrive late (a slow link) leaves no ghost holder on Redis (issue 13,
 * item 1): see test/helpers/late-waiter.ts.
 */
import { afterAll, beforeAll, describe, it } from 'vitest';
import { redisBackend } from '../../src/redis/index.js';
import { lateWaiterLeavesNoGhost, manyWaitersGiveUpCleanly } from '../helpers/late-waiter.js';
import { startRedis, stopAll, type RedisServer } from './servers.js';

let server: RedisServer;
beforeAll(async () => {
  server = await startRedis();
});
afterAll(stopAll);

describe('redis: a waiter whose requests arrive after it gave up', () => {
  it('leaves no queue place: the released key goes to the next client, not to the place of the one that left', async () => {
    await lateWaiterLeavesNoGhost(
      {
        target: { host: '127.0.0.1', port: server.port },
        direct: () => redisBackend({ url: server.url }),
        through: (port) => redisBackend({ url: `redis://127.0.0.1:${port}` }),
      },
      { landMs: 200 },
    );
  });
  it('300 waiters that give up after 1.5 s all end with ACQUIRE_TIMEOUT and leave no place behind', async () => {
    await manyWaitersGiveUpCleanly({ direct: () => redisBackend({ url: server.url }) }, { waiters: 300, waitMs: 1_500 });
  });
});

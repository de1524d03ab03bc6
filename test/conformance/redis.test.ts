import { afterAll } from 'vitest';
import { Redis } from 'ioredis';
import { createClient } from 'redis';
import { redisBackend, redisFence, redlockBackend, type RedisMulti } from '../../src/redis/index.js';
import { uniqueName } from '../helpers/env.js';
import { deleteKeys, REDIS_URL, startRedis, stopAll } from '../redis/servers.js';
import { backendConformance } from '../../src/testing/index.js';
import { fenceConformance } from '../../src/testing/index.js';

afterAll(stopAll);

backendConformance('redis', async () => {
  const prefix = `${uniqueName('lhconf')}:`;
  return {
    // each client opens its own connections, as separate processes would
    connect: async () => redisBackend({ url: REDIS_URL, prefix }),
    prefix: 'conf',
    ttlMs: 300,
    cleanup: () => deleteKeys(REDIS_URL, prefix),
  };
});

backendConformance('redlock (3 servers; restart = one server restarted empty)', async () => {
  const servers = await Promise.all([startRedis(), startRedis(), startRedis()]);
  return {
    connect: async () => redlockBackend({ urls: servers.map((s) => s.url) }),
    prefix: 'conf',
    ttlMs: 300,
    restart: async () => {
      await servers[0]!.kill();
      await servers[0]!.start();
    },
    cleanup: async () => {
      await Promise.all(servers.map((s) => s.kill()));
    },
  };
});

/** node-redis clients the harnesses opened: the backends leave a user's client alone, so the test closes them. */
type Closable = { close(): Promise<unknown>; destroy(): void };
async function nodeRedis(url: string, opened: Closable[]) {
  const c = createClient({ url });
  c.on('error', () => {});
  opened.push(c);
  await c.connect();
  return c;
}

backendConformance('redis with a node-redis client', async () => {
  const prefix = `${uniqueName('lhconfnr')}:`;
  const opened: Closable[] = [];
  return {
    connect: async () => redisBackend({ client: await nodeRedis(REDIS_URL, opened), prefix }),
    prefix: 'conf',
    ttlMs: 300,
    cleanup: async () => {
      await Promise.allSettled(opened.map((c) => c.close()));
      await deleteKeys(REDIS_URL, prefix);
    },
  };
});

backendConformance('redlock with node-redis clients (3 servers)', async () => {
  const servers = await Promise.all([startRedis(), startRedis(), startRedis()]);
  const opened: Closable[] = [];
  return {
    connect: async () => redlockBackend({ clients: await Promise.all(servers.map((s) => nodeRedis(s.url, opened))) }),
    prefix: 'conf',
    ttlMs: 300,
    cleanup: async () => {
      for (const c of opened) c.destroy();
      await Promise.all(servers.map((s) => s.kill()));
    },
  };
});

fenceConformance<RedisMulti>('redis', async () => {
  const ns = `${uniqueName('lhfence')}:`;
  const client = new Redis(REDIS_URL);
  const fence = redisFence(client, { prefix: `${ns}mark:` });
  const counterKey = (r: string): string => `${ns}n:${r}`;
  const logKey = (r: string): string => `${ns}log:${r}`;
  return {
    fence,
    increment: (tx, r) => tx.incr(counterKey(r)),
    append: (tx, r, v) => tx.rpush(logKey(r), v),
    counter: async (r) => Number((await client.get(counterKey(r))) ?? 0),
    log: async (r) => client.lrange(logKey(r), 0, -1),
    transactional: true,
    synchronous: false,
    cleanup: async () => {
      await fence.close();
      await deleteKeys(REDIS_URL, ns);
      client.disconnect();
    },
  };
});

fenceConformance('redis with a node-redis client', async () => {
  const ns = `${uniqueName('lhfencenr')}:`;
  const client = createClient({ url: REDIS_URL });
  client.on('error', () => {});
  await client.connect();
  // typed as the client's own MULTI (node-redis 5+ types `multi` generically: name it)
  const fence = redisFence<ReturnType<typeof client.multi<'typed'>>>(client, { prefix: `${ns}mark:` });
  const counterKey = (r: string): string => `${ns}n:${r}`;
  const logKey = (r: string): string => `${ns}log:${r}`;
  return {
    fence,
    increment: (tx, r) => tx.incr(counterKey(r)),
    append: (tx, r, v) => tx.rPush(logKey(r), v),
    counter: async (r) => Number((await client.get(counterKey(r))) ?? 0),
    log: async (r) => client.lRange(logKey(r), 0, -1),
    transactional: true,
    synchronous: false,
    cleanup: async () => {
      await fence.close();
      await deleteKeys(REDIS_URL, ns);
      await client.close();
    },
  };
});

/**
 * Failure behaviour against real servers we kill and freeze: connection loss fails calls with
 * BackendUnavailableError (never a hang), renewals retry within validity and loss is signalled
 * (I6), bad input and Redis errors are typed, and nothing ends as an unhandled rejection.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { createClient } from 'redis';
import { BackendUnavailableError, InvalidArgumentError, PartialWriteError, type LeaseholdError, type LeaseLostError } from '../../src/core/errors.js';
import { Locks } from '../../src/core/locks.js';
import { redisBackend, redisFence, redlockBackend } from '../../src/redis/index.js';
import { eventually, sleep } from '../helpers/env.js';
import { startRedis, stopAll } from './servers.js';

const unhandled: unknown[] = [];
const onUnhandled = (reason: unknown): void => {
  unhandled.push(reason);
};
process.on('unhandledRejection', onUnhandled);

afterAll(async () => {
  await stopAll();
  process.off('unhandledRejection', onUnhandled);
});

describe('redis failure behaviour', () => {
  it('connection loss: calls fail with BackendUnavailableError, the lease is signalled lost, the client recovers', async () => {
    const server = await startRedis();
    const locks = new Locks({ backend: redisBackend({ url: server.url, commandTimeoutMs: 500 }) });
    const renewFailures: LeaseholdError[] = [];
    locks.on('renewFailed', (e) => renewFailures.push(e.error));
    try {
      const lease = await locks.acquire('conn', { ttlMs: 900 });
      await server.kill('SIGKILL');
      const tried = await locks.tryAcquire('other', { ttlMs: 900 }).catch((e: unknown) => e);
      expect(tried).toBeInstanceOf(BackendUnavailableError);
      const waited = await locks.acquire('other', { ttlMs: 900, waitMs: 300 }).catch((e: unknown) => e);
      expect(waited).toBeInstanceOf(BackendUnavailableError);
      expect(await eventually(() => lease.signal.aborted, 3_000)).toBe(true);
      expect((lease.signal.reason as LeaseLostError).reason).toBe('expired');
      expect(renewFailures.length).toBeGreaterThan(0);
      expect(renewFailures.every((e) => e instanceof BackendUnavailableError)).toBe(true);
      await server.start();
      const again = await locks.acquire('conn', { ttlMs: 900, waitMs: 10_000 });
      expect(again.token).toBeGreaterThan(lease.token);
    } finally {
      await locks.close();
      await server.kill();
    }
  });

  it('a frozen server (SIGSTOP): calls time out with BackendUnavailableError; a freeze shorter than validity keeps the lease', async () => {
    const server = await startRedis();
    const locks = new Locks({ backend: redisBackend({ url: server.url, commandTimeoutMs: 300 }) });
    try {
      const lease = await locks.acquire('frozen', { ttlMs: 3_000 });
      server.pause();
      const tried = await locks.tryAcquire('frozen-2', { ttlMs: 900 }).catch((e: unknown) => e);
      expect(tried).toBeInstanceOf(BackendUnavailableError);
      await sleep(1_200); // a renewal (due at ~1 s) fails and is retried
      server.resume();
      await sleep(1_500);
      expect(lease.signal.aborted).toBe(false);
      expect(lease.held).toBe(true);
      await lease.release();
    } finally {
      server.resume();
      await locks.close();
      await server.kill();
    }
  });

  it('a client the user passed in: a dead connection fails fast, and close() leaves the client open', async () => {
    const server = await startRedis();
    const client = new Redis(server.url); // default options: offline queue on
    client.on('error', () => {});
    const backend = redisBackend({ client, commandTimeoutMs: 500 });
    try {
      const g = await backend.acquire({
        key: 'mine',
        owner: 'o',
        mode: 'exclusive',
        ttlMs: 1_000,
        lockDelayMs: 0,
        holder: 'h',
        queue: false,
        queueTtlMs: 2_000,
      });
      expect(g.granted).toBe(true);
      await server.kill('SIGKILL');
      await eventually(() => client.status !== 'ready', 2_000);
      const e = await backend
        .acquire({ key: 'mine', owner: 'p', mode: 'exclusive', ttlMs: 1_000, lockDelayMs: 0, holder: 'h', queue: false, queueTtlMs: 2_000 })
        .catch((x: unknown) => x);
      expect(e).toBeInstanceOf(BackendUnavailableError);
      await server.start();
      await eventually(() => client.status === 'ready', 5_000);
      await backend.close();
      expect(await client.ping()).toBe('PONG');
    } finally {
      client.disconnect();
      await server.kill();
    }
  });

  it('a key of another type under our prefix is an InvalidArgumentError, not a retry', async () => {
    const server = await startRedis();
    const admin = new Redis(server.url);
    const locks = new Locks({ backend: redisBackend({ url: server.url }) });
    try {
      await admin.set('leasehold:{taken}', 'somebody else’s string');
      const e = await locks.acquire('taken', { ttlMs: 1_000, waitMs: 5_000 }).catch((x: unknown) => x);
      expect(e).toBeInstanceOf(InvalidArgumentError);
      expect((e as InvalidArgumentError).argument).toBe('key');
    } finally {
      admin.disconnect();
      await locks.close();
      await server.kill();
    }
  });

  it('bad options are refused with InvalidArgumentError naming them', () => {
    const bad: [() => unknown, string][] = [
      [() => redisBackend({}), 'options'],
      [() => redisBackend({ url: 'redis://127.0.0.1:1', client: {} as never }), 'options'],
      [() => redisBackend({ url: 'http://127.0.0.1:6379' }), 'options.url'],
      [() => redisBackend({ client: { get() {} } as never }), 'options.client'],
      [() => redisBackend({ url: 'redis://127.0.0.1:1', prefix: 'a{b' }), 'options.prefix'],
      [() => redisBackend({ url: 'redis://127.0.0.1:1', commandTimeoutMs: 0 }), 'options.commandTimeoutMs'],
      [() => redisBackend({ url: 'redis://127.0.0.1:1', sessions: 'yes' as never }), 'options.sessions'],
      [() => redisBackend({ url: 'redis://127.0.0.1:1', ttl: 5 } as never), 'options.ttl'],
      [() => redlockBackend({ urls: [] }), 'options.urls'],
      [() => redlockBackend({ urls: ['redis://127.0.0.1:1', 'nope'] }), 'options.urls[1]'],
      [() => redisFence(null as never), 'client'],
    ];
    for (const [make, argument] of bad) {
      let error: unknown;
      try {
        const b = make() as { close?: () => Promise<void> };
        void b?.close?.();
      } catch (e) {
        error = e;
      }
      expect(error, argument).toBeInstanceOf(InvalidArgumentError);
      expect((error as InvalidArgumentError).argument).toBe(argument);
    }
  });

  it('redisFence, ioredis and node-redis: a queued command that fails in EXEC is a PartialWriteError; a dead server a BackendUnavailableError', async () => {
    const server = await startRedis();
    const admin = new Redis(server.url);
    const node = createClient({ url: server.url, socket: { reconnectStrategy: false } });
    node.on('error', () => {});
    await node.connect();
    const io = new Redis(server.url, { enableOfflineQueue: false, maxRetriesPerRequest: 0, retryStrategy: () => null });
    io.on('error', () => {});
    const fences = [
      {
        name: 'ioredis',
        fence: redisFence(io, { commandTimeoutMs: 1_000 }),
        push: (tx: unknown) => (tx as { rpush(k: string, v: string): unknown }).rpush('a-string', 'x'),
      },
      {
        name: 'node-redis',
        fence: redisFence(node, { commandTimeoutMs: 1_000 }),
        push: (tx: unknown) => (tx as { rPush(k: string, v: string): unknown }).rPush('a-string', 'x'),
      },
    ];
    try {
      await admin.set('a-string', 'not a list');
      for (const [i, { name, fence, push }] of fences.entries()) {
        const e = await fence.write(`doc-${i}`, 5n, (tx) => push(tx)).catch((x: unknown) => x);
        // Redis has no rollback: the mark was raised with the commands that ran (PARTIAL_WRITE, since 2fac202).
        expect(e, name).toBeInstanceOf(PartialWriteError);
        expect((e as PartialWriteError).resource, name).toBe(`doc-${i}`);
        expect((e as PartialWriteError).token, name).toBe(5n);
        expect(await fence.highest(`doc-${i}`), name).toBe(5n);
      }
      await fences[1]!.fence.close(); // its idle connections go: the next write needs a new one
      await server.kill();
      for (const { name, fence } of fences) {
        const e = await fence.write('doc-dead', 6n, () => {}).catch((x: unknown) => x);
        expect(e, name).toBeInstanceOf(BackendUnavailableError);
      }
    } finally {
      for (const { fence } of fences) await fence.close();
      admin.disconnect();
      io.disconnect();
      node.destroy();
      await server.kill();
    }
  });

  it('no path above left an unhandled rejection', async () => {
    await sleep(50);
    expect(unhandled).toEqual([]);
  });
});

/**
 * Closing against a frozen Redis (SIGSTOP: connections accepted, nothing answered) is bounded and
 * frees every socket; a refused or dropped connection fails calls at once with the driver's error
 * (ECONNREFUSED, "Connection is closed"), not after the command timeout.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { BackendUnavailableError } from '../../src/core/errors.js';
import type { Backend } from '../../src/core/backend.js';
import { createLocks } from '../../src/index.js';
import { redisBackend, redlockBackend } from '../../src/redis/index.js';
import { eventually } from '../helpers/env.js';
import { freePort, startRedis, stopAll, type RedisServer } from './servers.js';

afterAll(stopAll);

/** Resolves with how `p` settled, or 'hung' after `ms` (only to keep a regression from hanging the suite). */
function within<T>(p: Promise<T>, ms: number): Promise<{ value: T } | { error: unknown } | 'hung'> {
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve('hung'), ms);
    p.then(
      (value) => (clearTimeout(timer), resolve({ value })),
      (error: unknown) => (clearTimeout(timer), resolve({ error })),
    );
  });
}

/** Client connections the server has apart from `admin`'s own (CLIENT LIST counts the caller). */
async function otherClients(admin: Redis): Promise<number> {
  const list = (await admin.call('CLIENT', 'LIST')) as string;
  return list.split('\n').filter((l) => l.trim() !== '').length - 1;
}

/** TCP sockets this process holds open (a socket left open keeps a process from exiting). */
function tcpHandles(): number {
  return process.getActiveResourcesInfo().filter((r) => r === 'TCPWrap' || r === 'TCPSocketWrap').length;
}

/** After the server resumes, the sockets leasehold had open must be gone (closed by us while it was frozen). */
async function noLeftoverConnections(server: RedisServer): Promise<boolean> {
  const admin = new Redis(server.url, { maxRetriesPerRequest: 0 });
  admin.on('error', () => {});
  try {
    return await eventually(async () => (await otherClients(admin)) === 0, 5_000, 50);
  } finally {
    admin.disconnect();
  }
}

const req = (key: string, owner: string, queue: boolean) => ({
  key,
  owner,
  mode: 'exclusive' as const,
  ttlMs: 5_000,
  lockDelayMs: 0,
  holder: 'h',
  queue,
  queueTtlMs: 5_000,
});

describe('redis: close() against a frozen server', () => {
  it('locks.close() resolves, bounded, with a lease held, its session and the wake-up subscriber open; no socket is left', async () => {
    const server = await startRedis();
    try {
      const before = tcpHandles();
      const locks = createLocks({ backend: redisBackend({ url: server.url, commandTimeoutMs: 500 }) });
      const lease = await locks.acquire('frozen-close', { ttlMs: 10_000 });
      // A waiter that times out: the backend's wake-up subscriber connection is now open too.
      const waited = await locks.acquire('frozen-close', { ttlMs: 10_000, waitMs: 200 }).catch((e: unknown) => e);
      expect((waited as { code?: string }).code).toBe('ACQUIRE_TIMEOUT');
      expect(lease.held).toBe(true);
      server.pause();
      const closed = await within(locks.close(), 20_000);
      expect(closed).not.toBe('hung');
      // While the server is still frozen: our sockets are gone (not left waiting for a QUIT answer).
      expect(await eventually(() => tcpHandles() <= before, 3_000, 20)).toBe(true);
      server.resume();
      expect(await noLeftoverConnections(server)).toBe(true);
    } finally {
      server.resume();
      await server.kill();
    }
  });

  it('backend.close() resolves while the wake-up subscriber is still connecting to the frozen server', async () => {
    const server = await startRedis();
    try {
      const backend: Backend = redisBackend({ url: server.url, commandTimeoutMs: 300, sessions: false });
      expect((await backend.acquire(req('k', 'a', false))).granted).toBe(true);
      server.pause();
      // A queued acquire opens the subscriber, which never gets past its handshake.
      const queued = await backend.acquire(req('k', 'b', true)).catch((e: unknown) => e);
      expect(queued).toBeInstanceOf(BackendUnavailableError);
      const closed = await within(backend.close(), 20_000);
      expect(closed).not.toBe('hung');
      server.resume();
      expect(await noLeftoverConnections(server)).toBe(true);
    } finally {
      server.resume();
      await server.kill();
    }
  });

  it('the wake-up subscriber waits the configured commandTimeoutMs, not the default 2 s', async () => {
    const server = await startRedis();
    try {
      const backend: Backend = redisBackend({ url: server.url, commandTimeoutMs: 100, sessions: false });
      expect((await backend.acquire(req('k', 'a', false))).granted).toBe(true);
      server.pause();
      const started = performance.now();
      const queued = await backend.acquire(req('k', 'b', true)).catch((e: unknown) => e);
      const took = performance.now() - started;
      expect(queued).toBeInstanceOf(BackendUnavailableError);
      // The subscribe wait and the acquire are bounded by 100 ms each; the default would make it ≥ 2000 ms.
      expect(took).toBeLessThan(1_900);
      await within(backend.close(), 20_000);
    } finally {
      server.resume();
      await server.kill();
    }
  });

  it('redlock: locks.close() resolves with its three servers frozen; no socket is left', async () => {
    const servers = await Promise.all([startRedis(), startRedis(), startRedis()]);
    try {
      const before = tcpHandles();
      const locks = createLocks({ backend: redlockBackend({ urls: servers.map((s) => s.url), commandTimeoutMs: 500 }) });
      const lease = await locks.acquire('frozen-redlock', { ttlMs: 10_000 });
      expect(lease.held).toBe(true);
      for (const s of servers) s.pause();
      const closed = await within(locks.close(), 20_000);
      expect(closed).not.toBe('hung');
      expect(await eventually(() => tcpHandles() <= before, 3_000, 20)).toBe(true);
      for (const s of servers) s.resume();
      for (const s of servers) expect(await noLeftoverConnections(s)).toBe(true);
    } finally {
      for (const s of servers) {
        s.resume();
        await s.kill();
      }
    }
  });
});

describe('redis: a refused or dropped connection fails at once with the driver error', () => {
  it('tryAcquire against a port nobody listens on: BACKEND_UNAVAILABLE carrying ECONNREFUSED, before the command timeout', async () => {
    const port = await freePort();
    for (const sessions of [true, false]) {
      const locks = createLocks({ backend: redisBackend({ url: `redis://127.0.0.1:${port}`, commandTimeoutMs: 60_000, sessions }) });
      try {
        const e = await locks.tryAcquire('refused', { ttlMs: 1_000 }).catch((x: unknown) => x);
        expect(e).toBeInstanceOf(BackendUnavailableError);
        expect((e as Error).message).toMatch(/ECONNREFUSED/);
        expect((e as Error).message).not.toMatch(/no answer/);
        expect(String((e as Error).cause)).toMatch(/ECONNREFUSED/);
      } finally {
        await locks.close();
      }
    }
  });

  it('redlock against ports nobody listens on: BACKEND_UNAVAILABLE carrying ECONNREFUSED', async () => {
    const ports = await Promise.all([freePort(), freePort(), freePort()]);
    const locks = createLocks({ backend: redlockBackend({ urls: ports.map((p) => `redis://127.0.0.1:${p}`), commandTimeoutMs: 60_000 }) });
    try {
      const e = await locks.tryAcquire('refused', { ttlMs: 1_000 }).catch((x: unknown) => x);
      expect(e).toBeInstanceOf(BackendUnavailableError);
      expect((e as Error).message).toMatch(/ECONNREFUSED/);
    } finally {
      await locks.close();
    }
  });

  it('a server killed while an acquire is on the wire: that call rejects with the close error, not the timeout', async () => {
    const server = await startRedis(['--enable-debug-command', 'yes']);
    const admin = new Redis(server.url, { maxRetriesPerRequest: 0 });
    admin.on('error', () => {});
    const locks = createLocks({ backend: redisBackend({ url: server.url, commandTimeoutMs: 60_000 }) });
    try {
      // Warm up: the session and the functions library are in place, so the next call is one FCALL.
      await (await locks.acquire('warm', { ttlMs: 5_000 })).release();
      // The server is busy for 5 s: the acquire below is written and waits for its answer.
      void admin.call('DEBUG', 'SLEEP', '5').catch(() => {});
      await new Promise((r) => setTimeout(r, 100));
      const pending = locks.tryAcquire('in-flight', { ttlMs: 5_000 }).catch((x: unknown) => x);
      await new Promise((r) => setTimeout(r, 200));
      await server.kill('SIGKILL');
      const e = await pending;
      expect(e).toBeInstanceOf(BackendUnavailableError);
      expect((e as Error).message).not.toMatch(/no answer|within/);
      expect((e as Error).message).toMatch(/closed|ECONNRESET/i);
      // Another call while the server is gone fails at once, with the connection's error.
      const again = await locks.tryAcquire('after', { ttlMs: 5_000 }).catch((x: unknown) => x);
      expect(again).toBeInstanceOf(BackendUnavailableError);
      expect((again as Error).message).not.toMatch(/no answer|within/);
    } finally {
      admin.disconnect();
      await locks.close();
      await server.kill();
    }
  });
});

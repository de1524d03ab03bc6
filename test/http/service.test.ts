/**
 * httpBackend against a real lock service (`leasehold serve` in process, over the memory backend
 * with sessions): a wait is one long poll that the server wakes (no polling from the client), a
 * bearer token is what the server checks (from the option or the URL), its refusals come back as
 * InvalidArgumentErrors naming `token` and `key`, an `http://` URL works in createLocks, and an
 * `https://` server with a private CA is reached with `ca` (and refused without it).
 */
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Backend } from '../../src/core/backend.js';
import { BackendUnavailableError, InvalidArgumentError } from '../../src/core/errors.js';
import { Locks } from '../../src/core/locks.js';
import { httpBackend } from '../../src/http/index.js';
import { createLocks } from '../../src/index.js';
import { memoryBackend } from '../../src/memory/index.js';
import { parseAuthConfig, type RunningLockServer, startLockServer } from '../../src/serve/index.js';
import { eventually, sleep, tempDir } from '../helpers/env.js';

/** Counts the Backend calls of a client (its public surface, not its internals). */
function counted(backend: Backend): { backend: Backend; calls: Record<string, number> } {
  const calls: Record<string, number> = {};
  const wrapped = Object.create(backend) as Backend;
  for (const name of ['acquire', 'renew', 'release'] as const) {
    const fn = backend[name] as (...args: unknown[]) => unknown;
    Object.defineProperty(wrapped, name, { value: (...args: unknown[]) => ((calls[name] = (calls[name] ?? 0) + 1), fn.apply(backend, args)) });
  }
  return { backend: wrapped, calls };
}

describe('over a plain server', () => {
  const coordinator = memoryBackend({ sessions: true });
  let server: RunningLockServer;
  const opened: Locks[] = [];
  const client = (backend: Backend = httpBackend({ url: server.url })): Locks => {
    const locks = new Locks({ backend });
    opened.push(locks);
    return locks;
  };
  beforeAll(async () => {
    server = await startLockServer({ backend: coordinator, port: 0 });
  });
  afterAll(async () => {
    await Promise.allSettled(opened.map((l) => l.close()));
    await server.close();
    await coordinator.close();
  });

  it('a wait is one long poll, woken by the server when the holder releases: the client does not poll', async () => {
    const holder = await client().acquire('poll', { ttlMs: 10_000 });
    const probe = counted(httpBackend({ url: server.url }));
    const waiting = client(probe.backend).acquire('poll', { ttlMs: 10_000, waitMs: 20_000 });
    await sleep(1_500); // three fallback-poll intervals of core's own wait: none of them happens here
    expect(probe.calls.acquire).toBe(1);
    await holder.release();
    const lease = await waiting;
    expect(lease.token).toBeGreaterThan(holder.token);
    expect(probe.calls.acquire).toBe(1);
    await lease.release();
  });

  it("watch follows the server's event stream: a grant and a release by another client are told, another key's are not", async () => {
    const watcher = client();
    const other = client();
    let told = 0;
    const stop = await watcher.watch('watched', () => told++);
    expect(stop).toBeTypeOf('function');
    const unrelated = await other.acquire('watched-not', { ttlMs: 5_000 }); // under the prefix, another key
    await unrelated.release();
    await sleep(500);
    expect(told).toBe(0);
    const lease = await other.acquire('watched', { ttlMs: 5_000 });
    await eventually(() => told >= 1, 5_000);
    const afterGrant = told;
    await lease.release();
    await eventually(() => told > afterGrant, 5_000);
    stop!();
  });

  it('an election observed over the service sees each new term', async () => {
    const seen: (bigint | null)[] = [];
    const controller = new AbortController();
    const observing = (async () => {
      for await (const leader of client().election('leader', { ttlMs: 5_000 }).observe({ signal: controller.signal })) seen.push(leader?.token ?? null);
    })();
    const a = client();
    const term1 = await a.election('leader', { ttlMs: 5_000 }).campaign({ value: 'a' });
    await eventually(() => seen.includes(term1.token), 5_000);
    await term1.release();
    const term2 = await client().election('leader', { ttlMs: 5_000 }).campaign({ value: 'b' });
    await eventually(() => seen.includes(term2.token), 5_000);
    controller.abort();
    await observing;
    await term2.release();
    expect(seen.filter((t) => t !== null)).toEqual([term1.token, term2.token]);
  });

  it('an http:// URL works in createLocks (through the URL loader)', async () => {
    const locks = createLocks({ url: server.url });
    opened.push(locks);
    const lease = await locks.acquire('by-url', { ttlMs: 5_000 });
    expect(lease.token).toBeGreaterThan(0n);
    const [state] = await locks.inspect('by-url');
    expect(state?.holders.map((h) => h.token)).toEqual([lease.token]);
    await lease.release();
    expect((await locks.inspect('by-url'))[0]?.holders ?? []).toEqual([]);
  });
});

describe('over a server whose backend has no sessions', () => {
  const coordinator = memoryBackend();
  let server: RunningLockServer;
  beforeAll(async () => {
    server = await startLockServer({ backend: coordinator, port: 0 });
  });
  afterAll(async () => {
    await server.close();
    await coordinator.close();
  });

  it('the client keeps its sessions itself (the server answers 501): one keep-alive renews each lease; close frees them', async () => {
    const locks = new Locks({ backend: httpBackend({ url: server.url }) });
    const renewed: number[] = [];
    locks.on('renewed', (e) => renewed.push(e.leases));
    const leases = await Promise.all([0, 1, 2, 3, 4].map((i) => locks.acquire(`nosession/${i}`, { ttlMs: 1_500 })));
    await sleep(3_000); // twice the ttl: only renewals keep them
    expect(leases.every((l) => l.held)).toBe(true);
    expect(renewed.length).toBeGreaterThan(0);
    expect(renewed.every((n) => n === 5)).toBe(true); // one keep-alive for the five (five requests under it)
    expect((await coordinator.inspect('nosession/')).map((s) => s.holders.length)).toEqual([1, 1, 1, 1, 1]);
    await locks.close();
    expect((await coordinator.inspect('nosession/')).every((s) => s.holders.length === 0)).toBe(true);
  });
});

describe('over a server with --auth', () => {
  const coordinator = memoryBackend({ sessions: true });
  let server: RunningLockServer;
  const opened: Locks[] = [];
  const sha = (t: string): string => createHash('sha256').update(t).digest('hex');
  beforeAll(async () => {
    const auth = parseAuthConfig({ callers: [{ name: 'svc-a', tokenSha256: sha('token-a'), prefixes: ['a/'] }] });
    server = await startLockServer({ backend: coordinator, port: 0, auth });
  });
  afterAll(async () => {
    await Promise.allSettled(opened.map((l) => l.close()));
    await server.close();
    await coordinator.close();
  });
  const client = (options: { url?: string; token?: string }): Locks => {
    const locks = new Locks({ backend: httpBackend({ url: server.url, ...options }) });
    opened.push(locks);
    return locks;
  };

  it('the token (an option, or the URL user-info) is what the server checks; a wrong one is InvalidArgumentError(token), at once', async () => {
    const lease = await client({ token: 'token-a' }).acquire('a/1', { ttlMs: 5_000 });
    await lease.release();
    const viaUrl = await client({ url: server.url.replace('http://', 'http://svc-a:token-a@') }).acquire('a/2', { ttlMs: 5_000 });
    await viaUrl.release();
    for (const wrong of [{ token: 'token-b' }, {}]) {
      const error = await client(wrong)
        .acquire('a/3', { ttlMs: 5_000, waitMs: 60_000 })
        .catch((e: unknown) => e);
      expect(error).toBeInstanceOf(InvalidArgumentError); // not retried for a minute: refused for good
      expect((error as InvalidArgumentError).argument).toBe('token');
    }
  });

  it("a key outside the caller's prefixes is InvalidArgumentError(key), a prefix InvalidArgumentError(prefix); inspect shows only the caller's keys", async () => {
    const a = client({ token: 'token-a' });
    const error = await a.acquire('b/1', { ttlMs: 5_000, waitMs: 60_000 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(InvalidArgumentError);
    expect((error as InvalidArgumentError).argument).toBe('key');
    const lease = await a.acquire('a/mine', { ttlMs: 5_000 });
    expect((await a.inspect('')).map((s) => s.key)).toEqual(['a/mine']);
    await expect(a.inspect('b/')).rejects.toMatchObject({ name: 'InvalidArgumentError', argument: 'prefix' });
    await lease.release();
  });
});

describe('over https with a private CA', () => {
  const coordinator = memoryBackend({ sessions: true });
  const dir = tempDir();
  let server: RunningLockServer;
  let ca: string;
  beforeAll(async () => {
    const key = join(dir.path, 'key.pem');
    const cert = join(dir.path, 'cert.pem');
    execFileSync(
      'openssl',
      [
        'req',
        '-x509',
        '-newkey',
        'rsa:2048',
        '-nodes',
        '-keyout',
        key,
        '-out',
        cert,
        '-days',
        '1',
        '-subj',
        '/CN=127.0.0.1',
        '-addext',
        'subjectAltName=IP:127.0.0.1',
      ],
      {
        stdio: 'ignore',
      },
    );
    ca = readFileSync(cert, 'utf8');
    server = await startLockServer({ backend: coordinator, port: 0, https: { cert: ca, key: readFileSync(key, 'utf8') } });
  });
  afterAll(async () => {
    await server.close();
    await coordinator.close();
    dir.cleanup();
  });

  it('is reached with `ca`, and refused (BackendUnavailableError naming the certificate problem) without it', async () => {
    expect(server.url).toMatch(/^https:\/\//);
    const trusted = new Locks({ backend: httpBackend({ url: server.url, ca }) });
    const lease = await trusted.acquire('tls', { ttlMs: 5_000 });
    await lease.release();
    await trusted.close();
    const untrusted = new Locks({ backend: httpBackend({ url: server.url }) });
    const error = await untrusted.tryAcquire('tls', { ttlMs: 5_000 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(BackendUnavailableError);
    expect((error as Error).message).toMatch(/certificate/i);
    await untrusted.close();
  });
});

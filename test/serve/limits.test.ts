/**
 * The lock service's protections and failure answers: the per-caller rate limit (429 RATE_LIMITED,
 * another caller unaffected), a backend that cannot be reached (503 BACKEND_UNAVAILABLE on every
 * route that needs it, health too, never a 500), the request log (route patterns, never a handle or
 * a session id), TLS, and the loopback rule without --auth.
 */
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { request as httpsRequest } from 'node:https';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { InvalidArgumentError } from '../../src/core/errors.js';
import { memoryBackend } from '../../src/memory/index.js';
import { createLockServer, isLoopback, type LockServerApp, type RunningLockServer, startLockServer } from '../../src/serve/index.js';
import { encodeLeaseHandle, ownerSeed } from '../../src/serve/handles.js';
import { tempDir } from '../helpers/env.js';
import { AS_A, AS_B, AUTH, acquirePath, call } from './helpers.js';

let app: LockServerApp | undefined;
let running: RunningLockServer | undefined;
afterEach(async () => {
  await app?.close();
  await running?.close();
  app = undefined;
  running = undefined;
});

describe('rate limit', () => {
  it('over --rate-limit requests per second a caller gets 429 RATE_LIMITED; another caller does not', async () => {
    app = await createLockServer({ backend: memoryBackend(), auth: AUTH, rateLimit: 5 });
    // Twenty at once: however the one-second windows fall, at most 10 of them (two windows) get through.
    const answers = await Promise.all(Array.from({ length: 20 }, () => call(app!, 'GET', '/v1/locks', undefined, AS_A)));
    const ok = answers.filter((a) => a.status === 200).length;
    const limited = answers.filter((a) => a.status === 429);
    expect(ok).toBeGreaterThanOrEqual(5);
    expect(ok + limited.length).toBe(20);
    expect(limited.length).toBeGreaterThanOrEqual(10);
    expect(limited[0]!.body).toMatchObject({ code: 'RATE_LIMITED' });
    expect(limited[0]!.raw.headers['retry-after']).toBeDefined();
    expect((await call(app, 'GET', '/v1/locks', undefined, AS_B)).status).toBe(200);
  });

  it('the default (1,000/s) lets a busy client through', async () => {
    app = await createLockServer({ backend: memoryBackend() });
    const statuses = new Set<number>();
    for (let i = 0; i < 200; i++) statuses.add((await call(app, 'GET', '/v1/health')).status);
    expect([...statuses]).toEqual([200]);
  });
});

describe('a backend that cannot be reached', () => {
  for (const [name, url] of [
    ['Redis on a closed port', 'redis://127.0.0.1:1'],
    ['PostgreSQL on a closed port', 'postgres://postgres@127.0.0.1:1/test'],
  ] as const) {
    it(`${name}: 503 BACKEND_UNAVAILABLE on every route that needs it, never a 500`, async () => {
      app = await createLockServer({ url, operationTimeoutMs: 1_500 });
      const lease = encodeLeaseHandle({
        key: 'k',
        token: 1n,
        mode: 'exclusive',
        limit: undefined,
        lockDelayMs: 0,
        ttlMs: 30_000,
        label: 'x',
        session: undefined,
        minHold: undefined,
        seed: ownerSeed(),
      });
      const answers = [
        await call(app, 'POST', acquirePath('k'), {}),
        await call(app, 'POST', acquirePath('k'), { waitMs: 2_000 }), // failures only: the failure, not "still busy"
        await call(app, 'GET', '/v1/locks'),
        await call(app, 'GET', '/v1/health'),
        await call(app, 'POST', `/v1/leases/${lease}/renew`),
        await call(app, 'DELETE', `/v1/leases/${lease}`),
      ];
      for (const a of answers) {
        expect(a.status, JSON.stringify(a.body)).toBe(503);
        expect(a.body.code).toBe('BACKEND_UNAVAILABLE');
      }
    });
  }
});

describe('logging', () => {
  it('logs each request by method, route pattern and status: never a lease handle, a session handle or a session id', async () => {
    const lines: string[] = [];
    app = await createLockServer({ backend: memoryBackend({ sessions: true }), logger: { level: 'debug', stream: { write: (line) => lines.push(line) } } });
    const { session } = (await call(app, 'POST', '/v1/sessions')).body as { session: string };
    const got = (await call(app, 'POST', acquirePath('tenant/9'), { session })).body as { lease: string };
    await call(app, 'POST', `/v1/leases/${got.lease}/renew`);
    await call(app, 'POST', `/v1/sessions/${session}/keepalive`);
    await call(app, 'POST', `/v1/leases/${got.lease}x/renew`); // malformed: a 400
    await call(app, 'GET', `/v1/leases/${got.lease}`); // no such route: a 404
    await call(app, 'DELETE', `/v1/leases/${got.lease}`);
    await call(app, 'DELETE', `/v1/sessions/${session}`);
    const log = lines.join('');
    expect(log).toContain('"route":"/v1/leases/:lease/renew"');
    expect(log).toContain('"route":"/v1/sessions/:session"');
    expect(log).toContain('"status":400');
    expect(log).toContain('"status":404');
    const sessionRecord = session.split('.')[1]!;
    const sessionId = Buffer.from(sessionRecord, 'base64url').subarray(4).toString('utf8');
    for (const secret of [got.lease, got.lease.slice(5, 40), session, sessionRecord, sessionId]) expect(log).not.toContain(secret);
  });
});

describe('listening', () => {
  it('without --auth only loopback addresses: 0.0.0.0, :: or a LAN address is an InvalidArgumentError naming host', async () => {
    for (const host of ['0.0.0.0', '::', '192.168.1.10', 'example.com']) {
      await expect(startLockServer({ backend: memoryBackend(), host, port: 0 })).rejects.toMatchObject({ argument: 'host' });
    }
    await expect(startLockServer({ backend: memoryBackend(), host: '0.0.0.0', port: 0 })).rejects.toBeInstanceOf(InvalidArgumentError);
    expect(['127.0.0.1', '127.1.2.3', '::1', '[::1]', 'localhost', '::ffff:127.0.0.1'].every(isLoopback)).toBe(true);
    expect(['0.0.0.0', '::', '10.0.0.1', '128.0.0.1', '::2'].some(isLoopback)).toBe(false);
  });

  it('with --auth it listens on any address (here 0.0.0.0, reached through loopback)', async () => {
    running = await startLockServer({ backend: memoryBackend(), auth: AUTH, host: '0.0.0.0', port: 0 });
    const port = new URL(running.url).port;
    const res = await fetch(`http://127.0.0.1:${port}/v1/health`, { headers: AS_A });
    expect(res.status).toBe(200);
  });

  it('serves https with --tls-cert and --tls-key', async () => {
    const dir = tempDir();
    try {
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
        { stdio: 'ignore' },
      );
      running = await startLockServer({ backend: memoryBackend(), host: '127.0.0.1', port: 0, https: { cert: readFileSync(cert), key: readFileSync(key) } });
      expect(running.url).toMatch(/^https:\/\/127\.0\.0\.1:\d+$/);
      const body = await new Promise<string>((resolve, reject) => {
        const req = httpsRequest(`${running!.url}/v1/health`, { ca: readFileSync(cert) }, (res) => {
          let text = '';
          res.setEncoding('utf8').on('data', (d: string) => (text += d));
          res.on('end', () => resolve(text));
        });
        req.on('error', reject);
        req.end();
      });
      expect(JSON.parse(body)).toMatchObject({ ok: true, backend: 'memory' });
    } finally {
      dir.cleanup();
    }
  });
});

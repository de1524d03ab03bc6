/**
 * The lock service with `--auth`: 401 without a known bearer token, 403 outside the caller's
 * prefixes, listings filtered to them, and isolation — caller B cannot see, renew or release A's
 * leases or use A's session (a release of A's lease answers 204 and leaves it held). Also the auth
 * file's format, checked field by field.
 */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { InvalidArgumentError } from '../../src/core/errors.js';
import { memoryBackend } from '../../src/memory/index.js';
import { createLockServer, type LockServerApp, loadAuthFile, parseAuthConfig } from '../../src/serve/index.js';
import { tempDir } from '../helpers/env.js';
import { AS_A, AS_B, AUTH, acquirePath, call, sha256 } from './helpers.js';

let app: LockServerApp | undefined;
afterEach(async () => {
  await app?.close();
  app = undefined;
});

async function server(): Promise<LockServerApp> {
  app = await createLockServer({ backend: memoryBackend({ sessions: true }), auth: AUTH });
  return app;
}

const keysListed = async (a: LockServerApp, headers: Record<string, string>, prefix?: string) => {
  const got = await call(a, 'GET', `/v1/locks${prefix === undefined ? '' : `?prefix=${encodeURIComponent(prefix)}`}`, undefined, headers);
  return got.status === 200 ? (got.body.locks as { key: string; holders: unknown[] }[]).filter((k) => k.holders.length > 0).map((k) => k.key) : got.status;
};

describe('authentication', () => {
  it('401 UNAUTHORIZED without a token, with an unknown one, or a malformed header — on every route, unknown ones too', async () => {
    const a = await server();
    const tries: Record<string, string>[] = [
      {},
      { authorization: 'Bearer nope' },
      { authorization: 'token-a' },
      { authorization: 'Basic dG9rZW4tYQ==' },
      { authorization: 'Bearer ' },
    ];
    for (const headers of tries) {
      for (const [method, url] of [
        ['POST', acquirePath('a/1')],
        ['GET', '/v1/locks'],
        ['GET', '/v1/health'],
        ['GET', '/no/such/route'],
      ] as const) {
        const got = await call(a, method, url, method === 'POST' ? {} : undefined, headers);
        expect(got.status, `${method} ${url} ${JSON.stringify(headers)}`).toBe(401);
        expect(got.body.code).toBe('UNAUTHORIZED');
      }
    }
    expect(await keysListed(a, AS_A)).toEqual([]);
  });

  it('a known token is its caller: the default label is its name', async () => {
    const a = await server();
    expect((await call(a, 'POST', acquirePath('a/1'), {}, AS_A)).status).toBe(200);
    const busy = await call(a, 'POST', acquirePath('a/1'), {}, { authorization: 'bearer token-a' });
    expect(busy.body).toMatchObject({ code: 'ACQUIRE_TIMEOUT', holder: 'svc-a' });
  });
});

describe('prefixes', () => {
  it('a key outside the caller’s prefixes is 403 on acquire and on a sequencer check, and nothing changes', async () => {
    const a = await server();
    expect(await call(a, 'POST', acquirePath('b/1'), {}, AS_A)).toMatchObject({ status: 403, body: { code: 'FORBIDDEN' } });
    expect(await call(a, 'POST', acquirePath('ab/1'), {}, AS_A)).toMatchObject({ status: 403 });
    const seq = (await call(a, 'POST', acquirePath('b/1'), {}, AS_B)).body.sequencer as string;
    expect(await call(a, 'POST', '/v1/sequencers/check', { sequencer: seq }, AS_A)).toMatchObject({ status: 403, body: { code: 'FORBIDDEN' } });
    expect(await call(a, 'POST', '/v1/sequencers/check', { sequencer: seq }, AS_B)).toMatchObject({ status: 200, body: { valid: true } });
    expect(await keysListed(a, AS_B)).toEqual(['b/1']);
  });

  it('listings are filtered to the caller’s prefixes; a prefix outside them is 403', async () => {
    const a = await server();
    await call(a, 'POST', acquirePath('a/1'), {}, AS_A);
    await call(a, 'POST', acquirePath('b/1'), {}, AS_B);
    await call(a, 'POST', acquirePath('shared/1'), {}, AS_B);
    expect(await keysListed(a, AS_A)).toEqual(['a/1']);
    expect(await keysListed(a, AS_B)).toEqual(['b/1', 'shared/1']);
    expect(await keysListed(a, AS_B, 'sh')).toEqual(['shared/1']);
    expect(await keysListed(a, AS_B, 'b/1')).toEqual(['b/1']);
    expect(await keysListed(a, AS_A, 'b/')).toBe(403);
    expect(await keysListed(a, AS_A, 'z')).toBe(403);
  });
});

describe('isolation between callers', () => {
  it('B cannot renew or release A’s lease: renew is 410, release is 204 and the lease stays held', async () => {
    const a = await server();
    const got = (await call(a, 'POST', acquirePath('a/job'), { ttlMs: 10_000 }, AS_A)).body as { lease: string; token: string };
    expect(await call(a, 'POST', `/v1/leases/${got.lease}/renew`, {}, AS_B)).toMatchObject({ status: 410, body: { code: 'LEASE_LOST' } });
    expect((await call(a, 'DELETE', `/v1/leases/${got.lease}`, undefined, AS_B)).status).toBe(204);
    expect(await keysListed(a, AS_A)).toEqual(['a/job']);
    expect((await call(a, 'POST', acquirePath('a/job'), {}, AS_A)).status).toBe(409);
    expect((await call(a, 'POST', `/v1/leases/${got.lease}/renew`, {}, AS_A)).status).toBe(200);
  });

  it('the same Idempotency-Key from two callers is two owners: B does not get A’s grant', async () => {
    const a = await server();
    const auth = parseAuthConfig({
      callers: [
        { name: 'one', tokenSha256: sha256('t1'), prefixes: [''] },
        { name: 'two', tokenSha256: sha256('t2'), prefixes: [''] },
      ],
    });
    await a.close();
    app = await createLockServer({ backend: memoryBackend(), auth });
    expect((await call(app, 'POST', acquirePath('k'), {}, { authorization: 'Bearer t1', 'idempotency-key': 'same' })).status).toBe(200);
    expect((await call(app, 'POST', acquirePath('k'), {}, { authorization: 'Bearer t2', 'idempotency-key': 'same' })).status).toBe(409);
  });

  it('B cannot use A’s session: keep-alive 404, acquire 404, close 204 that ends nothing', async () => {
    const a = await server();
    const { session } = (await call(a, 'POST', '/v1/sessions', { ttlMs: 10_000 }, AS_A)).body as { session: string };
    const held = (await call(a, 'POST', acquirePath('a/s'), { session }, AS_A)).body as { lease: string };
    expect(await call(a, 'POST', `/v1/sessions/${session}/keepalive`, {}, AS_B)).toMatchObject({ status: 404, body: { field: 'session' } });
    expect(await call(a, 'POST', acquirePath('shared/x'), { session }, AS_B)).toMatchObject({ status: 404, body: { field: 'session' } });
    expect((await call(a, 'DELETE', `/v1/sessions/${session}`, undefined, AS_B)).status).toBe(204);
    expect(await call(a, 'POST', `/v1/sessions/${session}/keepalive`, {}, AS_A)).toMatchObject({ status: 200 });
    expect(await keysListed(a, AS_A)).toEqual(['a/s']);
    expect((await call(a, 'POST', `/v1/leases/${held.lease}/renew`, {}, AS_A)).status).toBe(200);
  });
});

describe('the auth file', () => {
  it('loads the documented format; the hash is `printf %s "$TOKEN" | sha256sum`, upper or lower case', () => {
    const dir = tempDir();
    try {
      const path = join(dir.path, 'auth.json');
      writeFileSync(path, JSON.stringify({ callers: [{ name: 'svc-a', tokenSha256: sha256('s3cret').toUpperCase(), prefixes: ['tenant-a/', ''] }] }));
      const auth = loadAuthFile(path);
      expect(auth.callers.map((c) => [c.name, c.prefixes])).toEqual([['svc-a', ['tenant-a/', '']]]);
      writeFileSync(path, '{ "callers": ');
      expect(() => loadAuthFile(path)).toThrow(/--auth.*not JSON/);
      expect(() => loadAuthFile(join(dir.path, 'missing.json'))).toThrow(/cannot read/);
    } finally {
      dir.cleanup();
    }
  });

  it('refuses what is not the format, naming the field', () => {
    const ok = { name: 'x', tokenSha256: sha256('t'), prefixes: [''] };
    const cases: [unknown, string][] = [
      [[], 'auth'],
      [{}, 'auth.callers'],
      [{ callers: [] }, 'auth.callers'],
      [{ callers: [ok], extra: 1 }, 'auth.extra'],
      [{ callers: [{ ...ok, role: 'admin' }] }, 'auth.callers[0].role'],
      [{ callers: [{ ...ok, name: '' }] }, 'auth.callers[0].name'],
      [{ callers: [{ ...ok, tokenSha256: 'abc' }] }, 'auth.callers[0].tokenSha256'],
      [{ callers: [{ ...ok, prefixes: [] }] }, 'auth.callers[0].prefixes'],
      [{ callers: [{ ...ok, prefixes: ['a\0'] }] }, 'auth.callers[0].prefixes[0]'],
      [{ callers: [ok, { ...ok, tokenSha256: sha256('u') }] }, 'auth.callers[1].name'],
      [{ callers: [ok, { ...ok, name: 'y' }] }, 'auth.callers[1].tokenSha256'],
    ];
    for (const [value, argument] of cases) {
      let error: unknown;
      try {
        parseAuthConfig(value);
      } catch (e) {
        error = e;
      }
      expect(error, JSON.stringify(value)).toBeInstanceOf(InvalidArgumentError);
      expect((error as InvalidArgumentError).argument, JSON.stringify(value)).toBe(argument);
    }
  });
});

/**
 * The lock service's routes through fastify's inject, over the memory backend: each route's answer
 * and each error status of docs/http-api.md's table that needs no network (400 naming the field,
 * unknown fields, waitMs over 60 s, malformed key encodings and handles, 404, 409 with the holder,
 * 410, 413, 501), sessions, semaphores, Idempotency-Key retries and min-hold — and that refused
 * requests change nothing.
 */
import { afterEach, describe, expect, it } from 'vitest';
import type { Backend } from '../../src/core/backend.js';
import { parseSequencer } from '../../src/core/token.js';
import { memoryBackend } from '../../src/memory/index.js';
import { createLockServer, type LockServerApp } from '../../src/serve/index.js';
import { acquirePath, call } from './helpers.js';

let app: LockServerApp | undefined;
afterEach(async () => {
  await app?.close();
  app = undefined;
});

async function server(backend: Backend = memoryBackend({ sessions: true }), extra: { wallNow?: () => number } = {}): Promise<LockServerApp> {
  app = await createLockServer({ backend, ...extra });
  return app;
}

/** The holders of `key` in a listing ([] when the key is free: the memory backend does not list free keys). */
const holdersOf = (locks: Record<string, unknown>[], key: string) => (locks.find((k) => k.key === key)?.holders as unknown[] | undefined) ?? [];

const listing = async (a: LockServerApp, prefix = '') =>
  (await call(a, 'GET', `/v1/locks?prefix=${encodeURIComponent(prefix)}`)).body.locks as Record<string, unknown>[];

describe('acquire, renew, release', () => {
  it('acquire answers the grant (handle, token as a string, sequencer, ttl, mode); a busy key is 409 with the holder', async () => {
    const a = await server();
    const got = await call(a, 'POST', acquirePath('tenant/42'), { ttlMs: 5_000, label: 'cron-1' });
    expect(got.status).toBe(200);
    expect(got.body).toMatchObject({ key: 'tenant/42', token: '1', ttlMs: 5_000, mode: 'exclusive' });
    expect(got.body.lease).toMatch(/^lhl1\.[A-Za-z0-9_-]+$/);
    expect(parseSequencer(got.body.sequencer)).toMatchObject({ key: 'tenant/42', token: 1n, mode: 'exclusive' });
    const busy = await call(a, 'POST', acquirePath('tenant/42'), {});
    expect(busy.status).toBe(409);
    expect(busy.body).toMatchObject({ code: 'ACQUIRE_TIMEOUT', holder: 'cron-1' });
    expect(await listing(a)).toMatchObject([{ key: 'tenant/42', lastToken: '1', holders: [{ token: '1', holder: 'cron-1', mode: 'exclusive' }], waiters: 0 }]);
  });

  it('renew answers the ttl (the grant’s by default, or the body’s); after the release it is 410 LEASE_LOST', async () => {
    const a = await server();
    const { lease } = (await call(a, 'POST', acquirePath('k'), { ttlMs: 4_000 })).body as { lease: string };
    expect(await call(a, 'POST', `/v1/leases/${lease}/renew`)).toMatchObject({ status: 200, body: { ttlMs: 4_000 } });
    expect(await call(a, 'POST', `/v1/leases/${lease}/renew`, { ttlMs: 9_000 })).toMatchObject({ status: 200, body: { ttlMs: 9_000 } });
    const [k] = await listing(a);
    expect((k!.holders as { expiresInMs: number }[])[0]!.expiresInMs).toBeGreaterThan(4_000);
    expect((await call(a, 'DELETE', `/v1/leases/${lease}`)).status).toBe(204);
    const lost = await call(a, 'POST', `/v1/leases/${lease}/renew`);
    expect(lost).toMatchObject({ status: 410, body: { code: 'LEASE_LOST' } });
  });

  it('release is 204 and idempotent, and frees the key for the next token', async () => {
    const a = await server();
    const { lease } = (await call(a, 'POST', acquirePath('k'), {})).body as { lease: string };
    expect((await call(a, 'DELETE', `/v1/leases/${lease}`)).status).toBe(204);
    expect((await call(a, 'DELETE', `/v1/leases/${lease}`)).status).toBe(204);
    expect((await call(a, 'POST', acquirePath('k'), {})).body).toMatchObject({ token: '2' });
  });

  it('the same Idempotency-Key gets the same grant back; another key is busy', async () => {
    const a = await server();
    const first = await call(a, 'POST', acquirePath('k'), { ttlMs: 5_000 }, { 'idempotency-key': 'owner-1' });
    const again = await call(a, 'POST', acquirePath('k'), { ttlMs: 5_000 }, { 'idempotency-key': 'owner-1' });
    expect(again.status).toBe(200);
    expect(again.body.token).toBe(first.body.token);
    expect(again.body.lease).toBe(first.body.lease);
    expect((await call(a, 'POST', acquirePath('k'), {}, { 'idempotency-key': 'owner-2' })).status).toBe(409);
    expect((await call(a, 'POST', acquirePath('k'), {}, { 'idempotency-key': 'bad key with spaces' })).body).toMatchObject({
      code: 'INVALID_ARGUMENT',
      field: 'Idempotency-Key',
    });
  });

  it('any key round-trips as one URL-encoded path segment, up to the longest (1,024 UTF-8 bytes)', async () => {
    const a = await server();
    for (const key of ['a/b/c', '100% sure?', 'ключ 🔑', '#hash&amp=1', '😀'.repeat(256)]) {
      const got = await call(a, 'POST', acquirePath(key), {});
      expect(got.status, key.slice(0, 20)).toBe(200);
      expect(got.body.key).toBe(key);
      expect(parseSequencer(got.body.sequencer).key).toBe(key);
      expect((await call(a, 'DELETE', `/v1/leases/${got.body.lease}`)).status).toBe(204);
    }
  });

  it('a semaphore: limit 2 grants two permits (shared), the third is busy; another limit is a 400 naming both', async () => {
    const a = await server();
    const p1 = await call(a, 'POST', acquirePath('pool'), { limit: 2 });
    const p2 = await call(a, 'POST', acquirePath('pool'), { limit: 2 });
    expect([p1.body.mode, p2.body.mode, p1.body.token, p2.body.token]).toEqual(['shared', 'shared', '1', '2']);
    expect((await call(a, 'POST', acquirePath('pool'), { limit: 2 })).status).toBe(409);
    const conflict = await call(a, 'POST', acquirePath('pool'), { limit: 3 });
    expect(conflict).toMatchObject({ status: 400, body: { code: 'INVALID_ARGUMENT', field: 'limit' } });
    expect(conflict.body.message).toMatch(/2 permits.*3 permits/);
    expect(await listing(a)).toMatchObject([{ key: 'pool', limit: 2, holders: [{ token: '1' }, { token: '2' }] }]);
    expect((await call(a, 'POST', `/v1/leases/${p1.body.lease}/renew`)).status).toBe(200);
  });

  it('minHoldMs: a release before the hold ends keeps the key until then (it expires); after it, a release frees the key', async () => {
    let wall = 1_000_000;
    const a = await server(memoryBackend(), { wallNow: () => wall });
    const { lease } = (await call(a, 'POST', acquirePath('nightly'), { ttlMs: 60_000, minHoldMs: 3_000 })).body as { lease: string };
    wall += 1_000;
    expect((await call(a, 'DELETE', `/v1/leases/${lease}`)).status).toBe(204);
    const [held] = await listing(a);
    const expires = (held!.holders as { expiresInMs: number }[])[0]!.expiresInMs;
    expect(expires).toBeGreaterThan(1_000);
    expect(expires).toBeLessThanOrEqual(2_000);
    expect((await call(a, 'POST', acquirePath('nightly'), {})).status).toBe(409);
    wall += 5_000;
    expect((await call(a, 'DELETE', `/v1/leases/${lease}`)).status).toBe(204);
    expect(holdersOf(await listing(a), 'nightly')).toEqual([]);
  });
});

describe('sessions', () => {
  it('open (201), acquire with it (the session’s ttl), keep-alive (200), close (204) frees its leases; afterwards 404 naming the session', async () => {
    const a = await server();
    const opened = await call(a, 'POST', '/v1/sessions', { ttlMs: 7_000 });
    expect(opened.status).toBe(201);
    expect(opened.body).toMatchObject({ ttlMs: 7_000 });
    const session = opened.body.session as string;
    expect(session).toMatch(/^lhs1\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$/);
    const got = await call(a, 'POST', acquirePath('s'), { session, ttlMs: 1_000 });
    expect(got.body).toMatchObject({ ttlMs: 7_000, token: '1' });
    expect(await call(a, 'POST', `/v1/sessions/${session}/keepalive`)).toMatchObject({ status: 200, body: { ttlMs: 7_000 } });
    expect(await call(a, 'POST', `/v1/sessions/${session}/keepalive`, { ttlMs: 9_000 })).toMatchObject({ status: 200, body: { ttlMs: 9_000 } });
    expect((await call(a, 'POST', `/v1/leases/${got.body.lease}/renew`)).status).toBe(200);
    expect((await call(a, 'DELETE', `/v1/sessions/${session}`)).status).toBe(204);
    expect(holdersOf(await listing(a), 's')).toEqual([]);
    expect(await call(a, 'POST', `/v1/sessions/${session}/keepalive`)).toMatchObject({ status: 404, body: { code: 'NOT_FOUND', field: 'session' } });
    expect(await call(a, 'POST', acquirePath('s'), { session })).toMatchObject({ status: 404, body: { field: 'session' } });
    expect((await call(a, 'POST', `/v1/leases/${got.body.lease}/renew`)).status).toBe(410);
    expect((await call(a, 'DELETE', `/v1/sessions/${session}`)).status).toBe(204);
  });

  it('a POST without a body, or with an empty one, opens a session with the default ttl', async () => {
    const a = await server();
    expect((await call(a, 'POST', '/v1/sessions')).body).toMatchObject({ ttlMs: 30_000 });
    const empty = await a.inject({ method: 'POST', url: '/v1/sessions', headers: { 'content-type': 'application/json' }, payload: '' });
    expect(empty.statusCode).toBe(201);
  });

  it('a session with minHoldMs is a 400; a malformed session handle is a 400 naming it', async () => {
    const a = await server();
    const { session } = (await call(a, 'POST', '/v1/sessions')).body as { session: string };
    expect((await call(a, 'POST', acquirePath('k'), { session, minHoldMs: 1_000 })).body).toMatchObject({ code: 'INVALID_ARGUMENT', field: 'minHoldMs' });
    for (const bad of ['nope', 'lhs1.', 'lhs1.AAAA', `${session}x`, session.replace('lhs1.', 'lhs2.')]) {
      expect((await call(a, 'POST', acquirePath('k'), { session: bad })).body, bad).toMatchObject({ code: 'INVALID_ARGUMENT', field: 'session' });
    }
    expect(await listing(a)).toEqual([]);
  });

  it('a backend without sessions: POST /v1/sessions is 501 NOT_SUPPORTED', async () => {
    const a = await server(memoryBackend());
    expect(await call(a, 'POST', '/v1/sessions')).toMatchObject({ status: 501, body: { code: 'NOT_SUPPORTED' } });
    expect((await call(a, 'GET', '/v1/health')).body).toMatchObject({ capabilities: { sessions: false } });
  });
});

describe('listing, sequencer check, health', () => {
  it('GET /v1/locks lists under the prefix, tokens as strings; an unknown query parameter is a 400', async () => {
    const a = await server();
    await call(a, 'POST', acquirePath('x/1'), {});
    await call(a, 'POST', acquirePath('y/1'), { mode: 'shared' });
    expect((await listing(a, 'x/')).map((k) => k.key)).toEqual(['x/1']);
    expect(await listing(a)).toMatchObject([{ key: 'x/1' }, { key: 'y/1', holders: [{ mode: 'shared', token: '1' }] }]);
    expect((await call(a, 'GET', '/v1/locks?prefx=x')).body).toMatchObject({ code: 'INVALID_ARGUMENT', field: 'prefx' });
  });

  it('POST /v1/sequencers/check: valid while held, not after; lastToken; a malformed sequencer is a 400', async () => {
    const a = await server();
    const got = (await call(a, 'POST', acquirePath('doc/1'), {})).body as { lease: string; sequencer: string };
    expect((await call(a, 'POST', '/v1/sequencers/check', { sequencer: got.sequencer })).body).toEqual({
      valid: true,
      key: 'doc/1',
      mode: 'exclusive',
      token: '1',
      lastToken: '1',
    });
    await call(a, 'DELETE', `/v1/leases/${got.lease}`);
    // lastToken: null here, as the memory backend does not list a free key (the doc says so).
    expect((await call(a, 'POST', '/v1/sequencers/check', { sequencer: got.sequencer })).body).toMatchObject({ valid: false, token: '1' });
    expect((await call(a, 'POST', '/v1/sequencers/check', { sequencer: 'lh1.e.5.bmV2ZXI' })).body).toMatchObject({ valid: false, lastToken: null });
    expect((await call(a, 'POST', '/v1/sequencers/check', { sequencer: 'lh1.x.1.YQ' })).body).toMatchObject({ code: 'INVALID_ARGUMENT', field: 'sequencer' });
    expect((await call(a, 'POST', '/v1/sequencers/check', {})).body).toMatchObject({ code: 'INVALID_ARGUMENT', field: 'sequencer' });
  });

  it('GET /v1/health answers the backend and its capabilities', async () => {
    const a = await server();
    expect(await call(a, 'GET', '/v1/health')).toMatchObject({
      status: 200,
      body: { ok: true, backend: 'memory', capabilities: { fair: true, minTtlMs: 0, sessions: true } },
    });
  });
});

describe('bad input: a 4xx naming the field, and nothing changes', () => {
  const cases: [string, string, unknown, string][] = [
    ['unknown field', acquirePath('k'), { ttlMs: 1_000, ttl: 5 }, 'ttl'],
    ['waitMs over 60 s', acquirePath('k'), { waitMs: 60_001 }, 'waitMs'],
    ['a number as a string', acquirePath('k'), { ttlMs: '5000' }, 'ttlMs'],
    ['a ttl under the minimum', acquirePath('k'), { ttlMs: 5 }, 'ttlMs'],
    ['a fraction', acquirePath('k'), { lockDelayMs: 1.5 }, 'lockDelayMs'],
    ['an unknown mode', acquirePath('k'), { mode: 'read' }, 'mode'],
    ['exclusive with a limit of 3', acquirePath('k'), { mode: 'exclusive', limit: 3 }, 'limit'],
    ['a label with a newline', acquirePath('k'), { label: 'a\nb' }, 'label'],
    ['a key with NUL', '/v1/locks/a%00b/acquire', {}, 'key'],
    ['a key over 1,024 bytes', acquirePath('x'.repeat(1_025)), {}, 'key'],
    ['a malformed percent-encoding', '/v1/locks/a%E0%A4%A/acquire', {}, 'path'],
    ['percent-encoded bytes that are not UTF-8', '/v1/locks/%FF%FE/acquire', {}, 'path'],
    ['a body that is an array', acquirePath('k'), [1], 'body'],
    ['a body that is not JSON', acquirePath('k'), '{"ttlMs":', 'body'],
    ['a malformed lease handle (renew)', '/v1/leases/lhl1.AAAA/renew', {}, 'lease'],
    ['a lease handle of another kind (renew)', '/v1/leases/not-a-handle/renew', {}, 'lease'],
    ['an unknown field on renew', '/v1/leases/lhl1.AAAA/renew', { ttl: 1 }, 'ttl'],
    ['an unknown field on a session open', '/v1/sessions', { ttlMs: 1_000, x: 1 }, 'x'],
  ];
  for (const [name, url, body, field] of cases) {
    it(`${name}: 400 naming ${field}`, async () => {
      const a = await server();
      const got = await call(a, 'POST', url, body);
      expect(got.status).toBe(400);
      expect(got.body).toMatchObject({ code: 'INVALID_ARGUMENT', field });
      expect(got.body.message).toEqual(expect.any(String));
      expect(await listing(a)).toEqual([]);
    });
  }

  it('a malformed lease handle on DELETE is a 400; a well-formed unknown one is a 204', async () => {
    const a = await server();
    expect((await call(a, 'DELETE', '/v1/leases/lhl1.AAAA')).body).toMatchObject({ field: 'lease' });
    const { lease } = (await call(a, 'POST', acquirePath('k'), {})).body as { lease: string };
    await call(a, 'DELETE', `/v1/leases/${lease}`);
    expect((await call(a, 'DELETE', `/v1/leases/${lease}`)).status).toBe(204);
  });

  it('a body over 64 KiB is 413 PAYLOAD_TOO_LARGE', async () => {
    const a = await server();
    const got = await call(a, 'POST', acquirePath('k'), { label: 'x'.repeat(70_000) });
    expect(got).toMatchObject({ status: 413, body: { code: 'PAYLOAD_TOO_LARGE' } });
  });

  it('a body that is not JSON (text/plain) is a 400 naming the content-type', async () => {
    const a = await server();
    const got = await a.inject({ method: 'POST', url: acquirePath('k'), headers: { 'content-type': 'text/plain' }, payload: 'ttlMs=5' });
    expect(got.statusCode).toBe(400);
    expect(got.json()).toMatchObject({ code: 'INVALID_ARGUMENT', field: 'content-type' });
  });

  it('an unknown route or method is 404 NOT_FOUND, and its message does not repeat the path beyond the route', async () => {
    const a = await server();
    expect(await call(a, 'GET', '/v2/locks')).toMatchObject({ status: 404, body: { code: 'NOT_FOUND' } });
    expect(await call(a, 'PUT', '/v1/locks/k/acquire', {})).toMatchObject({ status: 404, body: { code: 'NOT_FOUND' } });
    const secret = await call(a, 'GET', '/v1/leases/lhl1.SECRETHANDLE');
    expect(secret.status).toBe(404);
    expect(JSON.stringify(secret.body)).not.toContain('SECRETHANDLE');
  });
});

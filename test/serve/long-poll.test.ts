import { describe, expect, it } from 'vitest';
import { memoryBackend } from '../../src/memory/index.js';
import { startLockServer } from '../../src/serve/index.js';
import { eventually, sleep } from '../helpers/env.js';
import { acquirePath, http } from './helpers.js';
import { listeningServers, waitersOf } from './listening.js';

const { start, sqliteUrl } = listeningServers('longpoll');

describe.each([
  ['memory', () => ({ backend: memoryBackend() })],
  ['sqlite', () => ({ url: sqliteUrl() })],
])('long poll over %s', (_name, options) => {
  it('a waiter is woken by the holder’s release, in arrival order, and is a waiter meanwhile', async () => {
    const s = await start(options());
    const held = await http(s.url, 'POST', acquirePath('job'), { ttlMs: 30_000, label: 'first' });
    expect(held.status).toBe(200);
    const second = http(s.url, 'POST', acquirePath('job'), { ttlMs: 30_000, waitMs: 20_000, label: 'second' });
    expect(await eventually(async () => (await waitersOf(s.url, 'job')) === 1, 10_000)).toBe(true);
    const third = http(s.url, 'POST', acquirePath('job'), { ttlMs: 30_000, waitMs: 20_000, label: 'third' });
    expect(await eventually(async () => (await waitersOf(s.url, 'job')) === 2, 10_000)).toBe(true);
    expect((await http(s.url, 'DELETE', `/v1/leases/${held.body.lease}`)).status).toBe(204);
    const got = await second;
    expect(got).toMatchObject({ status: 200, body: { token: '2' } });
    expect((await http(s.url, 'DELETE', `/v1/leases/${got.body.lease}`)).status).toBe(204);
    expect(await third).toMatchObject({ status: 200, body: { token: '3' } });
  });

  it('a wait that runs out is a 409 naming the holder, and leaves no waiter behind', async () => {
    const s = await start(options());
    await http(s.url, 'POST', acquirePath('busy'), { label: 'holder-1' });
    const got = await http(s.url, 'POST', acquirePath('busy'), { waitMs: 300 });
    expect(got).toMatchObject({ status: 409, body: { code: 'ACQUIRE_TIMEOUT', holder: 'holder-1' } });
    expect(await eventually(async () => (await waitersOf(s.url, 'busy')) === 0, 5_000)).toBe(true);
  });
});

describe('long poll: disconnects, restarts, closing', () => {
  it('a client that disconnects while waiting leaves the queue, and is not granted the key afterwards', async () => {
    const s = await start({ backend: memoryBackend() });
    const held = await http(s.url, 'POST', acquirePath('k'), {});
    const stop = new AbortController();
    const waiting = http(s.url, 'POST', acquirePath('k'), { waitMs: 30_000 }, {}, stop.signal).catch((e: unknown) => e);
    expect(await eventually(async () => (await waitersOf(s.url, 'k')) === 1, 10_000)).toBe(true);
    stop.abort();
    expect(await waiting).toBeInstanceOf(Error);
    expect(await eventually(async () => (await waitersOf(s.url, 'k')) === 0, 10_000)).toBe(true);
    await http(s.url, 'DELETE', `/v1/leases/${held.body.lease}`);
    await sleep(100);
    const { body } = await http(s.url, 'GET', '/v1/locks');
    expect((body.locks as { holders: unknown[] }[]).flatMap((k) => k.holders)).toEqual([]);
    expect((await http(s.url, 'POST', acquirePath('k'), {})).body).toMatchObject({ token: '2' });
  });

  it('a lease taken through one server is renewed and released through another, and after the first is closed and a new one started', async () => {
    const url = sqliteUrl();
    const one = await start({ url });
    const two = await start({ url });
    const got = await http(one.url, 'POST', acquirePath('shared'), { ttlMs: 5_000 });
    expect(await http(two.url, 'POST', `/v1/leases/${got.body.lease}/renew`, { ttlMs: 8_000 })).toMatchObject({ status: 200, body: { ttlMs: 8_000 } });
    await one.close();
    const three = await start({ url });
    expect((await http(three.url, 'POST', `/v1/leases/${got.body.lease}/renew`)).status).toBe(200);
    expect((await http(two.url, 'POST', acquirePath('shared'), {})).status).toBe(409);
    expect((await http(three.url, 'DELETE', `/v1/leases/${got.body.lease}`)).status).toBe(204);
    expect(await http(two.url, 'POST', acquirePath('shared'), {})).toMatchObject({ status: 200, body: { token: '2' } });
  });

  it('a session opened through one server is kept alive and closed through another', async () => {
    const backend = memoryBackend({ sessions: true });
    const one = await start({ backend });
    const two = await start({ backend });
    const { session } = (await http(one.url, 'POST', '/v1/sessions', { ttlMs: 5_000 })).body as { session: string };
    expect((await http(two.url, 'POST', acquirePath('s'), { session })).status).toBe(200);
    expect((await http(two.url, 'POST', `/v1/sessions/${session}/keepalive`)).status).toBe(200);
    expect((await http(one.url, 'POST', acquirePath('s'), {})).status).toBe(409);
    expect((await http(two.url, 'DELETE', `/v1/sessions/${session}`)).status).toBe(204);
    expect((await http(one.url, 'POST', acquirePath('s'), {})).status).toBe(200);
  });

  it('closing the server ends a waiting long poll at once with 503 CLOSED, and leaves no waiter', async () => {
    const backend = memoryBackend();
    const s = await startLockServer({ backend, host: '127.0.0.1', port: 0 });
    await http(s.url, 'POST', acquirePath('k'), {});
    const waiting = http(s.url, 'POST', acquirePath('k'), { waitMs: 60_000 }).catch((e: unknown) => e);
    expect(await eventually(async () => (await waitersOf(s.url, 'k')) === 1, 10_000)).toBe(true);
    const started = performance.now();
    await s.close();
    const answer = await waiting;
    // The poll was answered (503 CLOSED) or its connection cut by the close; either way long before its 60 s.
    expect(answer).toMatchObject({ status: 503, body: { code: 'CLOSED' } });
    expect(performance.now() - started).toBeLessThan(30_000);
    expect(await eventually(async () => ((await backend.inspect('k'))[0]?.waiters ?? 0) === 0, 5_000)).toBe(true);
    await backend.close();
  });
});

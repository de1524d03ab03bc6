/**
 * GET /v1/events on a listening server (real HTTP, real SSE): grants, releases, expiries and
 * take-overs as `event: change` with exactly { kind, key, token, holder, mode }, filtered to the
 * query prefix and the caller's prefixes (401/403 as the other routes, 400 for a bad prefix);
 * one shared Watcher per prefix, started by the first listener and stopped with the last (seen
 * from the backend: its watches and reads); `: keep-alive` comments within 15 s; the server's
 * close ends the streams; over PostgreSQL, a stream on one server tells of a release made through
 * another.
 */
import { join } from 'node:path';
import pg from 'pg';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import type { Backend } from '../../src/core/backend.js';
import { memoryBackend } from '../../src/memory/index.js';
import { type RunningLockServer, startLockServer } from '../../src/serve/index.js';
import { eventually, PG_URL, sleep, tempDir, uniqueName } from '../helpers/env.js';
import { AS_A, AS_B, AUTH, acquirePath, http } from './helpers.js';
import { openSse, type SseMessage, type SseStream } from './sse.js';

const servers: RunningLockServer[] = [];
const streams: SseStream[] = [];
const dirs: { cleanup(): void }[] = [];
afterEach(async () => {
  for (const s of streams.splice(0)) s.close();
  await Promise.allSettled(servers.splice(0).map((s) => s.close()));
  for (const d of dirs.splice(0)) d.cleanup();
});

async function start(options: Parameters<typeof startLockServer>[0]): Promise<RunningLockServer> {
  const s = await startLockServer({ host: '127.0.0.1', port: 0, ...options });
  servers.push(s);
  return s;
}

async function events(s: RunningLockServer, query = '', headers: Record<string, string> = {}): Promise<SseStream> {
  const stream = await openSse(`${s.url}/v1/events${query}`, headers);
  streams.push(stream);
  return stream;
}

function sqliteUrl(): string {
  const dir = tempDir();
  dirs.push(dir);
  return `sqlite:${join(dir.path, 'locks.db')}`;
}

const change = (kind: string, key: string) => (m: SseMessage) =>
  m.event === 'change' && (m.data as { kind: string }).kind === kind && (m.data as { key: string }).key === key;

/** A memory backend that counts its `inspect` calls and the `watch` subscriptions alive. */
function countingBackend(): { backend: Backend; inspects: () => number; watches: () => number } {
  const inner = memoryBackend();
  let inspects = 0;
  let watches = 0;
  const backend: Backend = {
    ...inner,
    inspect: (prefix) => {
      inspects++;
      return inner.inspect(prefix);
    },
    watch: async (key, onChange) => {
      const off = await inner.watch!(key, onChange);
      watches++;
      let on = true;
      return () => {
        if (on) watches--;
        on = false;
        off?.();
      };
    },
  };
  return { backend, inspects: () => inspects, watches: () => watches };
}

describe.each([
  ['memory', () => ({ backend: memoryBackend() })],
  ['sqlite', () => ({ url: sqliteUrl() })],
])('GET /v1/events over %s', (_name, options) => {
  it('tells of a grant and a release, with exactly kind, key, token (a string), holder and mode', async () => {
    const s = await start(options());
    const stream = await events(s);
    expect(stream.status).toBe(200);
    expect(stream.headers.get('content-type')).toBe('text/event-stream; charset=utf-8');
    const held = await http(s.url, 'POST', acquirePath('job/1'), { ttlMs: 30_000, label: 'worker-1' });
    expect(held.status).toBe(200);
    const granted = await stream.next(change('granted', 'job/1'));
    expect(granted.data).toStrictEqual({ kind: 'granted', key: 'job/1', token: held.body.token, holder: 'worker-1', mode: 'exclusive' });
    expect((await http(s.url, 'DELETE', `/v1/leases/${held.body.lease}`)).status).toBe(204);
    const released = await stream.next(change('released', 'job/1'));
    expect(released.data).toStrictEqual({ kind: 'released', key: 'job/1', token: held.body.token, holder: 'worker-1', mode: 'exclusive' });
    // Nothing secret went by: no lease handle, no owner id.
    const wire = JSON.stringify(stream.messages);
    expect(wire).not.toContain(held.body.lease as string);
    expect(wire).not.toContain('http:');
  });

  it('tells of an expiry, and of a take-over by a waiter after the holder’s lease ran out', async () => {
    const s = await start(options());
    const stream = await events(s, '?prefix=zombie');
    const first = await http(s.url, 'POST', acquirePath('zombie'), { ttlMs: 600, label: 'stuck' });
    expect(first.status).toBe(200);
    await stream.next(change('granted', 'zombie'));
    // The holder never renews: its lease runs out and the waiter takes the key.
    const second = await http(s.url, 'POST', acquirePath('zombie'), { ttlMs: 30_000, waitMs: 10_000, label: 'next' });
    expect(second.status).toBe(200);
    const took = await stream.next((m) => m.event === 'change' && (m.data as { token: string }).token === second.body.token);
    expect(took.data).toStrictEqual({ kind: 'taken-over', key: 'zombie', token: second.body.token, holder: 'next', mode: 'exclusive' });
    const expiredOrNot = stream.messages.filter(change('expired', 'zombie'));
    // The expiry is told on its own when a read fell between it and the new grant, else folded into the take-over.
    for (const m of expiredOrNot) expect(m.data).toStrictEqual({ kind: 'expired', key: 'zombie', token: first.body.token, holder: 'stuck', mode: 'exclusive' });

    const lone = await http(s.url, 'POST', acquirePath('zombie/alone'), { ttlMs: 500, label: 'alone', mode: 'shared' });
    await stream.next(change('granted', 'zombie/alone'));
    const expired = await stream.next(change('expired', 'zombie/alone'), 10_000);
    expect(expired.data).toStrictEqual({ kind: 'expired', key: 'zombie/alone', token: lone.body.token, holder: 'alone', mode: 'shared' });
  });

  it('is filtered to the query prefix', async () => {
    const s = await start(options());
    const stream = await events(s, `?prefix=${encodeURIComponent('tenant/7/')}`);
    await http(s.url, 'POST', acquirePath('tenant/8/x'), {});
    await http(s.url, 'POST', acquirePath('tenant/7/x'), {});
    await stream.next(change('granted', 'tenant/7/x'));
    await http(s.url, 'POST', acquirePath('tenant/77'), {});
    await http(s.url, 'POST', acquirePath('tenant/7/y'), {});
    await stream.next(change('granted', 'tenant/7/y'));
    expect(stream.messages.map((m) => (m.data as { key: string }).key)).toEqual(['tenant/7/x', 'tenant/7/y']);
  });
});

describe('GET /v1/events: the request', () => {
  it('refuses an unknown query parameter and a bad prefix as GET /v1/locks does (400 naming it)', async () => {
    const s = await start({ backend: memoryBackend() });
    const unknown = await events(s, '?prefix=a&since=3');
    expect(unknown).toMatchObject({ status: 400, body: { code: 'INVALID_ARGUMENT', field: 'since' } });
    const long = await events(s, `?prefix=${'k'.repeat(1025)}`);
    expect(long).toMatchObject({ status: 400, body: { code: 'INVALID_ARGUMENT', field: 'prefix' } });
    const listing = await http(s.url, 'GET', `/v1/locks?prefix=${'k'.repeat(1025)}`);
    expect(listing).toMatchObject({ status: 400, body: { field: 'prefix' } });
  });

  it('with --auth: 401 without a token, 403 for a prefix outside the caller’s, and a caller is told only of its own keys', async () => {
    const s = await start({ backend: memoryBackend(), auth: AUTH });
    expect(await events(s)).toMatchObject({ status: 401, body: { code: 'UNAUTHORIZED' } });
    expect(await events(s, '', { authorization: 'Bearer nope' })).toMatchObject({ status: 401 });
    expect(await events(s, '?prefix=b/', AS_A)).toMatchObject({ status: 403, body: { code: 'FORBIDDEN' } });
    const a = await events(s, '', AS_A);
    const aNarrow = await events(s, `?prefix=${encodeURIComponent('a/x')}`, AS_A);
    const b = await events(s, '', AS_B);
    expect([a.status, aNarrow.status, b.status]).toEqual([200, 200, 200]);
    await http(s.url, 'POST', acquirePath('b/1'), {}, AS_B);
    await http(s.url, 'POST', acquirePath('shared/1'), {}, AS_B);
    await http(s.url, 'POST', acquirePath('a/1'), {}, AS_A);
    await http(s.url, 'POST', acquirePath('a/x1'), {}, AS_A);
    await a.next(change('granted', 'a/x1'));
    await aNarrow.next(change('granted', 'a/x1'));
    await b.next(change('granted', 'shared/1'));
    await b.next(change('granted', 'b/1'));
    await sleep(600);
    expect(a.messages.map((m) => (m.data as { key: string }).key).sort()).toEqual(['a/1', 'a/x1']);
    expect(aNarrow.messages.map((m) => (m.data as { key: string }).key)).toEqual(['a/x1']);
    expect(b.messages.map((m) => (m.data as { key: string }).key).sort()).toEqual(['b/1', 'shared/1']);
  });
});

describe('GET /v1/events: the stream', () => {
  it('one Watcher per prefix, shared by its listeners and stopped with the last: the backend is read and watched only while someone listens', async () => {
    const counted = countingBackend();
    const s = await start({ backend: counted.backend });
    await http(s.url, 'POST', acquirePath('w/1'), {});
    await http(s.url, 'POST', acquirePath('w/2'), {});
    await sleep(300);
    expect([counted.inspects(), counted.watches()]).toEqual([0, 0]);
    const one = await events(s, '?prefix=w/');
    const two = await events(s, '?prefix=w/');
    // Two listeners, one Watcher: each key shown is watched once.
    expect(await eventually(() => counted.watches() === 2, 5_000)).toBe(true);
    await sleep(300);
    expect(counted.watches()).toBe(2);
    one.close();
    await sleep(300);
    expect(counted.watches()).toBe(2);
    await http(s.url, 'POST', acquirePath('w/3'), {});
    await two.next(change('granted', 'w/3'));
    two.close();
    // The last listener gone: no watch left, and no more reads.
    expect(await eventually(() => counted.watches() === 0, 5_000)).toBe(true);
    await sleep(400);
    const reads = counted.inspects();
    await sleep(1_000);
    expect(counted.inspects()).toBe(reads);
  });

  it('sends a `: keep-alive` comment when it opens and at least every 15 s', async () => {
    const s = await start({ backend: memoryBackend() });
    const stream = await events(s);
    expect(await eventually(() => stream.comments.length >= 1, 2_000)).toBe(true);
    const opened = stream.comments[0]!.at;
    expect(stream.comments[0]!.text).toBe('keep-alive');
    expect(await eventually(() => stream.comments.length >= 2, 20_000, 100)).toBe(true);
    expect(stream.comments[1]!.text).toBe('keep-alive');
    // 15 s by the server's timer, give or take this loaded machine's scheduling.
    expect(stream.comments[1]!.at - opened).toBeLessThan(17_500);
  }, 30_000);

  it('ends every stream when the server closes, and the server closes at once', async () => {
    const s = await start({ backend: memoryBackend() });
    const one = await events(s);
    const two = await events(s, '?prefix=x');
    const closing = s.close();
    await Promise.all([one.ended, two.ended, closing]);
    expect(one.status).toBe(200);
  });
});

describe('GET /v1/events over PostgreSQL', () => {
  const schema = uniqueName('lh_serve_events');
  const url = `${PG_URL}${PG_URL.includes('?') ? '&' : '?'}schema=${schema}`;
  afterAll(async () => {
    const admin = new pg.Client({ connectionString: PG_URL });
    await admin.connect();
    try {
      await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
    } finally {
      await admin.end();
    }
  });

  it('a stream on server 2 tells of a release made through server 1, and of the next grant', async () => {
    const one = await start({ url });
    const two = await start({ url });
    const key = uniqueName('observed');
    const held = await http(one.url, 'POST', acquirePath(key), { ttlMs: 30_000, label: 'via-one' });
    expect(held.status).toBe(200);
    const stream = await events(two, `?prefix=${encodeURIComponent(key)}`);
    expect(stream.status).toBe(200);
    expect((await http(one.url, 'DELETE', `/v1/leases/${held.body.lease}`)).status).toBe(204);
    const released = await stream.next(change('released', key));
    expect(released.data).toStrictEqual({ kind: 'released', key, token: held.body.token, holder: 'via-one', mode: 'exclusive' });
    const again = await http(one.url, 'POST', acquirePath(key), { ttlMs: 30_000, label: 'again' });
    const granted = await stream.next(change('granted', key));
    expect(granted.data).toMatchObject({ token: again.body.token, holder: 'again' });
    await http(one.url, 'DELETE', `/v1/leases/${again.body.lease}`);
  });
});

/**
 * Backend.watch on PostgreSQL and what it costs the keys nobody watches: a grant that no queued
 * waiter needs to hear of NOTIFYs only while its key carries a live watch mark. Notifications are
 * observed with a plain LISTEN on the table's channel, and some tests read or write the watched
 * table on purpose (its layout is the subject).
 */
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AcquireRequest, Backend } from '../../src/core/backend.js';
import { Locks } from '../../src/core/locks.js';
import { postgresBackend } from '../../src/postgres/index.js';
import { schemaNames } from '../../src/postgres/schema.js';
import { PG_URL, eventually, sleep, uniqueName } from '../helpers/env.js';

const schema = uniqueName('lh_watch');
const names = schemaNames({ schema });
/** Long enough for a NOTIFY sent at commit to reach a LISTENing client on the same machine. */
const QUIET_MS = 300;

let admin: pg.Client;
let heard: string[];

beforeAll(async () => {
  const setup = postgresBackend({ connectionString: PG_URL, schema, poolSize: 1 });
  await setup.inspect(''); // creates the schema
  await setup.close();
  admin = new pg.Client({ connectionString: PG_URL });
  await admin.connect();
  heard = [];
  admin.on('notification', (m) => {
    if (m.channel === names.channel && m.payload !== undefined) heard.push(m.payload);
  });
  await admin.query(`LISTEN "${names.channel}"`);
});

afterAll(async () => {
  await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
  await admin.end();
});

function request(key: string, owner: string, extra: Partial<AcquireRequest> = {}): AcquireRequest {
  return { key, owner, mode: 'exclusive', ttlMs: 10_000, lockDelayMs: 0, holder: owner, queue: false, queueTtlMs: 10_000, ...extra };
}

async function granted(backend: Backend, req: AcquireRequest): Promise<bigint> {
  const r = await backend.acquire(req);
  if (!r.granted) throw new Error(`expected a grant of ${req.key}`);
  return r.token;
}

/** The payloads heard for `key` during `fn` and QUIET_MS after it. */
async function heardFor(key: string, fn: () => Promise<unknown>): Promise<string[]> {
  const from = heard.length;
  await fn();
  await sleep(QUIET_MS);
  return heard.slice(from).filter((p) => p.slice(p.indexOf(':') + 1) === key);
}

async function marks(key: string): Promise<number> {
  const { rows } = await admin.query(`SELECT count(*)::int AS n FROM ${names.watched} WHERE key = $1 AND expires_at > clock_timestamp()`, [key]);
  return rows[0].n as number;
}

describe('postgres watch: a grant NOTIFYs only keys somebody watches', () => {
  it("a watched key's exclusive grant with nobody queued fires watch (the election case)", async () => {
    const watcher = postgresBackend({ connectionString: PG_URL, schema, poolSize: 2 });
    const other = postgresBackend({ connectionString: PG_URL, schema, poolSize: 2, listen: false });
    try {
      let calls = 0;
      const stop = await watcher.watch!('leader', () => calls++);
      expect(await marks('leader')).toBe(1);
      const payloads = await heardFor('leader', () => granted(other, request('leader', 'a')));
      expect(payloads).toEqual(['0:leader']);
      // nobody holds the key before it, so no look at an expiry: the call is the NOTIFY's
      expect(await eventually(() => calls >= 1, 2_000)).toBe(true);
      stop();
    } finally {
      await Promise.all([watcher.close(), other.close()]);
    }
  });

  it("an unwatched key's grants send no NOTIFY; releases still notify waiters as before", async () => {
    const a = postgresBackend({ connectionString: PG_URL, schema, poolSize: 2, listen: false });
    const b = postgresBackend({ connectionString: PG_URL, schema, poolSize: 2, listen: false });
    try {
      expect(await marks('plain')).toBe(0);
      let token = 0n;
      expect(await heardFor('plain', async () => (token = await granted(a, request('plain', 'a'))))).toEqual([]);
      // b queues behind a; a's release tells the head of the queue (its seq), as before
      const busy = await b.acquire(request('plain', 'b', { queue: true }));
      expect(busy.granted).toBe(false);
      const onRelease = await heardFor('plain', () => a.release({ key: 'plain', owner: 'a', token, mode: 'exclusive' }));
      expect(onRelease).toHaveLength(1);
      expect(onRelease[0]).toMatch(/^[0-9]+:plain$/);
      // b's exclusive grant takes it out of the queue: nobody else can go, nobody watches: no NOTIFY
      let tokenB = 0n;
      expect(await heardFor('plain', async () => (tokenB = await granted(b, request('plain', 'b', { queue: true }))))).toEqual([]);
      // a release with nobody queued wakes every subscriber of the key
      expect(await heardFor('plain', () => b.release({ key: 'plain', owner: 'b', token: tokenB, mode: 'exclusive' }))).toEqual(['*:plain']);
      // shared grants that change nothing for waiters: no NOTIFY either
      const s1 = await granted(a, request('shared', 'a', { mode: 'shared' }));
      expect(s1).toBeGreaterThan(0n);
      const s2 = await heardFor('shared', () => granted(b, request('shared', 'b', { mode: 'shared' })));
      expect(s2).toEqual([]);
    } finally {
      await Promise.all([a.close(), b.close()]);
    }
  });

  it('a watcher that stops deletes its mark; another instance still watching keeps its own', async () => {
    const w1 = postgresBackend({ connectionString: PG_URL, schema, poolSize: 2 });
    const w2 = postgresBackend({ connectionString: PG_URL, schema, poolSize: 2 });
    const other = postgresBackend({ connectionString: PG_URL, schema, poolSize: 2, listen: false });
    try {
      const stop1 = await w1.watch!('two', () => {});
      const stop1b = await w1.watch!('two', () => {}); // a second local watcher shares the mark
      const stop2 = await w2.watch!('two', () => {});
      expect(await marks('two')).toBe(2);
      stop1();
      await sleep(100);
      expect(await marks('two')).toBe(2);
      stop1b();
      expect(await eventually(async () => (await marks('two')) === 1, 2_000)).toBe(true);
      let t = 0n;
      expect(await heardFor('two', async () => (t = await granted(other, request('two', 'a'))))).toEqual(['0:two']);
      expect(await heardFor('two', () => other.release({ key: 'two', owner: 'a', token: t, mode: 'exclusive' }))).toEqual(['*:two']);
      expect(await heardFor('two', async () => (t = await granted(other, request('two', 'a'))))).toEqual(['0:two']);
      await other.release({ key: 'two', owner: 'a', token: t, mode: 'exclusive' });
      stop2();
      expect(await eventually(async () => (await marks('two')) === 0, 2_000)).toBe(true);
      expect(await heardFor('two', () => granted(other, request('two', 'b')))).toEqual([]);
    } finally {
      await Promise.all([w1.close(), w2.close(), other.close()]);
    }
  });

  it('closing the backend deletes its marks', async () => {
    const watcher = postgresBackend({ connectionString: PG_URL, schema, poolSize: 2 });
    await watcher.watch!('closing', () => {});
    expect(await marks('closing')).toBe(1);
    await watcher.close();
    expect(await marks('closing')).toBe(0);
  });

  it("a watcher that crashed stops renewing: its mark runs out by the server's clock and grants go quiet", async () => {
    const other = postgresBackend({ connectionString: PG_URL, schema, poolSize: 2, listen: false });
    try {
      await other.inspect('');
      // what a watcher leaves behind when its process dies: a mark nobody renews (here 400 ms long)
      await admin.query(`SELECT * FROM ${names.watchFn}($1, $2, 400)`, ['crashed', 'gone/0']);
      expect(await marks('crashed')).toBe(1);
      let t = 0n;
      expect(await heardFor('crashed', async () => (t = await granted(other, request('crashed', 'a'))))).toEqual(['0:crashed']);
      await other.release({ key: 'crashed', owner: 'a', token: t, mode: 'exclusive' });
      await sleep(400);
      expect(await marks('crashed')).toBe(0);
      expect(await heardFor('crashed', () => granted(other, request('crashed', 'a')))).toEqual([]);
    } finally {
      await other.close();
    }
  });

  it("a watch's look at the holder's expiry tells of it; a renewed holder is not told of", async () => {
    const watcher = postgresBackend({ connectionString: PG_URL, schema, poolSize: 2 });
    const other = postgresBackend({ connectionString: PG_URL, schema, poolSize: 2, listen: false });
    try {
      // Generous durations: on a loaded 2-core machine a 600 ms ttl ran out before its renewal was sent.
      await granted(other, request('exp', 'a', { ttlMs: 2_000 }));
      let calls = 0;
      const stop = await watcher.watch!('exp', () => calls++);
      await sleep(400);
      expect((await other.renew({ key: 'exp', owner: 'a', token: 1n, ttlMs: 4_000, mode: 'exclusive' })).renewed).toBe(true);
      await sleep(2_000); // past the first expiry: the look finds the holder renewed
      expect(calls).toBe(0);
      expect(await eventually(() => calls >= 1, 6_000)).toBe(true); // it expires for good
      stop();
    } finally {
      await Promise.all([watcher.close(), other.close()]);
    }
  });

  it('election observe on postgres sees each new leader', async () => {
    const a = new Locks({ backend: postgresBackend({ connectionString: PG_URL, schema, poolSize: 2 }), holderName: 'a' });
    const b = new Locks({ backend: postgresBackend({ connectionString: PG_URL, schema, poolSize: 2 }), holderName: 'b' });
    const stop = new AbortController();
    const seen: (string | null)[] = [];
    const observing = (async () => {
      for await (const leader of b.election('elect').observe({ signal: stop.signal })) seen.push(leader?.value ?? null);
    })();
    try {
      expect(await eventually(() => seen.length === 1, 2_000)).toBe(true);
      const lease = await a.election('elect').campaign({ value: 'node-a' });
      expect(await eventually(() => seen.at(-1) === 'node-a', 1_500)).toBe(true);
      await lease.release();
      expect(await eventually(() => seen.at(-1) === null, 1_500)).toBe(true);
    } finally {
      stop.abort();
      await observing;
      await Promise.all([a.close(), b.close()]);
    }
  });
});

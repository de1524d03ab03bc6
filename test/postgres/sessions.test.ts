/**
 * Sessions on PostgreSQL: one keep-alive per client and ttl moves the session's expiry and every
 * bound holder's (by the server's clock); a session that runs out frees its leases (with their
 * lock-delay), one that is closed frees them at once and wakes their waiters by NOTIFY; an acquire
 * naming a gone session writes nothing. Also the upgrade of a leasehold-locks/4 store in place.
 */
import { readFileSync } from 'node:fs';
import pg from 'pg';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import type { AcquireRequest, AcquireResult, Backend } from '../../src/core/backend.js';
import { Locks } from '../../src/core/locks.js';
import { postgresBackend, SCHEMA_VERSION, type PgPool } from '../../src/postgres/index.js';
import { postgresSchemaSql } from '../../src/postgres/schema.js';
import { acquireRequest, eventually, PG_URL, sleep, uniqueName } from '../helpers/env.js';

const admin = new pg.Pool({ connectionString: PG_URL, max: 2 });
const schemas: string[] = [];
let opened: { close(): Promise<void> }[] = [];

function freshSchema(): string {
  const s = uniqueName('lh_pgs');
  schemas.push(s);
  return s;
}

function track<T extends { close(): Promise<void> }>(thing: T): T {
  opened.push(thing);
  return thing;
}

/** A backend on a fresh (or given) schema, closed after the test. */
function backend(schema: string, extra: Record<string, unknown> = {}): Backend {
  return track(postgresBackend({ connectionString: PG_URL, schema, poolSize: 3, ...extra }));
}

function granted(result: AcquireResult): bigint {
  if (!result.granted) throw new Error(`expected a grant, got ${JSON.stringify(result)}`);
  return result.token;
}

const request = (key: string, owner: string, extra: Partial<AcquireRequest> = {}): AcquireRequest => acquireRequest(key, owner, extra);

afterEach(async () => {
  await Promise.allSettled(opened.map((o) => o.close()));
  opened = [];
});

afterAll(async () => {
  for (const s of schemas) await admin.query(`DROP SCHEMA IF EXISTS ${s} CASCADE`).catch(() => {});
  await admin.end();
});

describe('postgres sessions', () => {
  it('a keep-alive extends every lease of the session (inspect shows expiresInMs refreshed), not the leases of others', async () => {
    const schema = freshSchema();
    const b = backend(schema);
    const { id } = await b.sessions!.open(1_000);
    for (const k of ['ka/1', 'ka/2', 'ka/3']) granted(await b.acquire(request(k, `o-${k}`, { ttlMs: 1_000, session: id })));
    granted(await b.acquire(request('ka/own', 'o-own', { ttlMs: 1_000 }))); // renewed on its own: not the session's
    await sleep(500);
    const before = await b.inspect('ka/');
    for (const s of before) expect(s.holders[0]!.expiresInMs).toBeLessThanOrEqual(550);
    expect(await b.sessions!.keepAlive(id, 1_000)).toBe(true);
    const after = await b.inspect('ka/');
    expect(after.map((s) => s.key)).toEqual(['ka/1', 'ka/2', 'ka/3', 'ka/own']);
    for (const s of after.slice(0, 3)) expect(s.holders[0]!.expiresInMs).toBeGreaterThan(700);
    expect(after[3]!.holders[0]!.expiresInMs).toBeLessThanOrEqual(550);
    // storage layout: the three holders refer to the session, and carry its expiry exactly
    const { rows } = await admin.query(
      `SELECT count(*)::int AS n, count(DISTINCT h.expires_at)::int AS expiries, bool_and(h.expires_at = s.expires_at) AS same
       FROM ${schema}.leasehold_locks h JOIN ${schema}.leasehold_locks_sessions s ON s.id = h.session`,
    );
    expect(rows[0]).toEqual({ n: 3, expiries: 1, same: true });
  });

  it('a session that runs out frees all its leases, with their lock-delay (I8); the next grant has a higher token; keepAlive says false', async () => {
    const schema = freshSchema();
    const b = backend(schema);
    const other = backend(schema);
    const { id } = await b.sessions!.open(300);
    const tokens = [];
    for (const k of ['exp/1', 'exp/2']) tokens.push(granted(await b.acquire(request(k, `o-${k}`, { ttlMs: 300, session: id }))));
    const delayed = granted(await b.acquire(request('exp/delay', 'o-delay', { ttlMs: 300, session: id, lockDelayMs: 60_000 })));
    expect((await other.acquire(request('exp/1', 'x'))).granted).toBe(false);
    await sleep(400);
    expect(await b.sessions!.keepAlive(id, 300)).toBe(false);
    expect(granted(await other.acquire(request('exp/1', 'x')))).toBeGreaterThan(tokens[0]!);
    expect(granted(await other.acquire(request('exp/2', 'x')))).toBeGreaterThan(tokens[1]!);
    // a session that ran out is not "closed": its leases' lock-delay runs
    await b.sessions!.close(id);
    expect((await other.acquire(request('exp/delay', 'x'))).granted).toBe(false);
    const [state] = await other.inspect('exp/delay');
    expect(state?.lockDelayRemainingMs).toBeGreaterThan(50_000);
    expect(state?.lastToken).toBe(delayed);
  });

  it('closing a session frees all its leases at once (no lock-delay) and wakes a waiter by NOTIFY', async () => {
    const schema = freshSchema();
    const a = backend(schema);
    const w = backend(schema);
    const { id } = await a.sessions!.open(30_000);
    const held = granted(await a.acquire(request('close/1', 'holder', { ttlMs: 30_000, session: id, lockDelayMs: 60_000 })));
    granted(await a.acquire(request('close/2', 'holder', { ttlMs: 30_000, session: id, lockDelayMs: 60_000 })));
    const busy = await w.acquire(request('close/1', 'waiter'));
    if (busy.granted) throw new Error('expected busy');
    expect(busy.retryInMs).toBeGreaterThan(20_000); // nothing would end the wait by itself for a long time
    // The backend's wake-up hook fires only on a NOTIFY (there is no poll at this level): the wake is the NOTIFY.
    let woken = 0;
    const off = await w.subscribe!('close/1', () => woken++, busy.cursor);
    await sleep(50);
    expect(woken).toBe(0);
    await a.sessions!.close(id);
    expect(await eventually(() => woken > 0, 5_000)).toBe(true);
    off();
    expect(granted(await w.acquire(request('close/1', 'waiter')))).toBeGreaterThan(held);
    expect((await w.acquire(request('close/2', 'waiter'))).granted).toBe(true);
    expect((await w.inspect('close/')).map((s) => s.lockDelayRemainingMs)).toEqual([0, 0]);
    expect(await a.sessions!.keepAlive(id, 30_000)).toBe(false);
    await a.sessions!.close(id); // idempotent
  });

  it('a Locks waiter is served when the session holding its key ends; the holding Locks client sees its leases lost', async () => {
    const schema = freshSchema();
    const raw = backend(schema);
    const s = raw.sessions!;
    let sessionId = '';
    const spied: Backend = Object.create(raw) as Backend;
    Object.defineProperty(spied, 'sessions', {
      value: {
        open: async (ttl: number) => {
          const opened = await s.open(ttl);
          sessionId = opened.id;
          return opened;
        },
        keepAlive: (id: string, ttl: number) => s.keepAlive(id, ttl),
        close: (id: string) => s.close(id),
      },
    });
    const holder = track(new Locks({ backend: spied }));
    const waiter = track(new Locks({ backend: backend(schema) }));
    const leases = await Promise.all(['lw/1', 'lw/2'].map((k) => holder.acquire(k, { ttlMs: 3_000 })));
    const waiting = waiter.acquire('lw/2', { ttlMs: 3_000, waitMs: 10_000 });
    await eventually(async () => (await waiter.inspect('lw/2'))[0]?.waiters === 1, 5_000);
    await s.close(sessionId); // an operator ends the session behind the holder's back
    const lease = await waiting;
    expect(lease.token).toBeGreaterThan(leases[1]!.token);
    expect(await waiter.tryAcquire('lw/1', { ttlMs: 1_000 })).not.toBeNull();
    // its next keep-alive (within ttl/3) finds the session gone
    expect(await eventually(() => leases.every((l) => l.signal.aborted), 5_000)).toBe(true);
  });

  it('an acquire naming a session that is gone answers sessionLost and writes nothing', async () => {
    const schema = freshSchema();
    const b = backend(schema);
    const { id } = await b.sessions!.open(10_000);
    granted(await b.acquire(request('lost/busy', 'holder')));
    await b.sessions!.close(id);
    const before = await admin.query(`SELECT key, last_token::text, version::text FROM ${schema}.leasehold_locks_keys ORDER BY key`);
    for (const session of [id, 'never-opened']) {
      expect(await b.acquire(request('lost/free', 'o', { session }))).toEqual({ granted: false, sessionLost: true });
      expect(await b.acquire(request('lost/busy', 'o', { session, queue: true }))).toEqual({ granted: false, sessionLost: true });
    }
    const after = await admin.query(`SELECT key, last_token::text, version::text FROM ${schema}.leasehold_locks_keys ORDER BY key`);
    expect(after.rows).toEqual(before.rows);
    expect((await admin.query(`SELECT count(*)::int AS n FROM ${schema}.leasehold_locks_waiters`)).rows[0].n).toBe(0);
  });

  it('renewing a session-bound lease keeps its session alive, with every lease of it; releasing one frees only that one', async () => {
    const b = backend(freshSchema());
    const { id } = await b.sessions!.open(600);
    const t1 = granted(await b.acquire(request('rn/1', 'o1', { ttlMs: 600, session: id })));
    granted(await b.acquire(request('rn/2', 'o2', { ttlMs: 600, session: id })));
    await sleep(400);
    expect(await b.renew({ key: 'rn/1', owner: 'o1', token: t1, mode: 'exclusive', ttlMs: 600 })).toEqual({ renewed: true, ttlMs: 600 });
    await sleep(400); // past the first expiry: alive thanks to the renewal
    expect((await b.inspect('rn/')).map((s) => s.holders.length)).toEqual([1, 1]);
    await b.release({ key: 'rn/1', owner: 'o1', token: t1, mode: 'exclusive' });
    expect((await b.inspect('rn/')).map((s) => s.key)).toEqual(['rn/2']);
    expect(await b.renew({ key: 'rn/1', owner: 'o1', token: t1, mode: 'exclusive', ttlMs: 600 })).toEqual({ renewed: false });
    expect(await b.sessions!.keepAlive(id, 600)).toBe(true);
  });

  it('a Locks client holding 200 leases sends one keep-alive statement per interval and no renewals', async () => {
    const inner = new pg.Pool({ connectionString: PG_URL, max: 8 });
    track({ close: () => inner.end() });
    const statements: string[] = [];
    const pool: PgPool = {
      connect: () => inner.connect(),
      query: (text: string, values?: unknown[]) => {
        statements.push(text);
        return inner.query(text, values);
      },
    };
    const raw = track(postgresBackend({ pool, schema: freshSchema(), listen: false }));
    // counts calls to the Backend interface, as the conformance suite does
    const counts: Record<string, number> = {};
    const bump = (name: string): void => {
      counts[name] = (counts[name] ?? 0) + 1;
    };
    const wrapped: Backend = Object.create(raw) as Backend;
    for (const name of ['acquire', 'renew', 'release'] as const) {
      const fn = raw[name] as (...args: unknown[]) => unknown;
      Object.defineProperty(wrapped, name, { value: (...args: unknown[]) => (bump(name), fn.apply(raw, args)) });
    }
    const s = raw.sessions!;
    Object.defineProperty(wrapped, 'sessions', {
      value: {
        open: (ttl: number) => (bump('open'), s.open(ttl)),
        keepAlive: (id: string, ttl: number) => (bump('keepAlive'), s.keepAlive(id, ttl)),
        close: (id: string) => (bump('close'), s.close(id)),
      },
    });
    const locks = track(new Locks({ backend: wrapped }));
    // the first keep-alive queues in the pool behind the 200 grants: the ttl leaves them room on a busy machine
    const ttlMs = 2_000;
    const leases = await Promise.all(Array.from({ length: 200 }, (_, i) => locks.acquire(`many/${i}`, { ttlMs })));
    expect(counts.open).toBe(1);
    const keepAlivesBefore = counts.keepAlive ?? 0;
    statements.length = 0;
    await sleep(2 * ttlMs); // ~6 intervals of ttl/3
    const keepAlives = (counts.keepAlive ?? 0) - keepAlivesBefore;
    expect(keepAlives).toBeGreaterThanOrEqual(3);
    expect(keepAlives).toBeLessThanOrEqual(12); // ≈ 6, not 200 × 6
    expect(counts.renew ?? 0).toBe(0);
    // every statement sent meanwhile is a keep-alive, one per interval
    expect(statements.length).toBe(keepAlives);
    expect(statements.every((t) => t.includes('_keepalive'))).toBe(true);
    expect(leases.every((l) => l.held)).toBe(true);
    // and the coordinator agrees: every holder is there, its expiry moved by the keep-alives
    const states = await locks.inspect('many/');
    expect(states).toHaveLength(200);
    expect(states.every((k) => k.holders.length === 1 && k.holders[0]!.expiresInMs > ttlMs / 3)).toBe(true);
  });

  it('sessions: false offers none; each lease is renewed on its own', async () => {
    const b = backend(freshSchema(), { sessions: false });
    expect(b.sessions).toBeUndefined();
    expect(() => postgresBackend({ connectionString: PG_URL, sessions: 'yes' } as never)).toThrow(/sessions/);
    const locks = track(new Locks({ backend: b }));
    const lease = await locks.acquire('nosess', { ttlMs: 300 });
    await sleep(500);
    expect(lease.held).toBe(true);
  });

  it('storage layout: sessions that ran out are deleted by the next open (the table does not grow)', async () => {
    const schema = freshSchema();
    const b = backend(schema);
    for (let i = 0; i < 5; i++) await b.sessions!.open(50);
    await b.sessions!.open(60_000);
    const count = async () => (await admin.query(`SELECT count(*)::int AS n FROM ${schema}.leasehold_locks_sessions`)).rows[0].n as number;
    expect(await count()).toBeGreaterThanOrEqual(1);
    await sleep(100);
    await b.sessions!.open(60_000);
    expect(await count()).toBe(2);
  });

  it('a leasehold-locks/4 store is upgraded in place: its live holder stays, sessions work, one acquire function is left', async () => {
    const schema = freshSchema();
    const v4 = readFileSync(new URL('../fixtures/postgres-schema-v4.sql', import.meta.url), 'utf8').replaceAll('lh_v4_schema', schema);
    await admin.query(v4);
    expect((await admin.query(`SELECT obj_description(to_regproc($1), 'pg_proc') AS v`, [`${schema}.leasehold_locks_acquire`])).rows[0].v).toBe(
      'leasehold-locks/4',
    );
    // a lease granted by the /4 store, still live
    await admin.query(`INSERT INTO ${schema}.leasehold_locks_keys (key, last_token) VALUES ('old', 7)`);
    await admin.query(`INSERT INTO ${schema}.leasehold_locks (key, owner, mode, token, holder, acquired_at, expires_at)
      VALUES ('old', 'old-owner', 'exclusive', 7, 'old-holder', now(), now() + interval '1 minute')`);

    const b = backend(schema);
    const busy = await b.acquire(request('old', 'new-owner'));
    expect(busy).toMatchObject({ granted: false, holder: 'old-holder' });
    expect(await b.renew({ key: 'old', owner: 'old-owner', token: 7n, mode: 'exclusive', ttlMs: 60_000 })).toEqual({ renewed: true, ttlMs: 60_000 });
    const { id } = await b.sessions!.open(5_000);
    granted(await b.acquire(request('new', 'o', { session: id, ttlMs: 5_000 })));
    expect(await b.sessions!.keepAlive(id, 5_000)).toBe(true);
    await b.release({ key: 'old', owner: 'old-owner', token: 7n, mode: 'exclusive' });
    expect(granted(await b.acquire(request('old', 'new-owner', { session: id })))).toBe(8n);

    const { rows } = await admin.query(
      `SELECT count(*)::int AS n, min(obj_description(p.oid, 'pg_proc')) AS v FROM pg_proc p JOIN pg_namespace s ON s.oid = p.pronamespace
       WHERE s.nspname = $1 AND p.proname = 'leasehold_locks_acquire'`,
      [schema],
    );
    expect(rows[0]).toEqual({ n: 1, v: SCHEMA_VERSION });
    expect(SCHEMA_VERSION).toBe('leasehold-locks/5');
    // a second start (another process) finds the current version and runs no DDL
    const again = backend(schema);
    expect((await again.acquire(request('old', 'third'))).granted).toBe(false);
  });

  it('postgresSchemaSql() adds the session column, its index and the sessions table, and drops the /4 acquire function', () => {
    const sql = postgresSchemaSql({ schema: 's', table: 't' });
    expect(sql).toContain('ALTER TABLE "s"."t" ADD COLUMN IF NOT EXISTS session text');
    expect(sql).toContain('CREATE INDEX IF NOT EXISTS "t_by_session" ON "s"."t" (session) WHERE session IS NOT NULL');
    expect(sql).toContain('CREATE TABLE IF NOT EXISTS "s"."t_sessions"');
    expect(sql).toContain('DROP FUNCTION IF EXISTS "s"."t_acquire"(text, text, text, bigint, bigint, text, boolean, bigint, integer)');
    expect(sql).toContain('CREATE OR REPLACE FUNCTION "s"."t_keepalive"');
    expect(sql).toContain('CREATE OR REPLACE FUNCTION "s"."t_session_end"');
    expect(sql).toContain("IS 'leasehold-locks/5'");
  });
});

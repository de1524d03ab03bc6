/**
 * What the conformance suite does not reach: one statement per operation, schema creation under
 * concurrent starts, the migration path for users who manage schemas, pools the user owns, a dead
 * server, LISTEN/NOTIFY wake-ups with cursors, and queue places of waiters that went away.
 */
import net from 'node:net';
import pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { AcquireRequest, Backend } from '../../src/core/backend.js';
import { BackendUnavailableError, ClosedError, InvalidArgumentError } from '../../src/core/errors.js';
import { Locks } from '../../src/core/locks.js';
import { guardBackend } from '../../src/core/guard.js';
import { postgresBackend, postgresSchemaSql, type PgPool } from '../../src/postgres/index.js';
import { eventually, PG_URL, sleep, uniqueName } from '../helpers/env.js';

const admin = new pg.Pool({ connectionString: PG_URL, max: 4 });
const schemas: string[] = [];
const roles: string[] = [];
let opened: { close(): Promise<void> }[] = [];

/** A fresh schema name, dropped after the file. */
function freshSchema(): string {
  const s = uniqueName('lh_pgt');
  schemas.push(s);
  return s;
}

function track<T extends { close(): Promise<void> }>(thing: T): T {
  opened.push(thing);
  return thing;
}

/** A pool that records every statement sent through it (instrumentation of the public pool surface). */
function recordingPool(inner: pg.Pool): { pool: PgPool; statements: string[] } {
  const statements: string[] = [];
  return {
    statements,
    pool: {
      connect: () => inner.connect(),
      query: (text: string, values?: unknown[]) => {
        statements.push(text);
        return inner.query(text, values);
      },
    },
  };
}

const request = (key: string, owner: string, extra: Partial<AcquireRequest> = {}): AcquireRequest => ({
  key,
  owner,
  mode: 'exclusive',
  ttlMs: 10_000,
  lockDelayMs: 0,
  holder: `holder-${owner}`,
  queue: false,
  queueTtlMs: 2_000,
  ...extra,
});

afterEach(async () => {
  await Promise.allSettled(opened.map((o) => o.close()));
  opened = [];
});

afterAll(async () => {
  for (const s of schemas) await admin.query(`DROP SCHEMA IF EXISTS ${s} CASCADE`).catch(() => {});
  for (const r of roles) await admin.query(`DROP ROLE IF EXISTS ${r}`).catch(() => {});
  await admin.end();
});

describe('postgres backend', () => {
  let schema: string;
  beforeAll(() => {
    schema = freshSchema();
  });

  it('one statement per acquire, renew and release (after the first use checked the schema)', async () => {
    const inner = new pg.Pool({ connectionString: PG_URL, max: 2 });
    track({ close: () => inner.end() });
    const { pool, statements } = recordingPool(inner);
    const backend = track(postgresBackend({ pool, schema, listen: false }));
    const first = await backend.acquire(request('one-statement', 'warm-up'));
    expect(first.granted).toBe(true);
    statements.length = 0;

    const grant = await backend.acquire(request('one-statement:2', 'owner-a'));
    expect(statements).toHaveLength(1);
    if (!grant.granted) throw new Error('expected a grant');
    expect((await backend.renew({ key: 'one-statement:2', owner: 'owner-a', token: grant.token, mode: 'exclusive', ttlMs: 5_000 })).renewed).toBe(true);
    expect(statements).toHaveLength(2);
    await backend.release({ key: 'one-statement:2', owner: 'owner-a', token: grant.token, mode: 'exclusive' });
    expect(statements).toHaveLength(3);
    // a busy answer is one statement too
    expect((await backend.acquire(request('one-statement', 'owner-b'))).granted).toBe(false);
    expect(statements).toHaveLength(4);
  });

  it('creates its tables once when many processes start at the same moment', async () => {
    const fresh = freshSchema();
    const backends = Array.from({ length: 8 }, () => track(postgresBackend({ connectionString: PG_URL, schema: fresh, poolSize: 1, listen: false })));
    const grants = await Promise.all(backends.map((b, i) => b.acquire(request('first-start', `owner-${i}`, { mode: 'shared' }))));
    const tokens = grants.map((g) => (g.granted ? g.token : 0n)).sort((a, b) => (a < b ? -1 : 1));
    expect(tokens).toEqual([1n, 2n, 3n, 4n, 5n, 6n, 7n, 8n]);
  });

  it('runs from a migration (postgresSchemaSql) with createSchema: false, under a role that may not create anything', async () => {
    const migrated = freshSchema();
    const role = uniqueName('lh_app');
    roles.push(role);
    const ddl = postgresSchemaSql({ schema: migrated, table: 'app_locks' });
    expect(ddl).toContain('CREATE TABLE IF NOT EXISTS');
    await admin.query(ddl);
    await admin.query(ddl); // idempotent
    await admin.query(`CREATE ROLE ${role} LOGIN`);
    await admin.query(`GRANT USAGE ON SCHEMA ${migrated} TO ${role}`);
    await admin.query(`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA ${migrated} TO ${role}`);
    await admin.query(`GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA ${migrated} TO ${role}`);
    await admin.query(`REVOKE CREATE ON SCHEMA ${migrated} FROM PUBLIC`);
    const url = new URL(PG_URL);
    url.username = role;
    url.password = '';

    for (const createSchema of [false, true]) {
      // with the schema at the current version, even createSchema: true runs no DDL
      const connect = () => postgresBackend({ connectionString: url.toString(), schema: migrated, table: 'app_locks', createSchema });
      const locks = track(new Locks({ backend: connect() }));
      const other = track(new Locks({ backend: connect() }));
      const lease = await locks.acquire(`migrated:${createSchema}`, { ttlMs: 2_000 });
      expect(lease.token).toBe(1n);
      // a waiter queues, listens, and is served: every function runs under the restricted role
      const waiting = other.acquire(`migrated:${createSchema}`, { ttlMs: 2_000, waitMs: 5_000 });
      await eventually(async () => (await locks.inspect(`migrated:${createSchema}`))[0]?.waiters === 1, 5_000);
      await lease.release();
      expect((await waiting).token).toBe(2n);
      expect(await other.tryAcquire(`migrated:${createSchema}`, { ttlMs: 1_000 })).toBeNull();
    }

    const missing = track(postgresBackend({ connectionString: PG_URL, schema: freshSchema(), createSchema: false }));
    const error = await missing.acquire(request('k', 'o')).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(BackendUnavailableError);
    expect((error as Error).message).toContain('postgresSchemaSql');
  });

  it('never ends a pool it was given', async () => {
    const pool = new pg.Pool({ connectionString: PG_URL, max: 2 });
    try {
      const backend = postgresBackend({ pool, schema });
      const locks = new Locks({ backend });
      const lease = await locks.acquire('given-pool', { ttlMs: 2_000 });
      // a waiter makes the backend check a LISTEN connection out of the pool
      const waiting = locks.acquire('given-pool', { ttlMs: 2_000, waitMs: 5_000 });
      await sleep(100);
      await lease.release();
      await (await waiting).release();
      await locks.close();
      await backend.close();
      expect((await pool.query('SELECT 1 AS one')).rows[0]!.one).toBe(1);
    } finally {
      await pool.end();
    }
  });

  it('a server that does not answer is BackendUnavailableError, not a hang', async () => {
    // a port that accepts nothing: find a free one and keep it closed
    const port = await new Promise<number>((resolve) => {
      const s = net.createServer().listen(0, '127.0.0.1', () => {
        const p = (s.address() as net.AddressInfo).port;
        s.close(() => resolve(p));
      });
    });
    const backend = track(postgresBackend({ connectionString: `postgres://postgres@127.0.0.1:${port}/test`, schema }));
    await expect(backend.acquire(request('dead', 'o'))).rejects.toBeInstanceOf(BackendUnavailableError);
    const locks = track(new Locks({ backend }));
    const error = await locks.tryAcquire('dead', { ttlMs: 1_000 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(BackendUnavailableError);
    expect((error as BackendUnavailableError).retryable).toBe(true);
  });

  it('refuses malformed options with InvalidArgumentError', () => {
    expect(() => postgresBackend({} as never)).toThrow(InvalidArgumentError);
    expect(() => postgresBackend({ connectionString: PG_URL, pool: admin })).toThrow(InvalidArgumentError);
    expect(() => postgresBackend({ connectionString: PG_URL, table: 'bad-name' })).toThrow(/table/);
    expect(() => postgresBackend({ connectionString: PG_URL, schema: 'x; DROP TABLE y' })).toThrow(/schema/);
    expect(() => postgresBackend({ connectionString: PG_URL, table: 't'.repeat(51) })).toThrow(/table/);
    expect(() => postgresBackend({ connectionString: PG_URL, listen: false, listenConnectionString: PG_URL })).toThrow(InvalidArgumentError);
    expect(() => postgresBackend({ connectionString: PG_URL, nope: 1 } as never)).toThrow(InvalidArgumentError);
    expect(() => postgresSchemaSql({ table: '"; DROP' })).toThrow(InvalidArgumentError);
  });

  it('NOTIFY wakes a subscriber when the holder releases', async () => {
    const a = track(postgresBackend({ connectionString: PG_URL, schema }));
    const b = track(postgresBackend({ connectionString: PG_URL, schema }));
    const grant = await a.acquire(request('notify', 'holder'));
    if (!grant.granted) throw new Error('expected a grant');
    const busy = await b.acquire(request('notify', 'waiter'));
    expect(busy.granted).toBe(false);
    let woken = 0;
    const off = await b.subscribe!('notify', () => woken++, busy.granted ? undefined : busy.cursor);
    await sleep(50);
    expect(woken).toBe(0); // nothing changed since the busy answer
    await a.release({ key: 'notify', owner: 'holder', token: grant.token, mode: 'exclusive' });
    expect(await eventually(() => woken > 0, 5_000)).toBe(true);
    off();
    expect((await b.acquire(request('notify', 'waiter'))).granted).toBe(true);
  });

  it('no lost wake-up: a release between the busy answer and the subscription fires at once (cursor)', async () => {
    const a = track(postgresBackend({ connectionString: PG_URL, schema }));
    const b = track(postgresBackend({ connectionString: PG_URL, schema }));
    const grant = await a.acquire(request('cursor', 'holder'));
    if (!grant.granted) throw new Error('expected a grant');
    const busy = await b.acquire(request('cursor', 'waiter'));
    if (busy.granted) throw new Error('expected busy');
    expect(busy.cursor).toBeDefined();
    await a.release({ key: 'cursor', owner: 'holder', token: grant.token, mode: 'exclusive' });
    let woken = 0;
    const off = await b.subscribe!('cursor', () => woken++, busy.cursor);
    expect(await eventually(() => woken > 0, 1_000)).toBe(true);
    off();
  });

  it('a release wakes only the waiters that could be granted: the exclusive head, or the run of shared waiters', async () => {
    const holderBackend = track(postgresBackend({ connectionString: PG_URL, schema }));
    const waiterBackend = track(postgresBackend({ connectionString: PG_URL, schema }));
    for (const [label, modes, expected] of [
      ['targeted-x', ['exclusive', 'exclusive', 'shared'], [1, 0, 0]],
      ['targeted-s', ['shared', 'shared', 'exclusive', 'shared'], [1, 1, 0, 0]],
    ] as const) {
      const grant = await holderBackend.acquire(request(label, 'holder'));
      if (!grant.granted) throw new Error('expected a grant');
      const woken = modes.map(() => 0);
      const offs: (() => void)[] = [];
      for (const [i, mode] of modes.entries()) {
        const busy = await waiterBackend.acquire(request(label, `waiter-${i}`, { mode, queue: true, queueTtlMs: 10_000 }));
        if (busy.granted) throw new Error('expected busy');
        offs.push(await waiterBackend.subscribe!(label, () => woken[i]!++, busy.cursor));
      }
      await holderBackend.release({ key: label, owner: 'holder', token: grant.token, mode: 'exclusive' });
      expect(await eventually(() => woken[0]! > 0, 5_000)).toBe(true);
      await sleep(100); // any wrongly addressed notification would have arrived by now
      expect(woken.map((n) => Math.min(n, 1))).toEqual(expected);
      for (const off of offs) off();
    }
  });

  it('LISTEN works on a client checked out of a given pool, and waiters are served', async () => {
    const pool = new pg.Pool({ connectionString: PG_URL, max: 3 });
    track({ close: () => pool.end() });
    const backend = track(postgresBackend({ pool, schema }));
    const other = track(postgresBackend({ connectionString: PG_URL, schema }));
    const grant = await other.acquire(request('pool-listen', 'holder'));
    if (!grant.granted) throw new Error('expected a grant');
    let woken = 0;
    const off = await backend.subscribe!('pool-listen', () => woken++);
    await other.release({ key: 'pool-listen', owner: 'holder', token: grant.token, mode: 'exclusive' });
    expect(await eventually(() => woken > 0, 5_000)).toBe(true);
    off();
  });

  it('listen: false has no wake-up hook; waiting still works by polling', async () => {
    const backend = track(postgresBackend({ connectionString: PG_URL, schema, listen: false }));
    expect(backend.subscribe).toBeUndefined();
    const a = track(new Locks({ backend }));
    const b = track(new Locks({ backend: track(postgresBackend({ connectionString: PG_URL, schema, listen: false })) }));
    const held = await a.acquire('polling', { ttlMs: 5_000 });
    const waiting = b.acquire('polling', { ttlMs: 1_000, waitMs: 5_000 });
    await sleep(100);
    await held.release();
    expect((await waiting).token).toBeGreaterThan(held.token);
  });

  it('a queue place that is not refreshed expires, so a waiter that vanished blocks nobody', async () => {
    const backend = track(postgresBackend({ connectionString: PG_URL, schema }));
    const grant = await backend.acquire(request('vanished', 'holder'));
    if (!grant.granted) throw new Error('expected a grant');
    // a waiter queues once, then its process dies
    expect((await backend.acquire(request('vanished', 'ghost', { queue: true, queueTtlMs: 300 }))).granted).toBe(false);
    expect((await backend.inspect('vanished'))[0]?.waiters).toBe(1);
    await backend.release({ key: 'vanished', owner: 'holder', token: grant.token, mode: 'exclusive' });
    expect((await backend.acquire(request('vanished', 'newcomer'))).granted).toBe(false); // no barging past the queue
    expect(await eventually(async () => (await backend.acquire(request('vanished', 'newcomer'))).granted, 3_000, 50)).toBe(true);
  });

  it('an expired holder that releases late starts its lock-delay instead of freeing the key', async () => {
    const backend = track(postgresBackend({ connectionString: PG_URL, schema }));
    const grant = await backend.acquire(request('late-release', 'holder', { ttlMs: 100, lockDelayMs: 60_000 }));
    if (!grant.granted) throw new Error('expected a grant');
    await sleep(200);
    await backend.release({ key: 'late-release', owner: 'holder', token: grant.token, mode: 'exclusive' });
    const [state] = await backend.inspect('late-release');
    expect(state?.holders).toEqual([]);
    expect(state?.lockDelayRemainingMs).toBeGreaterThan(50_000);
    const busy = await backend.acquire(request('late-release', 'next'));
    expect(busy.granted).toBe(false);
    if (!busy.granted) expect(busy.retryInMs).toBeGreaterThan(50_000);
  });

  it("close() wakes subscribed waiters, and (through core's guard, as Locks uses it) further calls are refused", async () => {
    const backend: Backend = guardBackend(postgresBackend({ connectionString: PG_URL, schema }));
    let woken = 0;
    await backend.subscribe!('closing', () => woken++);
    await backend.close();
    expect(woken).toBe(1);
    await backend.close(); // idempotent
    await expect(backend.acquire(request('closing', 'o'))).rejects.toBeInstanceOf(ClosedError);
  });
});

describe('postgres LISTEN connection on the real server', () => {
  /** Server pids of the LISTEN connections for `schema` (application_name leasehold-listen; the channel names the schema). */
  async function listenPids(schema: string): Promise<number[]> {
    const { rows } = await admin.query(
      `SELECT pid FROM pg_stat_activity WHERE application_name = 'leasehold-listen' AND query LIKE 'LISTEN %' AND strpos(query, $1) > 0`,
      [schema],
    );
    return rows.map((r) => r.pid as number);
  }

  it('is named leasehold-listen, and a direct one is checked once, not on every subscribe', async () => {
    const schema = freshSchema();
    const backend = track(postgresBackend({ connectionString: PG_URL, schema }));
    const offs: (() => void)[] = [];
    for (let i = 0; i < 5; i++) offs.push(await backend.subscribe!(`direct-${i}`, () => {}));
    // a pooler check on each subscribe would make `SELECT pg_backend_pid() AS pid` the connection's
    // last statement, and the LISTEN naming our schema would no longer show
    const { rows } = await admin.query(`SELECT query, state FROM pg_stat_activity WHERE application_name = 'leasehold-listen' AND strpos(query, $1) > 0`, [
      schema,
    ]);
    expect(rows, "the LISTEN connection's last statement is still its LISTEN").toHaveLength(1);
    expect(rows[0].query).toMatch(/^LISTEN "[^"]+"; SELECT pg_backend_pid\(\) AS pid$/);
    for (const off of offs) off();
  });

  it('terminated by the server while someone waits: it reconnects, and the waiter is granted after the release', async () => {
    const schema = freshSchema();
    const a = track(new Locks({ backend: track(postgresBackend({ connectionString: PG_URL, schema })) }));
    const b = track(new Locks({ backend: track(postgresBackend({ connectionString: PG_URL, schema })) }));
    const held = await a.acquire('listen-lost', { ttlMs: 30_000 });
    const waiting = b.acquire('listen-lost', { ttlMs: 30_000, waitMs: 30_000 });
    let before: number[] = [];
    expect(await eventually(async () => (before = await listenPids(schema)).length === 1, 10_000, 20)).toBe(true);
    const { rows } = await admin.query('SELECT pg_terminate_backend($1) AS done', [before[0]]);
    expect(rows[0].done).toBe(true);
    let after: number[] = [];
    expect(await eventually(async () => (after = await listenPids(schema)).length === 1 && after[0] !== before[0], 15_000, 50)).toBe(true);
    await held.release();
    // a generous bound: only a waiter that is never served runs into it
    expect((await waiting).token).toBeGreaterThan(held.token);
  });

  it('after a reconnection, notifications arrive on the new connection (and every subscriber was woken once)', async () => {
    const schema = freshSchema();
    const a = track(postgresBackend({ connectionString: PG_URL, schema }));
    const b = track(postgresBackend({ connectionString: PG_URL, schema }));
    const grant = await a.acquire(request('relisten', 'holder'));
    if (!grant.granted) throw new Error('expected a grant');
    let woken = 0;
    const off = await b.subscribe!('relisten', () => woken++);
    const [old] = await listenPids(schema);
    expect(old).toBeDefined();
    await admin.query('SELECT pg_terminate_backend($1)', [old]);
    // nothing can be known about the time it was down: the reconnected listener wakes its subscribers
    expect(await eventually(() => woken === 1, 15_000, 20)).toBe(true);
    const now = await listenPids(schema);
    expect(now).toHaveLength(1);
    expect(now[0]).not.toBe(old);
    await a.release({ key: 'relisten', owner: 'holder', token: grant.token, mode: 'exclusive' });
    expect(await eventually(() => woken === 2, 10_000)).toBe(true);
    off();
  });
});

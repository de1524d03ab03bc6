/**
 * Sessions on PostgreSQL. The cases the SQL backends share run from ../helpers/backend-sessions.ts
 * on a fresh schema each: one keep-alive per client and ttl moves the session's expiry and every
 * bound holder's (by the server's clock); a session that runs out frees its leases (with their
 * lock-delay), one that is closed frees them at once and wakes their waiters by NOTIFY; an acquire
 * naming a gone session writes nothing. Here, what is PostgreSQL's own: the upgrade of a
 * leasehold-locks/4 store in place, and the schema SQL.
 */
import { readFileSync } from 'node:fs';
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import type { Backend } from '../../src/core/backend.js';
import { postgresBackend, SCHEMA_VERSION, type PgPool } from '../../src/postgres/index.js';
import { postgresSchemaSql } from '../../src/postgres/schema.js';
import { backendSessionCases, closedAfterEach, granted, type SessionStore } from '../helpers/backend-sessions.js';
import { acquireRequest as request, PG_URL, uniqueName } from '../helpers/env.js';

const admin = new pg.Pool({ connectionString: PG_URL, max: 2 });
const schemas: string[] = [];
/** Closes what it is given after the test: backends, Locks clients, pools. */
const track = closedAfterEach();

function freshSchema(): string {
  const s = uniqueName('lh_pgs');
  schemas.push(s);
  return s;
}

/** A backend on a fresh (or given) schema, closed after the test. */
function backend(schema: string, extra: Record<string, unknown> = {}): Backend {
  return track(postgresBackend({ connectionString: PG_URL, schema, poolSize: 3, ...extra }));
}

const count = async (sql: string): Promise<number> => (await admin.query(sql)).rows[0].n as number;

afterAll(async () => {
  for (const s of schemas) await admin.query(`DROP SCHEMA IF EXISTS ${s} CASCADE`).catch(() => {});
  await admin.end();
});

/** A fresh schema, and the tests' reads of its tables. */
function store(): SessionStore {
  const schema = freshSchema();
  return {
    backend: (extra) => backend(schema, extra),
    sessionRows: () => count(`SELECT count(*)::int AS n FROM ${schema}.leasehold_locks_sessions`),
    waiterRows: () => count(`SELECT count(*)::int AS n FROM ${schema}.leasehold_locks_waiters`),
    snapshot: async () => [
      (await admin.query(`SELECT key, last_token::text, version::text FROM ${schema}.leasehold_locks_keys ORDER BY key`)).rows,
      (await admin.query(`SELECT key, owner, expires_at FROM ${schema}.leasehold_locks ORDER BY key, owner`)).rows,
    ],
    boundHolders: async () => {
      const { rows } = await admin.query(
        `SELECT count(*)::int AS n, count(DISTINCT h.expires_at)::int AS expiries, bool_and(h.expires_at = s.expires_at) AS same
         FROM ${schema}.leasehold_locks h JOIN ${schema}.leasehold_locks_sessions s ON s.id = h.session`,
      );
      const unbound = await count(`SELECT count(*)::int AS n FROM ${schema}.leasehold_locks WHERE session IS NULL`);
      return { bound: rows[0].n, expiries: rows[0].expiries, sameExpiry: rows[0].same, unbound };
    },
  };
}

backendSessionCases('postgres', {
  store,
  // The backend's wake-up hook fires only on a NOTIFY (there is no poll at this level).
  wakeBy: 'by NOTIFY',
  serverClock: true,
  keepAliveEntry: 'statement',
  isKeepAlive: (text) => text.includes('_keepalive'),
  recording() {
    const inner = new pg.Pool({ connectionString: PG_URL, max: 8 });
    track({ close: () => inner.end() });
    const sent: string[] = [];
    const pool: PgPool = {
      connect: () => inner.connect(),
      query: (text: string, values?: unknown[]) => {
        sent.push(text);
        return inner.query(text, values);
      },
    };
    return { backend: track(postgresBackend({ pool, schema: freshSchema(), listen: false })), sent };
  },
});

describe('postgres sessions: PostgreSQL only', () => {
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

/**
 * postgresIdempotencyStore on a real PostgreSQL (a schema of its own, dropped after): every
 * behaviour of test/core/idempotency.test.ts (test/helpers/idempotency.ts), with the coordinator
 * in the same database (postgresBackend), each client with its own pool as another process would.
 * In the transactional takeover the first attempt pauses inside its transaction, after writing its
 * effect row: the record's row is not locked then, so the takeover proceeds and the paused
 * transaction is refused whole when it wakes.
 */
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { Locks } from '../../src/core/locks.js';
import { postgresBackend, postgresIdempotencyStore } from '../../src/postgres/index.js';
import { PG_URL, uniqueName } from '../helpers/env.js';
import { idempotencyScenarios } from '../helpers/idempotency.js';

idempotencyScenarios('postgres', async () => {
  const schema = uniqueName('lh_idem');
  const pools: pg.Pool[] = [];
  const pool = (): pg.Pool => {
    const p = new pg.Pool({ connectionString: PG_URL, max: 4 });
    pools.push(p);
    return p;
  };
  const admin = pool();
  await admin.query(`CREATE SCHEMA ${schema}`);
  await admin.query(`CREATE TABLE ${schema}.effects (seq bigserial PRIMARY KEY, key text NOT NULL, attempt text NOT NULL)`);
  return {
    store: () => postgresIdempotencyStore(pool(), { schema }),
    locks: () => new Locks({ backend: postgresBackend({ connectionString: PG_URL, schema, poolSize: 2 }) }),
    effect: (tx, key, attempt) => tx.query(`INSERT INTO ${schema}.effects (key, attempt) VALUES ($1, $2)`, [key, attempt]),
    effects: async (key) =>
      (await admin.query(`SELECT attempt FROM ${schema}.effects WHERE key = $1 ORDER BY seq`, [key])).rows.map((r) => r.attempt as string),
    rows: async (keys) => Number((await admin.query(`SELECT count(*) AS n FROM ${schema}.leasehold_idempotency WHERE key = ANY($1)`, [keys])).rows[0].n),
    asyncEffect: true,
    cleanup: async () => {
      await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
      await Promise.all(pools.map((p) => p.end()));
    },
  };
});

describe('postgresIdempotencyStore', () => {
  it('refuses what is not a pool, unknown options and bad names', () => {
    const pool = new pg.Pool({ connectionString: PG_URL });
    expect(() => postgresIdempotencyStore({} as never)).toThrow(/pg Pool/);
    expect(() => postgresIdempotencyStore(pool, { tabel: 'x' } as never)).toThrow(/tabel/);
    expect(() => postgresIdempotencyStore(pool, { schema: 'a b' })).toThrow(/SQL identifier/);
    return pool.end();
  });

  it('an effect that ends the transaction or whose statement failed is refused, nothing committed', async () => {
    const schema = uniqueName('lh_idem_misuse');
    const pool = new pg.Pool({ connectionString: PG_URL, max: 2 });
    try {
      const store = postgresIdempotencyStore(pool, { schema });
      await store.get('k'); // creates the schema and table
      await pool.query(`CREATE TABLE ${schema}.effects (attempt text PRIMARY KEY)`);
      const done = () => ({ state: 'completed', token: 1n, payloadHash: '', value: '1' }) as const;
      const commit = store.transact('k', 1n, (tx) => tx.query('COMMIT'), done, 60_000);
      await expect(commit).rejects.toThrow(/COMMIT/);
      const failed = store.transact(
        'k',
        1n,
        async (tx) => {
          await tx.query(`INSERT INTO ${schema}.effects VALUES ('a')`);
          await tx.query('SELECT 1/0').catch(() => {}); // swallowed, but the transaction is aborted
        },
        done,
        60_000,
      );
      await expect(failed).rejects.toThrow(/aborted the transaction/);
      expect((await pool.query(`SELECT count(*)::int AS n FROM ${schema}.effects`)).rows[0].n).toBe(0);
      expect(await store.get('k')).toBeUndefined();
    } finally {
      await pool.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
      await pool.end();
    }
  });
});

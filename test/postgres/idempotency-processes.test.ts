/**
 * The idempotency recipe with real processes on one PostgreSQL schema (test/fixtures/idempotency-worker.mjs,
 * which uses dist/: `npm run build` first): fn once for two processes at once, the takeover of a
 * SIGSTOPped attempt refused by the fence (in the transactional variant A is frozen inside its
 * transaction, after writing its effect row, which is absent in the end), and the control — a plain
 * in-progress flag with an expiry — completing twice.
 */
import pg from 'pg';
import { postgresIdempotencyStore } from '../../src/postgres/index.js';
import { PG_URL, uniqueName } from '../helpers/env.js';
import { processScenarios } from '../helpers/idempotency.js';

processScenarios('postgres', async () => {
  const schema = uniqueName('lh_idem_proc');
  const pool = new pg.Pool({ connectionString: PG_URL, max: 2 });
  await pool.query(`CREATE SCHEMA ${schema}`);
  await pool.query(`CREATE TABLE ${schema}.effects (seq bigserial PRIMARY KEY, key text NOT NULL, attempt text NOT NULL)`);
  await pool.query(`CREATE TABLE ${schema}.flags (key text PRIMARY KEY, state text NOT NULL, value text, expires_at timestamptz NOT NULL)`);
  return {
    connection: { db: 'postgres', url: PG_URL, schema },
    effects: async (key) => (await pool.query(`SELECT attempt FROM ${schema}.effects WHERE key = $1 ORDER BY seq`, [key])).rows.map((r) => r.attempt as string),
    store: () => postgresIdempotencyStore(pool, { schema }),
    flag: async (key) =>
      (await pool.query(`SELECT state, value FROM ${schema}.flags WHERE key = $1`, [key])).rows[0] as { state: string; value: string | null } | undefined,
    cleanup: async () => {
      await pool.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
      await pool.end();
    },
  };
});

/**
 * Behind PgBouncer in transaction mode: the PostgreSQL backend and fence pass their conformance
 * suites, with waiters woken over a direct LISTEN connection, and with no LISTEN at all (the
 * backend detects the pooler, or is told `listen: false`, and waiters poll).
 */
import pg from 'pg';
import { postgresBackend, postgresFence, type PgClient } from '../../src/postgres/index.js';
import { backendConformance } from '../conformance/backend.js';
import { fenceConformance } from '../conformance/fence.js';
import { PG_URL, uniqueName } from '../helpers/env.js';
import { startBouncer } from './bouncer.js';

async function dropSchema(schema: string): Promise<void> {
  const admin = new pg.Client({ connectionString: PG_URL });
  await admin.connect();
  try {
    await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
  } finally {
    await admin.end();
  }
}

backendConformance('postgres behind pgbouncer (transaction mode), LISTEN direct', async () => {
  const bouncer = await startBouncer();
  const schema = uniqueName('lh_bouncer');
  return {
    connect: async () => postgresBackend({ connectionString: bouncer.url, listenConnectionString: PG_URL, schema, poolSize: 4 }),
    prefix: 'bouncer',
    ttlMs: 400,
    cleanup: async () => {
      await bouncer.stop();
      await dropSchema(schema);
    },
  };
});

backendConformance('postgres behind pgbouncer (transaction mode), no LISTEN: waiters poll', async () => {
  const bouncer = await startBouncer();
  const schema = uniqueName('lh_bouncer');
  return {
    connect: async () => postgresBackend({ connectionString: bouncer.url, listen: false, schema, poolSize: 4 }),
    prefix: 'bouncer',
    ttlMs: 400,
    cleanup: async () => {
      await bouncer.stop();
      await dropSchema(schema);
    },
  };
});

fenceConformance<PgClient>('postgres behind pgbouncer (transaction mode)', async () => {
  const bouncer = await startBouncer();
  const schema = uniqueName('lh_bfence');
  const pool = new pg.Pool({ connectionString: bouncer.url, max: 8 });
  await pool.query(`CREATE SCHEMA ${schema}`);
  await pool.query(`CREATE TABLE ${schema}.counters (resource text PRIMARY KEY, n integer NOT NULL)`);
  await pool.query(`CREATE TABLE ${schema}.items (seq bigserial PRIMARY KEY, resource text NOT NULL, value text NOT NULL)`);
  return {
    fence: postgresFence(pool, { schema, table: 'marks' }),
    async increment(tx, r) {
      const { rows } = await tx.query(`SELECT n FROM ${schema}.counters WHERE resource = $1`, [r]);
      await tx.query(`INSERT INTO ${schema}.counters (resource, n) VALUES ($1, $2) ON CONFLICT (resource) DO UPDATE SET n = EXCLUDED.n`, [r, ((rows[0]?.n as number | undefined) ?? 0) + 1]);
    },
    async append(tx, r, v) {
      await tx.query(`INSERT INTO ${schema}.items (resource, value) VALUES ($1, $2)`, [r, v]);
    },
    counter: async (r) => ((await pool.query(`SELECT n FROM ${schema}.counters WHERE resource = $1`, [r])).rows[0]?.n as number | undefined) ?? 0,
    log: async (r) => (await pool.query(`SELECT value FROM ${schema}.items WHERE resource = $1 ORDER BY seq`, [r])).rows.map((x) => x.value as string),
    transactional: true,
    synchronous: false,
    cleanup: async () => {
      await pool.end();
      await bouncer.stop();
      await dropSchema(schema);
    },
  };
});

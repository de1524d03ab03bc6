import pg from 'pg';
import { postgresBackend } from '../../src/postgres/index.js';
import { PG_URL, uniqueName } from '../helpers/env.js';
import { backendConformance } from '../../src/testing/index.js';

// The shared server is not restarted here (other tests use it); the PostgreSQL restart is covered
// by test/postgres/failover.test.ts on a cluster of its own.
backendConformance('postgres', async () => {
  const schema = uniqueName('lh_conf');
  return {
    // each client has its own pool and LISTEN connection, as separate processes would
    connect: async () => postgresBackend({ connectionString: PG_URL, schema, poolSize: 4 }),
    prefix: 'conf',
    ttlMs: 400,
    cleanup: async () => {
      const admin = new pg.Client({ connectionString: PG_URL });
      await admin.connect();
      try {
        await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
      } finally {
        await admin.end();
      }
    },
  };
});

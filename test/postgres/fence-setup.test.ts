/**
 * The PostgreSQL fence's table setup against the real server: first uses that race in the
 * catalog (several fences, and the lease backend, creating objects in one new schema at once)
 * all succeed, like the backend's own setup.
 */
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import { postgresBackend, postgresFence } from '../../src/postgres/index.js';
import { PG_URL, uniqueName } from '../helpers/env.js';

describe('postgresFence table setup', () => {
  const pool = new pg.Pool({ connectionString: PG_URL, max: 20 });
  const schemas: string[] = [];
  afterAll(async () => {
    for (const s of schemas) await pool.query(`DROP SCHEMA IF EXISTS ${s} CASCADE`);
    await pool.end();
  });

  it('fences and a backend starting at once in a new schema all get their tables', async () => {
    for (let round = 0; round < 5; round++) {
      const schema = uniqueName('lh_fsetup');
      schemas.push(schema);
      // each fence has its own pool: its DDL runs on its own connection, truly at the same time
      const pools = Array.from({ length: 6 }, () => new pg.Pool({ connectionString: PG_URL, max: 2 }));
      const backend = postgresBackend({ pool: pools[0]!, schema });
      try {
        const results = await Promise.allSettled([
          backend.inspect(''),
          ...pools.slice(1).map((p, i) => postgresFence(p, { schema, table: `marks_${i}` }).write('r', 1n, async () => {})),
        ]);
        expect(results.filter((r) => r.status === 'rejected').map((r) => String((r as PromiseRejectedResult).reason))).toEqual([]);
      } finally {
        await backend.close();
        for (const p of pools) await p.end();
      }
    }
  });
});

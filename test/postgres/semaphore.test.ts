import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { postgresBackend } from '../../src/postgres/index.js';
import { postgresSchemaSql } from '../../src/postgres/schema.js';
import { PG_URL, uniqueName } from '../helpers/env.js';
import { semaphoreCases } from '../memory/semaphore-cases.js';

async function dropSchema(schema: string): Promise<void> {
  const admin = new pg.Client({ connectionString: PG_URL });
  await admin.connect();
  try {
    await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
  } finally {
    await admin.end();
  }
}

semaphoreCases('postgres', async () => {
  const schema = uniqueName('lh_sem');
  // each client has its own pool and LISTEN connection, as separate processes would
  return { connect: async () => postgresBackend({ connectionString: PG_URL, schema, poolSize: 4 }), cleanup: () => dropSchema(schema) };
});

describe('postgres: semaphore storage', () => {
  it('a lease store of the previous schema version gets the permit_limit column and the new acquire function; its holders read as plain locks', async () => {
    const schema = uniqueName('lh_sem_old');
    const admin = new pg.Client({ connectionString: PG_URL });
    await admin.connect();
    try {
      // the previous version's tables and its acquire function's signature, with a holder in them
      await admin.query(`CREATE SCHEMA ${schema}`);
      await admin.query(`CREATE TABLE ${schema}.leasehold_locks_keys (key text COLLATE "C" PRIMARY KEY, last_token bigint NOT NULL DEFAULT 0,
        delay_until timestamptz, version bigint NOT NULL DEFAULT 0)`);
      await admin.query(`CREATE TABLE ${schema}.leasehold_locks (key text COLLATE "C" NOT NULL, owner text NOT NULL, mode text NOT NULL,
        token bigint NOT NULL, holder text NOT NULL, acquired_at timestamptz NOT NULL, expires_at timestamptz NOT NULL,
        lock_delay_ms bigint NOT NULL DEFAULT 0, PRIMARY KEY (key, owner))`);
      await admin.query(`CREATE FUNCTION ${schema}.leasehold_locks_acquire(text, text, text, bigint, bigint, text, boolean, bigint)
        RETURNS TABLE (granted boolean) LANGUAGE sql AS 'SELECT false'`);
      await admin.query(
        `COMMENT ON FUNCTION ${schema}.leasehold_locks_acquire(text, text, text, bigint, bigint, text, boolean, bigint) IS 'leasehold-locks/2'`,
      );
      await admin.query(`INSERT INTO ${schema}.leasehold_locks_keys (key, last_token) VALUES ('k', 1)`);
      await admin.query(`INSERT INTO ${schema}.leasehold_locks VALUES ('k', 'old', 'shared', 1, 'old-holder', now(), now() + interval '1 minute', 0)`);

      const backend = postgresBackend({ connectionString: PG_URL, schema, poolSize: 2 });
      try {
        const base = { key: 'k', mode: 'shared', ttlMs: 5_000, lockDelayMs: 0, holder: 'h', queue: false, queueTtlMs: 5_000 } as const;
        await expect(backend.acquire({ ...base, owner: 'permit', limit: 2 })).rejects.toThrow(/shared holders without a limit.*2 permits/);
        const granted = await backend.acquire({ ...base, owner: 'plain' });
        expect(granted).toMatchObject({ granted: true, token: 2n });
        expect((await backend.inspect('k'))[0]?.limit).toBeUndefined();
      } finally {
        await backend.close();
      }
      const { rows } = await admin.query(
        `SELECT count(*)::int AS n FROM pg_proc p JOIN pg_namespace s ON s.oid = p.pronamespace
        WHERE s.nspname = $1 AND p.proname = 'leasehold_locks_acquire'`,
        [schema],
      );
      expect(rows[0].n).toBe(1);
    } finally {
      await admin.end();
      await dropSchema(schema);
    }
  });

  it('postgresSchemaSql() adds the permit_limit column to an existing table and replaces the acquire function', () => {
    const sql = postgresSchemaSql({ schema: 's', table: 't' });
    expect(sql).toContain('ADD COLUMN IF NOT EXISTS permit_limit');
    expect(sql).toContain('DROP FUNCTION IF EXISTS "s"."t_acquire"(text, text, text, bigint, bigint, text, boolean, bigint)');
    expect(sql).toContain("IS 'leasehold-locks/5'");
    expect(sql).toContain('CREATE TABLE IF NOT EXISTS "s"."t_watched"');
  });
});

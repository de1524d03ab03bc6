/**
 * postgresFence against a `mutate` that misuses the client it is handed (issue 13, item 4), on
 * the local PostgreSQL: ending the transaction or releasing the client is a typed, non-retryable
 * error, nothing is committed, and the mark and the data agree afterwards. The cases MySQL shares
 * are in ../helpers/fence-misuse.ts; what is PostgreSQL's own (a failed statement aborts the
 * whole transaction) is here.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import pg from 'pg';
import { postgresFence, type PgClient } from '../../src/postgres/index.js';
import { PG_URL, uniqueName } from '../helpers/env.js';
import { hiddenMisuseCases, refusedMisuseCases, type FenceMisuseStore } from '../helpers/fence-misuse.js';

const schema = uniqueName('lh_fmis');
const pool = new pg.Pool({ connectionString: PG_URL, max: 4 });
const fence = postgresFence(pool, { schema, table: 'marks' });
let n = 0;
const res = (label: string): string => `res:${label}:${++n}`;
const insert = (tx: PgClient, r: string, v: string) => tx.query(`INSERT INTO ${schema}.items (resource, value) VALUES ($1, $2)`, [r, v]);
const literal = (s: string): string => `'${s.replaceAll("'", "''")}'`;
const items = async (r: string): Promise<string[]> =>
  (await pool.query(`SELECT value FROM ${schema}.items WHERE resource = $1 ORDER BY seq`, [r])).rows.map((x) => x.value as string);

const store: FenceMisuseStore<PgClient> = {
  fence,
  insert,
  insertSql: (r, v) => `INSERT INTO ${schema}.items (resource, value) VALUES (${literal(r)}, ${literal(v)})`,
  items,
  endingStatements: [
    ['ROLLBACK', 'ROLLBACK'],
    ['COMMIT', 'COMMIT'],
    ['lower-case end with a comment', '/* done */ end'],
    ['ABORT', '  abort;'],
    ['BEGIN', 'BEGIN'],
    ['START TRANSACTION', 'start transaction'],
    ['PREPARE TRANSACTION', "PREPARE TRANSACTION 'x'"],
  ],
  givingAway: ['release'],
  afterGiveAway() {
    expect(pool.totalCount).toBeLessThanOrEqual(4);
    expect(pool.idleCount).toBe(pool.totalCount);
  },
};

beforeAll(async () => {
  await pool.query(`CREATE SCHEMA ${schema}`);
  await pool.query(`CREATE TABLE ${schema}.items (seq bigserial PRIMARY KEY, resource text NOT NULL, value text NOT NULL)`);
});
afterAll(async () => {
  await pool.query(`DROP SCHEMA ${schema} CASCADE`);
  await pool.end();
});

describe('postgresFence misuse', () => {
  refusedMisuseCases(store);
  hiddenMisuseCases(store);

  it('a failed statement that mutate caught still aborts the write: InvalidArgumentError, nothing committed', async () => {
    const r = res('aborted');
    const e = await fence
      .write(r, 1n, async (tx) => {
        await insert(tx, r, 'one');
        await tx.query('SELECT * FROM no_such_table').catch(() => {});
      })
      .catch((x: unknown) => x);
    expect(e).toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'mutate' });
    expect(await fence.highest(r)).toBeNull();
    expect(await items(r)).toEqual([]);
  });
});

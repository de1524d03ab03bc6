/**
 * postgresFence against a `mutate` that misuses the client it is handed (issue 13, item 4), on
 * the local PostgreSQL: ending the transaction or releasing the client is a typed, non-retryable
 * error, nothing is committed, and the mark and the data agree afterwards.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import pg from 'pg';
import { InvalidArgumentError, StaleTokenError } from '../../src/core/errors.js';
import { postgresFence, type PgClient } from '../../src/postgres/index.js';
import { PG_URL, uniqueName } from '../helpers/env.js';

const schema = uniqueName('lh_fmis');
const pool = new pg.Pool({ connectionString: PG_URL, max: 4 });
const fence = postgresFence(pool, { schema, table: 'marks' });
let n = 0;
const res = (label: string): string => `res:${label}:${++n}`;
const insert = (tx: PgClient, r: string, v: string) => tx.query(`INSERT INTO ${schema}.items (resource, value) VALUES ($1, $2)`, [r, v]);
const items = async (r: string): Promise<string[]> =>
  (await pool.query(`SELECT value FROM ${schema}.items WHERE resource = $1 ORDER BY seq`, [r])).rows.map((x) => x.value as string);

beforeAll(async () => {
  await pool.query(`CREATE SCHEMA ${schema}`);
  await pool.query(`CREATE TABLE ${schema}.items (seq bigserial PRIMARY KEY, resource text NOT NULL, value text NOT NULL)`);
});
afterAll(async () => {
  await pool.query(`DROP SCHEMA ${schema} CASCADE`);
  await pool.end();
});

describe('postgresFence misuse', () => {
  for (const [label, sql] of [
    ['ROLLBACK', 'ROLLBACK'],
    ['COMMIT', 'COMMIT'],
    ['lower-case end with a comment', '/* done */ end'],
    ['ABORT', '  abort;'],
    ['BEGIN', 'BEGIN'],
    ['START TRANSACTION', 'start transaction'],
    ['PREPARE TRANSACTION', "PREPARE TRANSACTION 'x'"],
  ] as const) {
    it(`a mutate that runs ${label} itself is refused: InvalidArgumentError, nothing committed`, async () => {
      const r = res(label);
      await fence.write(r, 1n, (tx) => insert(tx, r, 'one'));
      let refused: unknown;
      const e = await fence
        .write(r, 2n, async (tx) => {
          await insert(tx, r, 'two');
          await tx.query(sql).catch((x: unknown) => {
            refused = x; // a careless mutate swallows it
          });
          await insert(tx, r, 'two, after');
        })
        .catch((x: unknown) => x);
      expect(refused, label).toBeInstanceOf(InvalidArgumentError);
      expect(e, label).toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'mutate', retryable: false });
      expect(await fence.highest(r)).toBe(1n);
      expect(await items(r)).toEqual(['one']);
      // the pool is healthy and the token still usable
      await fence.write(r, 2n, (tx) => insert(tx, r, 'two, retried'));
      expect(await items(r)).toEqual(['one', 'two, retried']);
    });
  }

  it('a ROLLBACK and BEGIN hidden in one multi-statement string are caught before COMMIT: nothing committed', async () => {
    const r = res('hidden-rollback');
    await fence.write(r, 1n, (tx) => insert(tx, r, 'one'));
    const e = await fence
      .write(r, 2n, async (tx) => {
        await tx.query(
          `INSERT INTO ${schema}.items (resource, value) VALUES ('${r}', 'before'); ROLLBACK; BEGIN; INSERT INTO ${schema}.items (resource, value) VALUES ('${r}', 'after')`,
        );
      })
      .catch((x: unknown) => x);
    expect(e).toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'mutate', retryable: false });
    expect(await fence.highest(r)).toBe(1n);
    expect(await items(r)).toEqual(['one']);
  });

  it('a COMMIT hidden in a multi-statement string: PartialWriteError, and the mark and the data it committed agree', async () => {
    const r = res('hidden-commit');
    await fence.write(r, 1n, (tx) => insert(tx, r, 'one'));
    const e = await fence
      .write(r, 2n, async (tx) => {
        await tx.query(`INSERT INTO ${schema}.items (resource, value) VALUES ('${r}', 'before'); COMMIT`);
      })
      .catch((x: unknown) => x);
    expect(e).toMatchObject({ name: 'PartialWriteError', code: 'PARTIAL_WRITE', retryable: false, resource: r, token: 2n });
    expect(await fence.highest(r)).toBe(2n);
    expect(await items(r)).toEqual(['one', 'before']);
    await expect(fence.write(r, 1n, () => {})).rejects.toBeInstanceOf(StaleTokenError);
  });

  it('a mutate that releases the client is refused: InvalidArgumentError, nothing committed, the pool stays healthy', async () => {
    const r = res('release');
    const e = await fence
      .write(r, 3n, async (tx) => {
        await insert(tx, r, 'three');
        tx.release();
      })
      .catch((x: unknown) => x);
    expect(e).toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'mutate', retryable: false });
    expect(await fence.highest(r)).toBeNull();
    expect(await items(r)).toEqual([]);
    // every pooled client still works (none was released twice or left inside a transaction)
    await Promise.all([1, 2, 3, 4].map((i) => fence.write(`${r}:${i}`, 1n, (tx) => insert(tx, `${r}:${i}`, 'ok'))));
    expect(pool.totalCount).toBeLessThanOrEqual(4);
    expect(pool.idleCount).toBe(pool.totalCount);
  });

  it("the client kept after write settled is refused (it is back in the pool, maybe in another writer's transaction)", async () => {
    const r = res('kept');
    let kept: PgClient | undefined;
    await fence.write(r, 1n, (tx) => {
      kept = tx;
    });
    await expect(kept!.query(`INSERT INTO ${schema}.items (resource, value) VALUES ($1, 'late')`, [r])).rejects.toBeInstanceOf(InvalidArgumentError);
    expect(() => kept!.release()).toThrow(InvalidArgumentError);
    expect(await items(r)).toEqual([]);
  });

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

  it("mutate's own savepoints work as before", async () => {
    const r = res('savepoint');
    await fence.write(r, 1n, async (tx) => {
      await insert(tx, r, 'kept');
      await tx.query('SAVEPOINT mine');
      await insert(tx, r, 'undone');
      await tx.query('ROLLBACK TO SAVEPOINT mine');
      await tx.query('RELEASE SAVEPOINT mine');
    });
    expect(await items(r)).toEqual(['kept']);
    expect(await fence.highest(r)).toBe(1n);
  });
});

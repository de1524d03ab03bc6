/**
 * The MySQL fence's and idempotency store's table setup against the real MariaDB: first uses that
 * race (eight fences, each with its own pool, first-writing to one new table at once; eight stores
 * likewise) all succeed and end with one table; the factories refuse bad arguments before touching
 * the server; resources are up to 1024 UTF-8 bytes, compared byte by byte (reads the fence table
 * on purpose: the storage layout).
 */
import mysql from 'mysql2/promise';
import { afterAll, describe, expect, it } from 'vitest';
import { InvalidArgumentError } from '../../src/core/errors.js';
import { mysqlFence, mysqlIdempotencyStore } from '../../src/mysql/index.js';
import { MYSQL_URL, uniqueName } from '../helpers/env.js';

const admin = mysql.createPool({ uri: MYSQL_URL, connectionLimit: 2 });
const tables: string[] = [];
const table = (prefix: string): string => {
  const name = uniqueName(prefix);
  tables.push(name);
  return name;
};
const rowsOf = async <T>(answer: Promise<[unknown, unknown]>): Promise<T[]> => (await answer)[0] as T[];
const exists = async (name: string): Promise<number> =>
  (await rowsOf(admin.query('SELECT 1 FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?', [name]))).length;

afterAll(async () => {
  for (const t of tables) await admin.query(`DROP TABLE IF EXISTS ${t}`);
  await admin.end();
});

describe('mysqlFence table setup', () => {
  it('eight fences first-writing to one new table at once all succeed; one table, the highest token stays', async () => {
    for (let round = 0; round < 3; round++) {
      const marks = table('lh_fsetup');
      // each fence has its own pool: its CREATE runs on its own connection, truly at the same time
      const pools = Array.from({ length: 8 }, () => mysql.createPool({ uri: MYSQL_URL, connectionLimit: 1 }));
      try {
        const results = await Promise.allSettled(pools.map((p, i) => mysqlFence(p, { table: marks }).write('shared', BigInt(i + 1), async () => i)));
        const failures = results.filter((r) => r.status === 'rejected').map((r) => String((r as PromiseRejectedResult).reason));
        // Different tokens on one resource: the ones that lost the race to a higher token are refused, nothing else fails.
        expect(failures.filter((f) => !f.includes('StaleTokenError'))).toEqual([]);
        expect(results.some((r) => r.status === 'fulfilled')).toBe(true);
        expect(await exists(marks)).toBe(1);
        expect(await mysqlFence(admin, { table: marks }).highest('shared')).toBe(8n);
      } finally {
        await Promise.all(pools.map((p) => p.end()));
      }
    }
  });

  it('eight idempotency stores using one new table at once all succeed', async () => {
    const records = table('lh_isetup');
    const pools = Array.from({ length: 8 }, () => mysql.createPool({ uri: MYSQL_URL, connectionLimit: 1 }));
    try {
      const results = await Promise.allSettled(
        pools.map((p, i) => mysqlIdempotencyStore(p, { table: records }).put(`k${i}`, 1n, { state: 'in-progress', token: 1n, payloadHash: '' }, 60_000)),
      );
      expect(results.filter((r) => r.status === 'rejected').map((r) => String((r as PromiseRejectedResult).reason))).toEqual([]);
      expect(await exists(records)).toBe(1);
    } finally {
      await Promise.all(pools.map((p) => p.end()));
    }
  });

  it('a user granted only SELECT, INSERT, UPDATE, DELETE on tables an administrator created: the fence and the store never run CREATE and work', async () => {
    const marks = table('lh_fgrant');
    const records = table('lh_igrant');
    const user = uniqueName('lh_u');
    // the administrator's tables, made by the factories themselves under root
    await mysqlFence(admin, { table: marks }).highest('r');
    await mysqlIdempotencyStore(admin, { table: records }).get('k');
    await admin.query(`CREATE USER '${user}'@'%' IDENTIFIED BY ''`);
    try {
      for (const t of [marks, records]) await admin.query(`GRANT SELECT, INSERT, UPDATE, DELETE ON ${t} TO '${user}'@'%'`);
      const url = new URL(MYSQL_URL);
      url.username = user;
      const limited = mysql.createPool({ uri: url.toString(), connectionLimit: 2 });
      try {
        // without the lookup first, CREATE TABLE IF NOT EXISTS fails on the CREATE privilege
        await expect(limited.query(`CREATE TABLE IF NOT EXISTS ${marks} (a INT)`)).rejects.toMatchObject({ code: 'ER_TABLEACCESS_DENIED_ERROR' });
        const fence = mysqlFence(limited, { table: marks });
        await fence.write('r', 2n, () => {});
        expect(await fence.highest('r')).toBe(2n);
        const store = mysqlIdempotencyStore(limited, { table: records });
        await store.put('k', 1n, { state: 'completed', token: 1n, payloadHash: '', value: '1' }, 60_000);
        expect(await store.get('k')).toMatchObject({ state: 'completed', token: 1n });
      } finally {
        await limited.end();
      }
    } finally {
      await admin.query(`DROP USER '${user}'@'%'`);
    }
  });

  it('refuses what is not a pool, unknown options and bad table names, before touching the server', () => {
    expect(() => mysqlFence({} as never)).toThrow(InvalidArgumentError);
    expect(() => mysqlFence({} as never)).toThrow(/mysql2\/promise Pool/);
    expect(() => mysqlFence(admin, { tabel: 'x' } as never)).toThrow(/tabel/);
    expect(() => mysqlFence(admin, { table: 'a b' })).toThrow(/SQL identifier/);
    expect(() => mysqlFence(admin, { table: 'x'.repeat(65) })).toThrow(/SQL identifier/);
    expect(() => mysqlFence(admin, { lockKey: 'k' as never })).toThrow(InvalidArgumentError);
    expect(() => mysqlIdempotencyStore({} as never)).toThrow(/mysql2\/promise Pool/);
    expect(() => mysqlIdempotencyStore(admin, { tabel: 'x' } as never)).toThrow(/tabel/);
    expect(() => mysqlIdempotencyStore(admin, { table: 'drop;table' })).toThrow(/SQL identifier/);
  });

  it('resources up to 1024 UTF-8 bytes, compared byte by byte (case, trailing spaces, composed and decomposed forms are different resources)', async () => {
    const marks = table('lh_fbytes');
    const fence = mysqlFence(admin, { table: marks });
    const long = 'é'.repeat(512); // 1024 bytes
    await fence.write(long, 3n, () => {});
    expect(await fence.highest(long)).toBe(3n);
    await expect(fence.write(`${long}x`, 1n, () => {})).rejects.toMatchObject({ argument: 'resource' });
    const names = ['doc', 'DOC', 'doc ', 'caf\u00e9', 'cafe\u0301', '🔒'];
    for (const [i, r] of names.entries()) await fence.write(r, BigInt(i + 1), () => {});
    for (const [i, r] of names.entries()) expect(await fence.highest(r), JSON.stringify(r)).toBe(BigInt(i + 1));
    const stored = await rowsOf<{ n: number }>(admin.query(`SELECT COUNT(*) AS n FROM ${marks}`));
    expect(Number(stored[0]!.n)).toBe(names.length + 1);
  });

  it('tokens are read as 64-bit integers whatever the pool says about big numbers', async () => {
    const marks = table('lh_fbig');
    const plain = mysql.createPool({ uri: MYSQL_URL, connectionLimit: 1, supportBigNumbers: false, bigNumberStrings: false });
    try {
      const fence = mysqlFence(plain, { table: marks });
      const near = 2n ** 63n - 2n; // not a double: 2^63 - 2 rounds to 2^63
      await fence.write('r', near, () => {});
      expect(await fence.highest('r')).toBe(near);
      await fence.write('r', near + 1n, () => {});
      await expect(fence.write('r', near, () => {})).rejects.toMatchObject({ code: 'STALE_TOKEN', highest: near + 1n });
    } finally {
      await plain.end();
    }
  });
});

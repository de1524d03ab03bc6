/**
 * mysqlIdempotencyStore on the local MariaDB (tables of its own, dropped after): every behaviour of
 * test/core/idempotency.test.ts (test/helpers/idempotency.ts), with the coordinator in the same
 * database (mysqlBackend), each client with its own pool as another process would. In the
 * transactional takeover the first attempt pauses inside its transaction, after writing its effect
 * row: the record's row is not locked then, so the takeover proceeds and the paused transaction is
 * refused whole when it wakes. Then what is MySQL's own: an effect that ends the transaction,
 * concurrent writers of one key (deadlocks retried inside the store, never surfaced).
 */
import mysql from 'mysql2/promise';
import { afterAll, describe, expect, it } from 'vitest';
import { InvalidArgumentError, PartialWriteError, StaleTokenError } from '../../src/core/errors.js';
import type { IdempotencyRecord } from '../../src/core/idempotency.js';
import { Locks } from '../../src/core/locks.js';
import { mysqlBackend, mysqlIdempotencyStore } from '../../src/mysql/index.js';
import { MYSQL_URL, uniqueName } from '../helpers/env.js';
import { idempotencyScenarios } from '../helpers/idempotency.js';
import { dropLeaseTables } from './support.js';

const rowsOf = async <T>(answer: Promise<[unknown, unknown]>): Promise<T[]> => (await answer)[0] as T[];

idempotencyScenarios('mysql', async () => {
  const locksTable = uniqueName('lh_ilocks');
  const records = uniqueName('lh_irecords');
  const effects = uniqueName('lh_ieffects');
  const pools: mysql.Pool[] = [];
  const pool = (): mysql.Pool => {
    const p = mysql.createPool({ uri: MYSQL_URL, connectionLimit: 4 });
    pools.push(p);
    return p;
  };
  const admin = pool();
  await admin.query(
    `CREATE TABLE ${effects} (seq BIGINT AUTO_INCREMENT PRIMARY KEY, \`key\` VARCHAR(255) NOT NULL, attempt VARCHAR(64) NOT NULL) ENGINE=InnoDB`,
  );
  return {
    store: () => mysqlIdempotencyStore(pool(), { table: records }),
    locks: () => new Locks({ backend: mysqlBackend({ uri: MYSQL_URL, table: locksTable, poolSize: 2 }) }),
    effect: (tx, key, attempt) => tx.query(`INSERT INTO ${effects} (\`key\`, attempt) VALUES (?, ?)`, [key, attempt]),
    effects: async (key) =>
      (await rowsOf<{ attempt: string }>(admin.query(`SELECT attempt FROM ${effects} WHERE \`key\` = ? ORDER BY seq`, [key]))).map((r) => r.attempt),
    rows: async (keys) => Number((await rowsOf<{ n: number }>(admin.query(`SELECT COUNT(*) AS n FROM ${records} WHERE \`key\` IN (?)`, [keys])))[0]!.n),
    asyncEffect: true,
    cleanup: async () => {
      await admin.query(`DROP TABLE IF EXISTS ${records}, ${effects}`);
      await dropLeaseTables(locksTable);
      await Promise.all(pools.map((p) => p.end()));
    },
  };
});

describe('mysqlIdempotencyStore', () => {
  const admin = mysql.createPool({ uri: MYSQL_URL, connectionLimit: 8 });
  const tables: string[] = [];
  const table = (prefix: string): string => {
    const name = uniqueName(prefix);
    tables.push(name);
    return name;
  };
  afterAll(async () => {
    for (const t of tables) await admin.query(`DROP TABLE IF EXISTS ${t}`);
    await admin.end();
  });
  const done = (token: bigint, value = '1'): IdempotencyRecord => ({ state: 'completed', token, payloadHash: '', value });

  it('an effect that ends the transaction: refused by its text (nothing committed), or found after the fact (PartialWriteError, the record not written)', async () => {
    const records = table('lh_imis');
    const effects = table('lh_imis_fx');
    const store = mysqlIdempotencyStore(admin, { table: records });
    await store.get('k'); // creates the table
    await admin.query(`CREATE TABLE ${effects} (attempt VARCHAR(64) PRIMARY KEY) ENGINE=InnoDB`);
    const committed = async () => (await rowsOf<{ attempt: string }>(admin.query(`SELECT attempt FROM ${effects} ORDER BY attempt`))).map((r) => r.attempt);

    const commit = store.transact(
      'k',
      1n,
      async (tx) => {
        await tx.query(`INSERT INTO ${effects} VALUES ('refused')`);
        await tx.query('COMMIT');
      },
      () => done(1n),
      60_000,
    );
    await expect(commit).rejects.toBeInstanceOf(InvalidArgumentError);
    await expect(commit).rejects.toThrow(/COMMIT/);
    expect(await committed()).toEqual([]);
    expect(await store.get('k')).toBeUndefined();

    const hidden = store.transact(
      'k',
      1n,
      async (tx) => {
        await tx.query(`INSERT INTO ${effects} VALUES ('before')`);
        await tx.query(`PREPARE ddl FROM 'CREATE TABLE ${records}_x (a INT)'`);
        await tx.query('EXECUTE ddl').catch(() => {});
        await tx.query(`INSERT INTO ${effects} VALUES ('after')`).catch(() => {});
      },
      () => done(1n),
      60_000,
    );
    await expect(hidden).rejects.toBeInstanceOf(PartialWriteError);
    await expect(hidden).rejects.toMatchObject({ resource: 'idempotency:k', token: 1n });
    await expect(hidden).rejects.toThrow(/record was not written/);
    tables.push(`${records}_x`);
    expect(await committed()).toEqual(['before']); // the implicit commit took it; nothing after ran
    expect(await store.get('k')).toBeUndefined();
  });

  it("a statement of the effect that fails and is caught undoes only itself (MySQL's rule): the rest commits with the record", async () => {
    const records = table('lh_ifail');
    const effects = table('lh_ifail_fx');
    const store = mysqlIdempotencyStore(admin, { table: records });
    await store.get('k');
    await admin.query(`CREATE TABLE ${effects} (attempt VARCHAR(64) PRIMARY KEY) ENGINE=InnoDB`);
    const value = await store.transact(
      'k',
      1n,
      async (tx) => {
        await tx.query(`INSERT INTO ${effects} VALUES ('a')`);
        await tx.query(`INSERT INTO ${effects} VALUES ('a')`).catch(() => {}); // duplicate key
        return 'ok';
      },
      (v) => done(1n, JSON.stringify(v)),
      60_000,
    );
    expect(value).toBe('ok');
    expect((await rowsOf(admin.query(`SELECT attempt FROM ${effects}`))).length).toBe(1);
    expect(await store.get('k')).toMatchObject({ state: 'completed', token: 1n, value: '"ok"' });
  });

  it('claims and puts from many connections at once on new keys: deadlocks are retried inside the store; the mark ends at the highest token and every refusal is StaleTokenError', async () => {
    const records = table('lh_irace');
    const pools = Array.from({ length: 6 }, () => mysql.createPool({ uri: MYSQL_URL, connectionLimit: 2 }));
    try {
      const stores = pools.map((p) => mysqlIdempotencyStore(p, { table: records }));
      await stores[0]!.get('warm-up');
      for (let round = 0; round < 5; round++) {
        const key = `race:${round}`;
        const tokens = Array.from({ length: 24 }, (_, i) => BigInt(i + 1)).sort(() => Math.random() - 0.5);
        const outcomes = await Promise.allSettled(
          tokens.map((t, i) => {
            const store = stores[i % stores.length]!;
            return i % 2 === 0
              ? store.claim(key, t, { state: 'in-progress', token: t, payloadHash: '' }, 60_000)
              : store.put(key, t, { state: 'in-progress', token: t, payloadHash: 'p' }, 60_000);
          }),
        );
        const failures = outcomes.filter((o) => o.status === 'rejected').map((o) => (o as PromiseRejectedResult).reason);
        expect(failures.filter((e) => !(e instanceof StaleTokenError)).map(String)).toEqual([]);
        expect(await stores[0]!.get(key)).toMatchObject({ state: 'in-progress', token: 24n });
      }
    } finally {
      await Promise.all(pools.map((p) => p.end()));
    }
  });

  it('a completed record is replayed by claim whatever its token; an expired one is claimed over; a given-back key keeps its mark', async () => {
    const records = table('lh_iclaim');
    const store = mysqlIdempotencyStore(admin, { table: records });
    await store.put('k', 5n, done(5n, '"five"'), 60_000);
    expect(await store.claim('k', 9n, { state: 'in-progress', token: 9n, payloadHash: '' }, 60_000)).toEqual(done(5n, '"five"'));
    expect(await store.get('k')).toEqual(done(5n, '"five"'));
    await store.put('short', 5n, done(5n), 1);
    await new Promise((r) => setTimeout(r, 20));
    expect(await store.get('short')).toBeUndefined();
    await expect(store.claim('short', 4n, { state: 'in-progress', token: 4n, payloadHash: '' }, 60_000)).rejects.toBeInstanceOf(StaleTokenError);
    expect(await store.claim('short', 6n, { state: 'in-progress', token: 6n, payloadHash: '' }, 60_000)).toBeUndefined();
    expect(await store.get('short')).toMatchObject({ state: 'in-progress', token: 6n });
    await store.put('short', 6n, undefined, 60_000);
    expect(await store.get('short')).toBeUndefined();
    await expect(store.put('short', 5n, done(5n), 60_000)).rejects.toMatchObject({ code: 'STALE_TOKEN', highest: 6n });
  });
});

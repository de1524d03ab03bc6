import { join } from 'node:path';
import Database from 'better-sqlite3';
import mysql from 'mysql2/promise';
import pg from 'pg';
import { memoryFence } from '../../src/memory/index.js';
import { mysqlFence, type MysqlConnection } from '../../src/mysql/index.js';
import { postgresFence, type PgClient } from '../../src/postgres/index.js';
import { sqliteFence, type SqliteDatabase } from '../../src/sqlite/index.js';
import { MYSQL_URL, PG_URL, tempDir, uniqueName } from '../helpers/env.js';
import { fenceConformance } from '../../src/testing/index.js';

fenceConformance<void>('memory', async () => {
  const counters = new Map<string, number>();
  const logs = new Map<string, string[]>();
  return {
    fence: memoryFence(),
    fenceWith: (options) => memoryFence(options), // its own marks: the suite only compares within one instance
    async increment(_tx, r) {
      const n = counters.get(r) ?? 0;
      await new Promise((resolve) => setImmediate(resolve)); // give other writers every chance to interleave
      counters.set(r, n + 1);
    },
    append(_tx, r, v) {
      logs.set(r, [...(logs.get(r) ?? []), v]);
    },
    counter: async (r) => counters.get(r) ?? 0,
    log: async (r) => logs.get(r) ?? [],
    transactional: false,
    synchronous: false,
    cleanup: async () => {},
  };
});

fenceConformance<SqliteDatabase>('sqlite', async () => {
  const dir = tempDir();
  const db = new Database(join(dir.path, 'data.db'));
  db.pragma('journal_mode = WAL');
  db.exec(`CREATE TABLE counters (resource TEXT PRIMARY KEY, n INTEGER NOT NULL);
           CREATE TABLE items (seq INTEGER PRIMARY KEY AUTOINCREMENT, resource TEXT NOT NULL, value TEXT NOT NULL);`);
  const reader = new Database(join(dir.path, 'data.db'), { readonly: true });
  return {
    fence: sqliteFence(db),
    fenceWith: (options) => sqliteFence(db, options),
    increment(tx, r) {
      const row = tx.prepare('SELECT n FROM counters WHERE resource = ?').get(r) as { n: number } | undefined;
      tx.prepare('INSERT INTO counters (resource, n) VALUES (?, ?) ON CONFLICT (resource) DO UPDATE SET n = excluded.n').run(r, (row?.n ?? 0) + 1);
    },
    append(tx, r, v) {
      tx.prepare('INSERT INTO items (resource, value) VALUES (?, ?)').run(r, v);
    },
    counter: async (r) => (reader.prepare('SELECT n FROM counters WHERE resource = ?').get(r) as { n: number } | undefined)?.n ?? 0,
    log: async (r) => (reader.prepare('SELECT value FROM items WHERE resource = ? ORDER BY seq').all(r) as { value: string }[]).map((x) => x.value),
    transactional: true,
    synchronous: true,
    cleanup: async () => {
      reader.close();
      db.close();
      dir.cleanup();
    },
  };
});

fenceConformance<PgClient>('postgres', async () => {
  const schema = uniqueName('lh_fence');
  const pool = new pg.Pool({ connectionString: PG_URL, max: 8 });
  await pool.query(`CREATE SCHEMA ${schema}`);
  await pool.query(`CREATE TABLE ${schema}.counters (resource text PRIMARY KEY, n integer NOT NULL);
                    CREATE TABLE ${schema}.items (seq bigserial PRIMARY KEY, resource text NOT NULL, value text NOT NULL)`);
  return {
    fence: postgresFence(pool, { schema, table: 'marks' }),
    fenceWith: (options) => postgresFence(pool, { schema, table: 'marks', ...options }),
    async increment(tx, r) {
      const { rows } = await tx.query(`SELECT n FROM ${schema}.counters WHERE resource = $1`, [r]);
      const n = (rows[0]?.n as number | undefined) ?? 0;
      await tx.query(`INSERT INTO ${schema}.counters (resource, n) VALUES ($1, $2) ON CONFLICT (resource) DO UPDATE SET n = EXCLUDED.n`, [r, n + 1]);
    },
    async append(tx, r, v) {
      await tx.query(`INSERT INTO ${schema}.items (resource, value) VALUES ($1, $2)`, [r, v]);
    },
    counter: async (r) => ((await pool.query(`SELECT n FROM ${schema}.counters WHERE resource = $1`, [r])).rows[0]?.n as number | undefined) ?? 0,
    log: async (r) => (await pool.query(`SELECT value FROM ${schema}.items WHERE resource = $1 ORDER BY seq`, [r])).rows.map((x) => x.value as string),
    transactional: true,
    synchronous: false,
    cleanup: async () => {
      await pool.query(`DROP SCHEMA ${schema} CASCADE`);
      await pool.end();
    },
  };
});

fenceConformance<MysqlConnection>('mysql', async () => {
  const pool = mysql.createPool({ uri: MYSQL_URL, connectionLimit: 8 });
  const marks = uniqueName('lh_fence_marks');
  const counters = uniqueName('lh_fence_counters');
  const items = uniqueName('lh_fence_items');
  await pool.query(`CREATE TABLE ${counters} (resource VARCHAR(255) PRIMARY KEY, n INT NOT NULL) ENGINE=InnoDB`);
  await pool.query(`CREATE TABLE ${items} (seq BIGINT AUTO_INCREMENT PRIMARY KEY, resource VARCHAR(255) NOT NULL, value VARCHAR(255) NOT NULL) ENGINE=InnoDB`);
  const rows = async <T>(answer: Promise<[unknown, unknown]>): Promise<T[]> => (await answer)[0] as T[];
  return {
    fence: mysqlFence(pool, { table: marks }),
    fenceWith: (options) => mysqlFence(pool, { table: marks, ...options }),
    async increment(tx, r) {
      // read, then write: without the fence's row lock two writers would both read n and lose an update
      const [row] = await rows<{ n: number }>(tx.query(`SELECT n FROM ${counters} WHERE resource = ?`, [r]));
      await tx.query(`INSERT INTO ${counters} (resource, n) VALUES (?, ?) ON DUPLICATE KEY UPDATE n = ?`, [r, (row?.n ?? 0) + 1, (row?.n ?? 0) + 1]);
    },
    async append(tx, r, v) {
      await tx.query(`INSERT INTO ${items} (resource, value) VALUES (?, ?)`, [r, v]);
    },
    counter: async (r) => (await rows<{ n: number }>(pool.query(`SELECT n FROM ${counters} WHERE resource = ?`, [r])))[0]?.n ?? 0,
    log: async (r) => (await rows<{ value: string }>(pool.query(`SELECT value FROM ${items} WHERE resource = ? ORDER BY seq`, [r]))).map((x) => x.value),
    transactional: true,
    synchronous: false,
    cleanup: async () => {
      await pool.query(`DROP TABLE IF EXISTS ${marks}, ${counters}, ${items}`);
      await pool.end();
    },
  };
});

import { createRequire } from 'node:module';
import type * as Mysql2 from 'mysql2';
import type * as Mysql from 'mysql2/promise';
import { mysqlUrl } from '../connect.js';
import { requirePeer } from '../core/peer.js';
import { mysqlFence, type MysqlPool } from '../mysql/index.js';
import { STORE_NAMES, bounded, type AdminStore, type FinalState, type StoreConfig, type WorkerStore } from './store.js';

const { counters, log, fences } = STORE_NAMES;

/**
 * mysql2, an optional peer of leasehold, loaded like src/postgres/driver.ts loads pg, so a missing one
 * is named as `npm install` takes it; its pools give their promise API through `.promise()`.
 */
const mysql = requirePeer<typeof Mysql2>(createRequire(import.meta.url), 'mysql2', 'leasehold verify --fence mysql');

/**
 * Every statement of the MySQL / MariaDB store, beside the operations that run them. Resource names
 * compare byte for byte (utf8mb4_bin), as in the other stores. Tokens are read as decimal strings
 * (CAST … AS CHAR): mysql2 hands BIGINT columns over as JavaScript numbers, exact only up to 2^53.
 */
const SQL = Object.freeze({
  createCounters: `CREATE TABLE IF NOT EXISTS ${counters} (
    resource VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PRIMARY KEY, value BIGINT NOT NULL) ENGINE=InnoDB`,
  createLog: `CREATE TABLE IF NOT EXISTS ${log} (
    seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    resource VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, token BIGINT NOT NULL,
    worker INT NOT NULL, op VARCHAR(64) NOT NULL, value BIGINT NOT NULL,
    INDEX ${log}_resource (resource, seq)) ENGINE=InnoDB`,
  /** Named lock around the DDL, so that concurrent runs do not race in the data dictionary (seconds to wait). */
  lockDdl: 'SELECT GET_LOCK(?, 30) AS got',
  unlockDdl: 'SELECT RELEASE_LOCK(?)',
  seedCounter: `INSERT IGNORE INTO ${counters} (resource, value) VALUES (?, 0)`,
  readCounter: `SELECT value FROM ${counters} WHERE resource = ?`,
  /**
   * Inside the fence's transaction the counter is read with a locking read: it sees the latest
   * committed value whatever snapshot the transaction may already hold (InnoDB's plain SELECT reads
   * the snapshot taken at the transaction's first plain read).
   */
  readCounterLocked: `SELECT value FROM ${counters} WHERE resource = ? FOR UPDATE`,
  writeCounter: `UPDATE ${counters} SET value = ? WHERE resource = ?`,
  append: `INSERT INTO ${log} (resource, token, worker, op, value) VALUES (?, ?, ?, ?, ?)`,
  readLog: `SELECT seq, CAST(token AS CHAR) AS token, worker AS w, op, value FROM ${log} WHERE resource = ? ORDER BY seq`,
  fenceTableExists: `SELECT COUNT(*) AS n FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = '${fences}'`,
  deleteCounter: `DELETE FROM ${counters} WHERE resource = ?`,
  deleteLog: `DELETE FROM ${log} WHERE resource = ?`,
  deleteMark: `DELETE FROM ${fences} WHERE resource = ?`,
});

/** What a statement hands back: rows for a SELECT. */
type Rows = Record<string, unknown>[];

/** The part of a connection this store queries through (the pool, a pooled connection, the fence's transaction). */
interface Queryable {
  query(sql: string, values?: unknown): Promise<[unknown, unknown]>;
}

async function rows(q: Queryable, sql: string, values?: unknown[]): Promise<Rows> {
  const [result] = await q.query(sql, values);
  return result as Rows;
}

function pool(config: StoreConfig, max: number): Mysql.Pool {
  // leasehold's own `?table=` (the coordinator's lease tables) means nothing to mysql2, which would warn about it.
  const p = mysql.createPool({ uri: mysqlUrl(config.location).uri, connectionLimit: max, connectTimeout: config.timeoutMs }).promise();
  // An idle connection that drops (a server restart) must not crash the process.
  p.on('connection', (c) => c.on('error', () => {}));
  return p;
}

/**
 * BEGIN, `fn(connection)`, COMMIT on one pooled connection; ROLLBACK and rethrow on error. A
 * connection whose ROLLBACK failed (it broke while it was out) is destroyed rather than returned.
 */
async function transaction<T>(p: Mysql.Pool, fn: (c: Mysql.PoolConnection) => Promise<T>): Promise<T> {
  const c = await p.getConnection();
  let broken = false;
  try {
    await c.query('BEGIN');
    const result = await fn(c);
    await c.query('COMMIT');
    return result;
  } catch (error) {
    await c.query('ROLLBACK').catch(() => {
      broken = true;
    });
    throw error;
  } finally {
    if (broken) c.destroy();
    else c.release();
  }
}

/** Creates the store's tables once, under a named lock (GET_LOCK) held on one connection around the DDL. */
async function createTables(p: Mysql.Pool, lockName: string, statements: readonly string[]): Promise<void> {
  const c = await p.getConnection();
  try {
    const [got] = await rows(c, SQL.lockDdl, [lockName]);
    if (Number(got?.got) !== 1) throw new Error(`could not take the named lock ${lockName} within 30 s`);
    try {
      for (const sql of statements) await c.query(sql);
    } finally {
      await c.query(SQL.unlockDdl, [lockName]);
    }
  } finally {
    c.release();
  }
}

async function readCounter(q: Queryable, sql: string, resource: string): Promise<number> {
  const found = await rows(q, sql, [resource]);
  return found.length === 0 ? 0 : Number(found[0]!.value);
}

export function mysqlWorkerStore(config: StoreConfig): WorkerStore {
  const p = pool(config, 2);
  const fence = mysqlFence(p as unknown as MysqlPool, { table: fences });
  const within = <T>(promise: Promise<T>, what: string): Promise<T> => bounded(promise, config.timeoutMs, what);
  return {
    fencedIncrement: (resource, token, row) =>
      within(
        fence.write(resource, token, async (tx) => {
          const value = (await readCounter(tx, SQL.readCounterLocked, resource)) + 1;
          await tx.query(SQL.writeCounter, [value, resource]);
          await tx.query(SQL.append, [resource, token.toString(), row.w, row.op, value]);
          return value;
        }),
        'fenced write',
      ),
    read: (resource) => within(readCounter(p, SQL.readCounter, resource), 'read counter'),
    plainWrite: (resource, value, row) =>
      within(
        transaction(p, async (c) => {
          await c.query(SQL.writeCounter, [value, resource]);
          await c.query(SQL.append, [resource, row.token.toString(), row.w, row.op, value]);
        }),
        'write counter',
      ),
    close: () => bounded(p.end(), config.timeoutMs, 'close pool').catch(() => {}),
  };
}

export function mysqlAdminStore(config: StoreConfig): AdminStore {
  const p = pool(config, 2);
  let created: Promise<void> | undefined;
  const ensure = (): Promise<void> => (created ??= createTables(p, `leasehold:${log}`, [SQL.createCounters, SQL.createLog]));
  const hasFence = async (): Promise<boolean> => Number((await rows(p, SQL.fenceTableExists))[0]?.n) > 0;
  return {
    setup: async (resource) => {
      await ensure();
      await p.query(SQL.seedCounter, [resource]);
    },
    final: async (resource): Promise<FinalState> => {
      const counter = await readCounter(p, SQL.readCounter, resource);
      const found = await rows(p, SQL.readLog, [resource]);
      const highest = (await hasFence()) ? await mysqlFence(p as unknown as MysqlPool, { table: fences }).highest(resource) : null;
      return {
        counter,
        log: found.map((r) => ({ seq: Number(r.seq), token: BigInt(r.token as string), w: Number(r.w), op: String(r.op), value: Number(r.value) })),
        highest,
      };
    },
    cleanup: async (resource) => {
      await p.query(SQL.deleteCounter, [resource]);
      await p.query(SQL.deleteLog, [resource]);
      if (await hasFence()) await p.query(SQL.deleteMark, [resource]);
    },
    close: () => bounded(p.end(), config.timeoutMs, 'close pool').catch(() => {}),
  };
}

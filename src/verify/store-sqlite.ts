import Database from 'better-sqlite3';
import { BackendUnavailableError } from '../core/errors.js';
import { sqliteFence, type SqliteDatabase } from '../sqlite/index.js';
import { sleep } from '../util/sleep.js';
import { STORE_NAMES, type AdminStore, type FinalState, type StoreConfig, type WorkerStore } from './store.js';

const { counters, log, fences } = STORE_NAMES;

/** Every statement of the SQLite store, beside the operations that run them. */
const SQL = Object.freeze({
  createCounters: `CREATE TABLE IF NOT EXISTS ${counters} (resource TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL) WITHOUT ROWID`,
  createLog: `CREATE TABLE IF NOT EXISTS ${log} (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, resource TEXT NOT NULL, token INTEGER NOT NULL,
    worker INTEGER NOT NULL, op TEXT NOT NULL, value INTEGER NOT NULL)`,
  seedCounter: `INSERT INTO ${counters} (resource, value) VALUES (?, 0) ON CONFLICT (resource) DO NOTHING`,
  readCounter: `SELECT value FROM ${counters} WHERE resource = ?`,
  writeCounter: `UPDATE ${counters} SET value = ? WHERE resource = ?`,
  append: `INSERT INTO ${log} (resource, token, worker, op, value) VALUES (?, ?, ?, ?, ?)`,
  readLog: `SELECT seq, token, worker AS w, op, value FROM ${log} WHERE resource = ? ORDER BY seq`,
  fenceTableExists: `SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '${fences}'`,
  deleteCounter: `DELETE FROM ${counters} WHERE resource = ?`,
  deleteLog: `DELETE FROM ${log} WHERE resource = ?`,
  deleteMark: `DELETE FROM ${fences} WHERE resource = ?`,
});

/** Short busy timeout: a busy database is retried asynchronously (retryBusy), so timers keep running. */
const BUSY_TIMEOUT_MS = 20;

/** How long a read or plain write is retried while another worker holds the database. */
const BUSY_BUDGET_MS = 5_000;

function isBusy(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  return code === 'SQLITE_BUSY' || code === 'SQLITE_BUSY_SNAPSHOT' || code === 'SQLITE_LOCKED' || code === 'SQLITE_BUSY_TIMEOUT';
}

/**
 * Runs a synchronous statement, retrying after a short random wait while the database is busy (the
 * fence retries its own writes the same way), so the event loop and the worker's timers keep
 * running. Gives up after {@link BUSY_BUDGET_MS}.
 */
async function retryBusy<T>(what: string, op: () => T): Promise<T> {
  const start = performance.now();
  for (let attempt = 0; ; attempt++) {
    try {
      return op();
    } catch (error) {
      if (!isBusy(error)) throw error;
      if (performance.now() - start > BUSY_BUDGET_MS) {
        throw new BackendUnavailableError('sqlite', `${what}: database stayed locked for ${BUSY_BUDGET_MS} ms`, { cause: error });
      }
      await sleep(Math.random() * Math.min(50, 2 ** attempt));
    }
  }
}

function open(config: StoreConfig): Database.Database {
  const db = new Database(config.location, { timeout: BUSY_TIMEOUT_MS });
  db.pragma('journal_mode = WAL');
  return db;
}

export function sqliteWorkerStore(config: StoreConfig): WorkerStore {
  const db = open(config);
  const fence = sqliteFence(db as unknown as SqliteDatabase, { table: fences });
  const read = db.prepare(SQL.readCounter);
  const write = db.prepare(SQL.writeCounter);
  const append = db.prepare(SQL.append);
  const current = (resource: string): number => (read.get(resource) as { value: number } | undefined)?.value ?? 0;
  const plain = db.transaction((resource: string, value: number, row: { w: number; op: string; token: bigint }) => {
    write.run(value, resource);
    append.run(resource, row.token, row.w, row.op, value);
  });
  return {
    fencedIncrement: (resource, token, row) =>
      fence.write(resource, token, () => {
        const value = current(resource) + 1;
        write.run(value, resource);
        append.run(resource, token, row.w, row.op, value);
        return value;
      }),
    read: (resource) => retryBusy('read counter', () => current(resource)),
    plainWrite: (resource, value, row) => retryBusy('write counter', () => plain.immediate(resource, value, row)),
    close: async () => {
      db.close();
    },
  };
}

export function sqliteAdminStore(config: StoreConfig): AdminStore {
  const db = open(config);
  db.exec(SQL.createCounters);
  db.exec(SQL.createLog);
  return {
    setup: async (resource) => {
      db.prepare(SQL.seedCounter).run(resource);
    },
    final: async (resource): Promise<FinalState> => {
      const counter = (db.prepare(SQL.readCounter).get(resource) as { value: number } | undefined)?.value ?? 0;
      const rows = db.prepare(SQL.readLog).safeIntegers(true).all(resource) as { seq: bigint; token: bigint; w: bigint; op: string; value: bigint }[];
      const hasFence = db.prepare(SQL.fenceTableExists).get() !== undefined;
      const highest = hasFence ? await sqliteFence(db as unknown as SqliteDatabase, { table: fences }).highest(resource) : null;
      return {
        counter,
        log: rows.map((r) => ({ seq: Number(r.seq), token: r.token, w: Number(r.w), op: r.op, value: Number(r.value) })),
        highest,
      };
    },
    cleanup: async (resource) => {
      db.prepare(SQL.deleteCounter).run(resource);
      db.prepare(SQL.deleteLog).run(resource);
      if (db.prepare(SQL.fenceTableExists).get()) db.prepare(SQL.deleteMark).run(resource);
    },
    close: async () => {
      db.close();
    },
  };
}

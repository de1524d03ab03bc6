/**
 * The protected resource of a verify run: one counter and one append-only log per resource, in a
 * store with a fence (SQLite, PostgreSQL, MySQL / MariaDB or Redis). Each worker operation either goes through the
 * fence (read the counter, write counter + 1 and append a log row, all inside the fence's
 * transaction) or, in the control run, does what code that trusts its lock does: read the counter
 * right after acquiring, and later write value + 1 and append the row without any token check.
 *
 * The log is the checker's ground truth: its rows in commit order (`seq`) carry the token, the
 * worker, the operation id and the counter value written. Commit order is `seq` order in every
 * store: SQLite has one writer at a time; in PostgreSQL the fence's mark row (fenced) or the
 * counter row (control) is locked until commit, before the log row takes its `seq`, and the same
 * holds in InnoDB (row locks until commit; the AUTO_INCREMENT `seq` is taken under them); Redis runs
 * each transaction alone.
 *
 * Everything a run writes is named after its run id, so runs never meet, and is deleted at the
 * end (`cleanup`). Tables: `leasehold_verify_counters`, `leasehold_verify_log`, and the fence's
 * own `leasehold_verify_fences` (kept apart from an application's `leasehold_fences`). Redis keys
 * start with `leasehold-verify:`.
 */

export type StoreKind = 'sqlite' | 'postgres' | 'mysql' | 'redis';
export const STORE_KINDS: readonly StoreKind[] = Object.freeze(['sqlite', 'postgres', 'mysql', 'redis']);

export interface StoreConfig {
  kind: StoreKind;
  /** sqlite: a file path; postgres: a connection string; mysql: a mysql:// (or mariadb://) URL; redis: a redis:// URL. */
  location: string;
  /** Upper bound of one store call, after which a write counts as failed (indeterminate). */
  timeoutMs: number;
}

/** Names shared by every store. */
export const STORE_NAMES = Object.freeze({
  counters: 'leasehold_verify_counters',
  log: 'leasehold_verify_log',
  fences: 'leasehold_verify_fences',
  redisPrefix: 'leasehold-verify:',
});

/** A row of the log, in commit order. */
export interface LogRow {
  seq: number;
  token: bigint;
  w: number;
  op: string;
  /** The counter value this write stored. */
  value: number;
}

export interface FinalState {
  /** The counter as stored at the end (0 if no write ever committed). */
  counter: number;
  log: LogRow[];
  /** The fence's high-water mark, or null (no fenced write, or the control run). */
  highest: bigint | null;
}

/** What a worker does to the resource. */
export interface WorkerStore {
  /** Fenced read-modify-write + append; throws StaleTokenError on refusal. Resolves with the new value when the store tells it. */
  fencedIncrement(resource: string, token: bigint, row: { w: number; op: string }): Promise<number | undefined>;
  /** Control: reads the counter (0 before the first write). */
  read(resource: string): Promise<number>;
  /** Control: stores `value` and appends the row, in one transaction, without any token check. */
  plainWrite(resource: string, value: number, row: { w: number; op: string; token: bigint }): Promise<void>;
  close(): Promise<void>;
}

/** What the harness does to the resource: create it, read the outcome, remove it. */
export interface AdminStore {
  setup(resource: string): Promise<void>;
  final(resource: string): Promise<FinalState>;
  cleanup(resource: string): Promise<void>;
  close(): Promise<void>;
}

/** Bounds a store call: past `ms` it rejects (the call itself may still complete: the write is then indeterminate). */
export function bounded<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${what}: no answer within ${ms} ms`)), ms);
    promise.then(
      (v) => {
        clearTimeout(timer);
        resolve(v);
      },
      (e: unknown) => {
        clearTimeout(timer);
        reject(e);
      },
    );
  });
}

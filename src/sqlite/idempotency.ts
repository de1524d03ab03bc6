import { BackendUnavailableError, InvalidArgumentError, LeaseholdError, StaleTokenError } from '../core/errors.js';
import { guardHandle, transactionControl } from '../core/fence.js';
import type { IdempotencyRecord, TransactionalIdempotencyStore } from '../core/idempotency.js';
import { checkKey, checkKnownOptions, checkObject, describe } from '../core/validate.js';
import { checkIdentifier, quoteIdent, retryBusy, type SqliteDatabase } from './util.js';

export interface SqliteIdempotencyStoreOptions {
  /** Table of records, in the database `db` (created on first use). @default 'leasehold_idempotency' */
  table?: string;
}

/** Expired rows purged by one put, so a put never pays for a long backlog. */
const PURGE_BATCH = 64;

/** Now in milliseconds since the epoch, by SQLite's clock (the machine's; every process on it reads the same). */
const NOW_MS = `CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)`;

/**
 * Idempotency records in a SQLite database (better-sqlite3), one row per key. The row is also the
 * key's fence: its `token` is the highest token that wrote for the key, and every write is one
 * upsert that changes the row only when stored <= token (I3), so a zombie attempt's late write is
 * refused (StaleTokenError) and changes nothing. Giving a key back (fn threw) keeps the row, with
 * no state, for its mark.
 *
 * Every row expires keepMs after its last write, by SQLite's clock (`julianday('now')`, the
 * machine's wall clock, which every process on it shares): `get` no longer sees it, and puts purge
 * expired rows in batches of 64 (no separate job). The mark goes with the row: an attempt that wakes
 * more than keepMs (default 24 h) after the key's last write is no longer refused.
 *
 * `transact` (for `runInTransaction`) runs the effect synchronously inside one IMMEDIATE
 * transaction with the completed record: the mark is checked first (a stale attempt's effect never
 * runs), then `effect(db)`, then the record; a refusal or an error rolls all of it back. The
 * transaction holds the database's write lock while `effect` runs, so keep it short; returning a
 * promise is refused (rolled back). `effect` gets a guarded view of `db` that refuses BEGIN, COMMIT,
 * ROLLBACK and `close()`.
 */
export function sqliteIdempotencyStore(db: SqliteDatabase, options?: SqliteIdempotencyStoreOptions): TransactionalIdempotencyStore<SqliteDatabase> {
  if (typeof db !== 'object' || db === null || typeof db.prepare !== 'function' || typeof db.transaction !== 'function') {
    throw new InvalidArgumentError('db', `expected a better-sqlite3 Database, got ${describe(db)}`);
  }
  const o = checkObject(options, 'options');
  checkKnownOptions(o, ['table'], 'options');
  const name = checkIdentifier(o.table ?? 'leasehold_idempotency', 'table');
  const table = quoteIdent(name);

  const CREATE = `CREATE TABLE IF NOT EXISTS ${table} (
      key TEXT PRIMARY KEY NOT NULL,
      token INTEGER NOT NULL,
      state TEXT CHECK (state IN ('in-progress', 'completed')),
      payload_hash TEXT NOT NULL DEFAULT '',
      value TEXT,
      expires_at INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX IF NOT EXISTS ${quoteIdent(`${name}_expires_at`)} ON ${table} (expires_at)`;
  /** A live record: a state (not given back) and not expired. */
  const GET = `SELECT token, state, payload_hash, value FROM ${table} WHERE key = ? AND state IS NOT NULL AND expires_at > ${NOW_MS}`;
  const MARK = `SELECT token FROM ${table} WHERE key = ?`;
  /** Writes the record (state NULL: given back) only when stored <= token: no row changed means refused. */
  const UPSERT = `INSERT INTO ${table} (key, token, state, payload_hash, value, expires_at)
    VALUES (@key, @token, @state, @hash, @value, ${NOW_MS} + @keepMs)
    ON CONFLICT (key) DO UPDATE SET token = excluded.token, state = excluded.state, payload_hash = excluded.payload_hash,
      value = excluded.value, expires_at = excluded.expires_at
    WHERE token <= excluded.token`;
  /** Removes a batch of expired rows (other keys': the put of this key writes its row anyway). */
  const PURGE = `DELETE FROM ${table} WHERE key IN (SELECT key FROM ${table} WHERE expires_at <= ${NOW_MS} AND key <> ? LIMIT ${PURGE_BATCH})`;

  let statements:
    | {
        get: ReturnType<SqliteDatabase['prepare']>;
        mark: ReturnType<SqliteDatabase['prepare']>;
        upsert: ReturnType<SqliteDatabase['prepare']>;
        purge: ReturnType<SqliteDatabase['prepare']>;
      }
    | undefined;
  /** Creates the table (outside any transaction, so no rollback takes it away) and prepares the statements once. */
  const ensure = async (): Promise<NonNullable<typeof statements>> => {
    if (statements) return statements;
    if (db.inTransaction) throw new InvalidArgumentError('db', 'the idempotency store was first used inside an open transaction of db');
    await retryBusy('create idempotency table', () => db.exec(CREATE));
    statements = {
      get: db.prepare(GET).safeIntegers(true),
      mark: db.prepare(MARK).safeIntegers(true),
      upsert: db.prepare(UPSERT),
      purge: db.prepare(PURGE),
    };
    return statements;
  };

  /** Inside a transaction: purge a batch, write the record under token, or throw StaleTokenError. */
  const write = (s: NonNullable<typeof statements>, key: string, token: bigint, record: IdempotencyRecord | undefined, keepMs: number): void => {
    s.purge.run(key);
    const changed = s.upsert.run({
      key,
      token,
      state: record?.state ?? null,
      hash: record?.payloadHash ?? '',
      value: record?.value ?? null,
      keepMs: Math.round(keepMs),
    }).changes;
    if (changed === 0) throw stale(s, key, token);
  };
  const stale = (s: NonNullable<typeof statements>, key: string, token: bigint): StaleTokenError =>
    new StaleTokenError(`idempotency:${key}`, token, (s.mark.get(key) as { token: bigint }).token);

  return {
    async get(key) {
      checkKey(key, 'key');
      try {
        const s = await ensure();
        const row = (await retryBusy('idempotency read', () => s.get.get(key))) as
          | { token: bigint; state: IdempotencyRecord['state']; payload_hash: string; value: string | null }
          | undefined;
        if (!row) return undefined;
        return { state: row.state, token: row.token, payloadHash: row.payload_hash, ...(row.value === null ? {} : { value: row.value }) };
      } catch (error) {
        throw storeError('idempotency read', error);
      }
    },

    async claim(key, token, record, keepMs) {
      checkKey(key, 'key');
      try {
        const s = await ensure();
        // One IMMEDIATE transaction: a completed record that is still live wins over the claim.
        const tx = db.transaction((): IdempotencyRecord | undefined => {
          const row = s.get.get(key) as { token: bigint; state: IdempotencyRecord['state']; payload_hash: string; value: string | null } | undefined;
          if (row?.state === 'completed')
            return { state: row.state, token: row.token, payloadHash: row.payload_hash, ...(row.value === null ? {} : { value: row.value }) };
          write(s, key, token, record, keepMs);
          return undefined;
        });
        return await retryBusy('idempotency claim', () => (db.inTransaction ? tx() : tx.immediate()));
      } catch (error) {
        throw storeError('idempotency claim', error);
      }
    },

    async put(key, token, record, keepMs) {
      checkKey(key, 'key');
      try {
        const s = await ensure();
        const tx = db.transaction(() => write(s, key, token, record, keepMs));
        await retryBusy('idempotency write', () => (db.inTransaction ? tx() : tx.immediate()));
      } catch (error) {
        throw storeError('idempotency write', error);
      }
    },

    async transact<R>(
      key: string,
      token: bigint,
      effect: (tx: SqliteDatabase) => R | Promise<R>,
      complete: (result: R) => IdempotencyRecord,
      keepMs: number,
    ): Promise<R> {
      checkKey(key, 'key');
      if (typeof effect !== 'function') throw new InvalidArgumentError('effect', `expected a function, got ${describe(effect)}`);
      /** The error effect or complete threw, which reaches the caller unchanged. */
      let own: { error: unknown } | undefined;
      let s: NonNullable<typeof statements>;
      try {
        s = await ensure();
      } catch (error) {
        throw storeError('idempotency transaction', error);
      }
      const tx = db.transaction((): R => {
        // Checked first: under IMMEDIATE nobody else writes until COMMIT, so a stale effect never runs.
        const mark = (s.mark.get(key) as { token: bigint } | undefined)?.token;
        if (mark !== undefined && mark > token) throw new StaleTokenError(`idempotency:${key}`, token, mark);
        const guard = guardHandle(db, refuseSqlite);
        let result: R | Promise<R>;
        let record: IdempotencyRecord;
        try {
          result = effect(guard.handle);
          if (guard.misuse) throw guard.misuse;
          if (result !== null && typeof result === 'object' && typeof (result as { then?: unknown }).then === 'function') {
            (result as Promise<R>).then(undefined, () => {});
            throw new InvalidArgumentError('effect', 'the SQLite store runs fn synchronously inside the transaction; it returned a promise (rolled back)');
          }
          record = complete(result as R);
        } catch (error) {
          if (guard.misuse) throw guard.misuse;
          own = { error };
          throw error;
        } finally {
          guard.revoke();
        }
        if (!db.inTransaction) throw new InvalidArgumentError('effect', 'fn ended the transaction itself (a COMMIT or ROLLBACK inside an exec string?)');
        write(s, key, token, record, keepMs);
        return result as R;
      });
      try {
        // IMMEDIATE takes the write lock at BEGIN: a busy database fails before effect runs and is retried.
        return await retryBusy('idempotency transaction', () => {
          own = undefined;
          return db.inTransaction ? tx() : tx.immediate();
        });
      } catch (error) {
        if (own && error === own.error) throw error;
        throw storeError('idempotency transaction', error);
      }
    },
  };
}

/** What the effect must not do with the database it is handed: end the transaction, or close the database. */
function refuseSqlite(method: string, args: unknown[]): string | undefined {
  if (method === 'close') return 'fn closed the database inside the idempotency transaction (refused; rolled back)';
  if ((method === 'exec' || method === 'prepare') && typeof args[0] === 'string') {
    const statement = transactionControl(args[0]);
    if (statement !== undefined) return `fn ran ${statement} inside the idempotency transaction, which commits or rolls back itself (refused; rolled back)`;
  }
  return undefined;
}

/** Failures of the store's own statements (a closed database, a disk error) are the store's: BackendUnavailableError. */
function storeError(what: string, error: unknown): LeaseholdError {
  if (error instanceof LeaseholdError) return error;
  return new BackendUnavailableError('sqlite', `${what} failed: ${error instanceof Error ? error.message : String(error)}`, { cause: error });
}

import { BackendUnavailableError, InvalidArgumentError, LeaseholdError, StaleTokenError } from '../core/errors.js';
import type { Fence } from '../core/fence.js';
import { toToken, type TokenInput } from '../core/token.js';
import { checkKey, checkKnownOptions, checkObject, describe } from '../core/validate.js';
import { checkIdentifier, quoteIdent, retryBusy, type SqliteDatabase } from './util.js';

export interface SqliteFenceOptions {
  /** Table of high-water marks, in the same database as the data it protects. @default 'leasehold_fences' */
  table?: string;
}

/**
 * A fence for data in a SQLite database: the high-water marks live in the same database, and the
 * check, the mark and `mutate(db)` commit in one IMMEDIATE transaction. `mutate` runs
 * synchronously inside it (better-sqlite3 is synchronous); returning a promise is refused.
 */
export function sqliteFence(db: SqliteDatabase, options?: SqliteFenceOptions): Fence<SqliteDatabase> {
  if (typeof db !== 'object' || db === null || typeof db.prepare !== 'function' || typeof db.transaction !== 'function') {
    throw new InvalidArgumentError('db', `expected a better-sqlite3 Database, got ${describe(db)}`);
  }
  const o = checkObject(options, 'options');
  checkKnownOptions(o, ['table'], 'options');
  const table = quoteIdent(checkIdentifier(o.table ?? 'leasehold_fences', 'table'));

  const CREATE = `CREATE TABLE IF NOT EXISTS ${table} (resource TEXT PRIMARY KEY NOT NULL, token INTEGER NOT NULL) WITHOUT ROWID`;
  const SELECT = `SELECT token FROM ${table} WHERE resource = ?`;
  /** Raises the mark only when stored <= token; no row changed means refused (I3). */
  const RAISE = `INSERT INTO ${table} (resource, token) VALUES (@resource, @token)
    ON CONFLICT (resource) DO UPDATE SET token = excluded.token WHERE token <= excluded.token`;

  /**
   * True once the table was created outside any transaction (committed for good). A CREATE run
   * inside a transaction (the user's own, or ours) is rolled back with it, so until then every
   * use runs the (idempotent) CREATE again.
   */
  let created = false;
  let statements: { select: ReturnType<SqliteDatabase['prepare']>; raise: ReturnType<SqliteDatabase['prepare']> } | undefined;
  const ensure = (): NonNullable<typeof statements> => {
    if (!created) {
      db.exec(CREATE);
      if (!db.inTransaction) created = true;
    }
    return (statements ??= { select: db.prepare(SELECT).safeIntegers(true), raise: db.prepare(RAISE) });
  };

  return {
    async write<R>(resource: string, token: TokenInput, mutate: (tx: SqliteDatabase) => R | Promise<R>): Promise<R> {
      checkKey(resource, 'resource');
      const t = toToken(token);
      if (typeof mutate !== 'function') throw new InvalidArgumentError('mutate', `expected a function, got ${describe(mutate)}`);
      /** The error mutate threw, which reaches the caller unchanged; anything else failing here is the store's. */
      let own: { error: unknown } | undefined;
      const tx = db.transaction((): R => {
        const s = ensure();
        if (s.raise.run({ resource, token: t }).changes === 0) {
          const row = s.select.get(resource) as { token: bigint };
          throw new StaleTokenError(resource, t, row.token);
        }
        let result: R | Promise<R>;
        try {
          result = mutate(db);
        } catch (error) {
          own = { error };
          throw error;
        }
        if (result !== null && typeof result === 'object' && typeof (result as { then?: unknown }).then === 'function') {
          (result as Promise<unknown>).catch(() => {});
          throw new InvalidArgumentError('mutate', 'sqliteFence runs mutate synchronously inside the transaction; it returned a promise (rolled back)');
        }
        return result as R;
      });
      try {
        // The table is created in its own step first, so a rollback of the write cannot take it away.
        if (!created && !db.inTransaction) await retryBusy('create fence table', ensure);
        // IMMEDIATE takes the write lock at BEGIN, so a busy database fails before mutate runs and can be retried.
        return await retryBusy('fence write', () => {
          own = undefined;
          return db.inTransaction ? tx() : tx.immediate();
        });
      } catch (error) {
        if (own && error === own.error) throw error;
        throw storeError('fence write', error);
      }
    },

    async highest(resource: string): Promise<bigint | null> {
      checkKey(resource, 'resource');
      try {
        const row = await retryBusy('fence read', () => ensure().select.get(resource) as { token: bigint } | undefined);
        return row?.token ?? null;
      } catch (error) {
        throw storeError('fence read', error);
      }
    },
  };
}


/** Failures of the fence's own statements (a closed database, a disk error) are the store's: BackendUnavailableError. */
function storeError(what: string, error: unknown): LeaseholdError {
  if (error instanceof LeaseholdError) return error;
  return new BackendUnavailableError('sqlite', `${what} failed: ${error instanceof Error ? error.message : String(error)}`, { cause: error });
}

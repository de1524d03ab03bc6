import { BackendUnavailableError, InvalidArgumentError, LeaseholdError, PartialWriteError, StaleTokenError } from '../core/errors.js';
import { FENCE_GUARD_OPTIONS, fenceTokenCheck, guardHandle, transactionControl, type Fence, type FenceGuardOptions } from '../core/fence.js';
import type { TokenInput } from '../core/token.js';
import { checkKey, checkKnownOptions, checkObject, describe } from '../core/validate.js';
import { checkIdentifier, quoteIdent, retryBusy, type SqliteDatabase } from './util.js';

export interface SqliteFenceOptions extends FenceGuardOptions {
  /** Table of high-water marks, in the same database as the data it protects. @default 'leasehold_fences' */
  table?: string;
}

/** What `mutate` must not do with the database it is handed: end the fence's transaction, or close the database. */
function refuseSqlite(method: string, args: unknown[]): string | undefined {
  if (method === 'close') return 'mutate closed the database inside the fenced transaction (refused; the write was rolled back)';
  if ((method === 'exec' || method === 'prepare') && typeof args[0] === 'string') {
    const statement = transactionControl(args[0]);
    if (statement !== undefined)
      return `mutate ran ${statement} inside the fenced transaction; the fence commits or rolls back itself (refused; the write was rolled back)`;
  }
  return undefined;
}

/** Thrown inside the transaction when mutate ended it (a COMMIT or ROLLBACK the guard could not see). */
class TransactionEnded {}

/**
 * A fence for data in a SQLite database: the high-water marks live in the same database, and the
 * check, the mark and `mutate(db)` commit in one IMMEDIATE transaction. `mutate` runs
 * synchronously inside it (better-sqlite3 is synchronous); returning a promise is refused.
 *
 * `mutate` gets a guarded view of `db`: BEGIN, COMMIT, END, ROLLBACK (but ROLLBACK TO) and
 * `close()` are refused with InvalidArgumentError naming `mutate`, and the write is rolled back
 * even if `mutate` caught the error. Before committing, the fence checks that the transaction is
 * still its own and still holds its mark (a COMMIT or ROLLBACK hidden in a multi-statement `exec`):
 * if `mutate` rolled it back, InvalidArgumentError (nothing committed); if it committed it,
 * PartialWriteError (the mark and what `mutate` wrote before its COMMIT were committed together).
 */
export function sqliteFence(db: SqliteDatabase, options?: SqliteFenceOptions): Fence<SqliteDatabase> {
  if (typeof db !== 'object' || db === null || typeof db.prepare !== 'function' || typeof db.transaction !== 'function') {
    throw new InvalidArgumentError('db', `expected a better-sqlite3 Database, got ${describe(db)}`);
  }
  const o = checkObject(options, 'options');
  checkKnownOptions(o, ['table', ...FENCE_GUARD_OPTIONS], 'options');
  const readToken = fenceTokenCheck(o);
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

  /** Mutate ended the transaction itself: committed (the mark is there) or rolled back (it is not). */
  const ended = (resource: string, t: bigint, before: bigint | undefined): LeaseholdError => {
    let mark: bigint | undefined;
    try {
      mark = (ensure().select.get(resource) as { token: bigint } | undefined)?.token;
    } catch (error) {
      return storeError('fence read', error);
    }
    if (mark === t) {
      const maybe = before === t ? 'committed (or rolled back: the mark was already at this token)' : 'committed';
      return new PartialWriteError(
        resource,
        t,
        `mutate ended the fenced transaction itself (a COMMIT inside an exec string?): it was ${maybe} with whatever mutate had written before that; the rest of mutate ran outside the fence`,
      );
    }
    return new InvalidArgumentError(
      'mutate',
      'mutate rolled back the fenced transaction itself (a ROLLBACK inside an exec string?); the mark was not raised and nothing the fence ran was committed',
    );
  };

  return {
    async write<R>(resource: string, token: TokenInput, mutate: (tx: SqliteDatabase) => R | Promise<R>, writeOptions?: unknown): Promise<R> {
      checkKey(resource, 'resource');
      const t = readToken(resource, token, writeOptions);
      if (typeof mutate !== 'function') throw new InvalidArgumentError('mutate', `expected a function, got ${describe(mutate)}`);
      /** The error mutate threw, which reaches the caller unchanged; anything else failing here is the store's. */
      let own: { error: unknown } | undefined;
      /** The mark before this write raised it (read inside the transaction). */
      let before: bigint | undefined;
      const tx = db.transaction((): R => {
        const s = ensure();
        before = (s.select.get(resource) as { token: bigint } | undefined)?.token;
        if (s.raise.run({ resource, token: t }).changes === 0) {
          const row = s.select.get(resource) as { token: bigint };
          throw new StaleTokenError(resource, t, row.token);
        }
        const guard = guardHandle(db, refuseSqlite);
        let result: R | Promise<R>;
        try {
          result = mutate(guard.handle);
        } catch (error) {
          if (guard.misuse) throw guard.misuse;
          own = { error };
          throw error;
        } finally {
          guard.revoke();
        }
        if (guard.misuse) throw guard.misuse; // mutate caught the refusal: roll back all the same
        if (result !== null && typeof result === 'object' && typeof (result as { then?: unknown }).then === 'function') {
          const c = (result as { catch?: unknown }).catch;
          if (typeof c === 'function') (c as (f: () => void) => unknown).call(result, () => {});
          throw new InvalidArgumentError('mutate', 'sqliteFence runs mutate synchronously inside the transaction; it returned a promise (rolled back)');
        }
        // A COMMIT or ROLLBACK hidden in one exec string (and maybe a new BEGIN) got past the guard.
        if (!db.inTransaction) throw new TransactionEnded();
        if ((s.select.get(resource) as { token: bigint } | undefined)?.token !== t) {
          throw new InvalidArgumentError(
            'mutate',
            "mutate rolled back the fenced transaction and began another (the fence's mark is gone from it); rolled back, nothing committed",
          );
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
        if (error instanceof TransactionEnded) throw ended(resource, t, before);
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

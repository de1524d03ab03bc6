import { InvalidArgumentError, PartialWriteError, StaleTokenError } from '../core/errors.js';
import { FENCE_GUARD_OPTIONS, fenceTokenCheck, type Fence, type FenceGuardOptions } from '../core/fence.js';
import type { TokenInput } from '../core/token.js';
import { checkKey, checkKnownOptions, checkObject, describe } from '../core/validate.js';
import { tableOnFirstUse } from './table.js';
import { retryLockConflicts, withGuardedTransaction } from './transaction.js';
import { checkMysqlIdentifier, checkPool, mapMysqlError, quoteMysql, type MysqlConnection, type MysqlPool } from './util.js';

export interface MysqlFenceOptions extends FenceGuardOptions {
  /** Table of high-water marks, in the connection's database (created on first use if missing). @default 'leasehold_fences' */
  table?: string;
}

/** A mark row as the fence reads it: the token as a decimal string (never a JS number), the time of its last accepted write. */
interface MarkRow {
  token: string;
  stamp: string;
}

/**
 * A fence for data in MySQL or MariaDB (a `mysql2/promise` pool; InnoDB). Each `write` takes one
 * pooled connection and runs one transaction: the resource's mark is raised only when stored <=
 * token, which locks its row until COMMIT (every writer of the resource waits there), then
 * `mutate(conn)` runs on the transaction's connection, then COMMIT. A refusal (StaleTokenError)
 * rolls back before `mutate` runs; an error thrown by `mutate`, or by one of its statements,
 * rolls back and reaches the caller unchanged. A deadlock or lock-wait timeout in the fence's own
 * statements is retried (a new transaction) while `mutate` has not run yet; after that every
 * failure of the fence's own statements is BackendUnavailableError (`mutate` may have done things
 * outside the database), and a failed COMMIT leaves the outcome unknown, as it always does.
 *
 * `mutate` gets a guarded view of the connection: `release()`, `destroy()`, `end()`,
 * `beginTransaction()`, `commit()`, `rollback()`, `changeUser()` and statements that end, open or
 * implicitly commit a transaction (COMMIT, ROLLBACK but not ROLLBACK TO, BEGIN, START TRANSACTION,
 * XA, DDL such as CREATE / ALTER / DROP / TRUNCATE / RENAME (TEMPORARY tables excepted), LOCK
 * TABLES, SET autocommit, …: see mysqlTransactionControl) are refused with InvalidArgumentError
 * naming `mutate`, and the write is rolled back even if `mutate` caught the error; after `write`
 * settles the view refuses every call. The view reads only the first statement of a string; for
 * the rest (a multi-statement string, when the pool has `multipleStatements`; a stored procedure
 * or a prepared statement that commits) the fence reads the server's in-transaction flag in the OK
 * packet of each of mutate's statements, and releases a savepoint, set before mutate's first
 * statement, just before COMMIT. When the transaction ended behind its back:
 *
 * - certainly rolled back (the mark is still below the token, or a deadlock rolled it back):
 *   InvalidArgumentError (or mutate's own error, if it threw one), nothing committed;
 * - committed, or maybe committed: PartialWriteError. The mark and what mutate ran before the
 *   statement that ended the transaction were committed together (the mark read back at this
 *   token with this write's time says certainly; else it says "may have been"). Detected by the
 *   flag, mutate's later calls are refused, so nothing more of it runs (but the statements after
 *   the end in the same multi-statement string ran in autocommit mode, each committed on its own);
 *   detected only by the savepoint, what mutate ran after the end was in a transaction it began,
 *   which the fence rolls back.
 *
 * Statements sent around the view (`conn.connection`, a prepared statement's own `execute`) are
 * not checked one by one; the savepoint still catches their end of the transaction at COMMIT.
 */
export function mysqlFence(pool: MysqlPool, options?: MysqlFenceOptions): Fence<MysqlConnection> {
  checkPool(pool, 'pool');
  const o = checkObject(options, 'options');
  checkKnownOptions(o, ['table', ...FENCE_GUARD_OPTIONS], 'options');
  const readToken = fenceTokenCheck(o);
  const name = checkMysqlIdentifier(o.table ?? 'leasehold_fences', 'table');
  const table = quoteMysql(name);

  /** Resource names are keys: up to 1024 UTF-8 bytes, compared byte by byte. Created on first use when missing. */
  const CREATE = `CREATE TABLE IF NOT EXISTS ${table} (
    resource VARBINARY(1024) NOT NULL PRIMARY KEY,
    token BIGINT UNSIGNED NOT NULL,
    updated_at DATETIME(6) NOT NULL
  ) ENGINE=InnoDB`;
  /**
   * Raises the mark only when stored <= token (I3), and locks the row either way. `updated_at` is
   * assigned first, while `token` still holds the stored value (MariaDB's SIMULTANEOUS_ASSIGNMENT
   * mode reads the stored values anyway). Tokens go in as decimal strings cast on the server, so
   * they compare as 64-bit integers, never as doubles.
   */
  const RAISE = `INSERT INTO ${table} (resource, token, updated_at) VALUES (?, CAST(? AS UNSIGNED), UTC_TIMESTAMP(6))
    ON DUPLICATE KEY UPDATE
      updated_at = IF(token <= CAST(? AS UNSIGNED), UTC_TIMESTAMP(6), updated_at),
      token = IF(token <= CAST(? AS UNSIGNED), CAST(? AS UNSIGNED), token)`;
  /** The row RAISE locked: accepted when its token is ours; `stamp` tells this write's commit apart later. */
  const READ_LOCKED = `SELECT CAST(token AS CHAR) AS token, CAST(updated_at AS CHAR) AS stamp FROM ${table} WHERE resource = ? FOR UPDATE`;
  const READ = `SELECT CAST(token AS CHAR) AS token, CAST(updated_at AS CHAR) AS stamp FROM ${table} WHERE resource = ?`;

  const ensure = tableOnFirstUse(pool, name, CREATE, 'create fence table');

  const readMark = async (db: MysqlPool | MysqlConnection, sql: string, resource: string): Promise<MarkRow | undefined> => {
    const [rows] = await db.query(sql, [resource]);
    return (rows as MarkRow[])[0];
  };

  return {
    async write<R>(resource: string, token: TokenInput, mutate: (tx: MysqlConnection) => R | Promise<R>, writeOptions?: unknown): Promise<R> {
      checkKey(resource, 'resource');
      const t = readToken(resource, token, writeOptions);
      if (typeof mutate !== 'function') throw new InvalidArgumentError('mutate', `expected a function, got ${describe(mutate)}`);
      await ensure();
      const decimal = t.toString();
      let ran = false;
      return retryLockConflicts(
        () => {
          let stamp = '';
          return withGuardedTransaction(
            pool,
            {
              who: 'mutate',
              what: 'the fenced transaction',
              committed: async (conn) => {
                let mark: MarkRow | undefined;
                try {
                  mark = await readMark(conn, READ, resource);
                } catch (error) {
                  throw mapMysqlError('read mark', error);
                }
                if (mark === undefined || BigInt(mark.token) < t) return false; // marks never go down: this write's raise was undone
                return BigInt(mark.token) === t && mark.stamp === stamp ? true : undefined;
              },
              partial: (problem, _certain, cause) => new PartialWriteError(resource, t, problem, { cause }),
            },
            async ({ own, user }) => {
              const mark = await own('fence check', async (conn) => {
                await conn.query(RAISE, [resource, decimal, decimal, decimal, decimal]);
                return readMark(conn, READ_LOCKED, resource);
              });
              if (mark === undefined) throw mapMysqlError('fence check', new Error('the mark row was not found after it was written'));
              const highest = BigInt(mark.token);
              if (highest > t) throw new StaleTokenError(resource, t, highest);
              stamp = mark.stamp;
              ran = true;
              return user(mutate); // the user's error reaches the caller unchanged (after ROLLBACK)
            },
          );
        },
        () => !ran,
      );
    },

    async highest(resource: string): Promise<bigint | null> {
      checkKey(resource, 'resource');
      await ensure();
      try {
        const mark = await readMark(pool, READ, resource);
        return mark === undefined ? null : BigInt(mark.token);
      } catch (error) {
        throw mapMysqlError('read mark', error);
      }
    },
  };
}

import { InvalidArgumentError, PartialWriteError, StaleTokenError } from '../core/errors.js';
import type { IdempotencyRecord, TransactionalIdempotencyStore } from '../core/idempotency.js';
import { checkKey, checkKnownOptions, checkObject, describe } from '../core/validate.js';
import { tableOnFirstUse } from './table.js';
import { retryLockConflicts, withGuardedTransaction, type GuardedTransaction } from './transaction.js';
import { checkMysqlIdentifier, checkPool, mapMysqlError, quoteMysql, type MysqlConnection, type MysqlPool } from './util.js';
import { dropConnection } from './pool.js';

export interface MysqlIdempotencyStoreOptions {
  /** Table of records, in the connection's database (created on first use). @default 'leasehold_idempotency' */
  table?: string;
}

/** Expired rows purged by one put or claim, so a write never pays for a long backlog. */
const PURGE_BATCH = 64;

/** A record's row as the store reads it: the token as a decimal string (never a JS number). */
interface RecordRow {
  token: string;
  state: IdempotencyRecord['state'] | null;
  payload_hash: string;
  value: string | null;
  /** 1 while the row has not expired (LOCK only). */
  live?: number | string;
}

/**
 * Idempotency records in MySQL or MariaDB (a `mysql2/promise` pool; InnoDB), one row per key.
 * The row is also the key's fence: its `token` is the highest token that wrote for the key. Every
 * write is one short transaction on one pooled connection that locks the row (`SELECT … FOR
 * UPDATE`; writers of a key wait for each other there), refuses a token below the stored one
 * (StaleTokenError, nothing changed; I3) and writes; a claim in the same transaction first
 * replays a live completed record instead of writing, so a completion that lands just before a
 * takeover's claim is never overwritten. Giving a key back (fn threw) keeps the row, with no
 * state, for its mark. A deadlock or lock-wait timeout is retried inside the operation.
 *
 * Every row expires keepMs after its last write, by the server's clock (`UTC_TIMESTAMP(6)`, I7;
 * independent of the session's time zone): `get` no longer sees it, and each put or claim purges
 * up to 64 expired rows of other keys in its transaction (`FOR UPDATE SKIP LOCKED`: it never waits
 * for a row someone else holds). The mark goes with the row: an attempt that wakes more than
 * keepMs (default 24 h) after the key's last write is no longer refused.
 *
 * `transact` (for `runInTransaction`) runs `effect(conn)` in one transaction on one pooled
 * connection and writes the completed record last, fenced, in the same transaction: a refusal or
 * an error rolls the effect back with it. The record's row is not locked while `effect` runs (a
 * first look, which does not lock, skips an effect that is already stale), so an attempt paused
 * inside its transaction does not stop the one that takes over, and is refused whole when it
 * wakes. `effect` gets the guarded view mysqlFence's `mutate` gets (see mysqlFence): statements
 * that end, open or implicitly commit the transaction, `release()` and the like are refused
 * (rolled back); an effect that ends the transaction anyway is PartialWriteError (what it ran
 * before may have been committed; the completed record was not written).
 */
export function mysqlIdempotencyStore(pool: MysqlPool, options?: MysqlIdempotencyStoreOptions): TransactionalIdempotencyStore<MysqlConnection> {
  checkPool(pool, 'pool');
  const o = checkObject(options, 'options');
  checkKnownOptions(o, ['table'], 'options');
  const name = checkMysqlIdentifier(o.table ?? 'leasehold_idempotency', 'table');
  const table = quoteMysql(name);

  /** Keys up to 1024 UTF-8 bytes, compared byte by byte; the result as utf8mb4 text. */
  const CREATE = `CREATE TABLE IF NOT EXISTS ${table} (
    \`key\` VARBINARY(1024) NOT NULL PRIMARY KEY,
    token BIGINT UNSIGNED NOT NULL,
    state VARCHAR(16) NULL,
    payload_hash VARCHAR(128) NOT NULL DEFAULT '',
    value LONGTEXT NULL,
    expires_at DATETIME(6) NOT NULL,
    INDEX ${quoteMysql(`${name.slice(0, 50)}_expires_at`)} (expires_at)
  ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`;
  /** A live record: a state (not given back) and not expired. */
  const GET = `SELECT CAST(token AS CHAR) AS token, state, payload_hash, value FROM ${table}
    WHERE \`key\` = ? AND state IS NOT NULL AND expires_at > UTC_TIMESTAMP(6)`;
  /** transact's first look: does not lock, so a paused attempt holds nothing while its effect runs. */
  const MARK = `SELECT CAST(token AS CHAR) AS token FROM ${table} WHERE \`key\` = ?`;
  /** The key's row, locked to COMMIT (a missing row's gap is locked instead): what the write decides on. */
  const LOCK = `SELECT CAST(token AS CHAR) AS token, state, payload_hash, value, expires_at > UTC_TIMESTAMP(6) AS live FROM ${table}
    WHERE \`key\` = ? FOR UPDATE`;
  const INSERT = `INSERT INTO ${table} (\`key\`, token, state, payload_hash, value, expires_at)
    VALUES (?, CAST(? AS UNSIGNED), ?, ?, ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)`;
  const UPDATE = `UPDATE ${table} SET token = CAST(? AS UNSIGNED), state = ?, payload_hash = ?, value = ?,
    expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND WHERE \`key\` = ?`;
  /** Other keys' expired rows, read without locking; then locked, skipping any someone holds, and deleted. */
  const EXPIRED = `SELECT \`key\` FROM ${table} WHERE expires_at <= UTC_TIMESTAMP(6) AND \`key\` <> ? LIMIT ${PURGE_BATCH}`;
  const LOCK_EXPIRED = `SELECT \`key\` FROM ${table} WHERE \`key\` IN (?) AND expires_at <= UTC_TIMESTAMP(6) FOR UPDATE SKIP LOCKED`;
  const PURGE = `DELETE FROM ${table} WHERE \`key\` IN (?)`;

  const ensure = tableOnFirstUse(pool, name, CREATE, 'create idempotency table');

  const rowsOf = async <T>(answer: Promise<[unknown, unknown]>): Promise<T[]> => (await answer)[0] as T[];
  const toRecord = (row: RecordRow): IdempotencyRecord => ({
    state: row.state as IdempotencyRecord['state'],
    token: BigInt(row.token),
    payloadHash: row.payload_hash,
    ...(row.value === null ? {} : { value: row.value }),
  });
  const stale = (key: string, token: bigint, highest: bigint): StaleTokenError => new StaleTokenError(`idempotency:${key}`, token, highest);

  /** Deletes up to PURGE_BATCH expired rows of other keys, inside the caller's transaction. */
  const purge = async (conn: MysqlConnection, key: string): Promise<void> => {
    const expired = await rowsOf<{ key: unknown }>(conn.query(EXPIRED, [key]));
    if (expired.length === 0) return;
    const locked = await rowsOf<{ key: unknown }>(conn.query(LOCK_EXPIRED, [expired.map((r) => r.key)]));
    if (locked.length > 0) await conn.query(PURGE, [locked.map((r) => r.key)]);
  };

  /** Writes the record (state NULL: given back) over the row LOCK read (or in place of the missing one). */
  const write = async (conn: MysqlConnection, exists: boolean, key: string, token: bigint, record: IdempotencyRecord | undefined, keepMs: number) => {
    const fields = [token.toString(), record?.state ?? null, record?.payloadHash ?? '', record?.value ?? null, Math.max(0, Math.round(keepMs)) * 1000];
    await (exists ? conn.query(UPDATE, [...fields, key]) : conn.query(INSERT, [key, ...fields]));
  };

  /**
   * One short transaction of the store's own (no user code in it): purge, lock the key's row,
   * `decide` on it, and write when it says so. Deadlocks and lock-wait timeouts run it again.
   */
  const locked = <T>(what: string, key: string, body: (conn: MysqlConnection, row: RecordRow | undefined) => Promise<T>): Promise<T> =>
    retryLockConflicts(async () => {
      let conn: MysqlConnection;
      try {
        conn = await pool.getConnection();
      } catch (error) {
        throw mapMysqlError('connect', error);
      }
      let broken = false;
      try {
        await conn.query('START TRANSACTION');
        await purge(conn, key);
        const [row] = await rowsOf<RecordRow>(conn.query(LOCK, [key]));
        const result = await body(conn, row);
        await conn.query('COMMIT');
        return result;
      } catch (error) {
        if ((error as { fatal?: unknown } | null)?.fatal === true) broken = true;
        if (!broken) await conn.query('ROLLBACK').catch(() => (broken = true));
        throw mapMysqlError(what, error);
      } finally {
        if (broken) dropConnection(conn);
        else conn.release();
      }
    });

  return {
    async get(key) {
      checkKey(key, 'key');
      await ensure();
      try {
        const [row] = await rowsOf<RecordRow>(pool.query(GET, [key]));
        return row === undefined ? undefined : toRecord(row);
      } catch (error) {
        throw mapMysqlError('idempotency read', error);
      }
    },

    async claim(key, token, record, keepMs) {
      checkKey(key, 'key');
      await ensure();
      return locked('idempotency claim', key, async (conn, row) => {
        // A live completed record is replayed, whoever wrote it; nothing is written then.
        if (row?.state === 'completed' && Number(row.live) === 1) return toRecord(row);
        if (row !== undefined && BigInt(row.token) > token) throw stale(key, token, BigInt(row.token));
        await write(conn, row !== undefined, key, token, record, keepMs);
        return undefined;
      });
    },

    async put(key, token, record, keepMs) {
      checkKey(key, 'key');
      await ensure();
      await locked('idempotency write', key, async (conn, row) => {
        if (row !== undefined && BigInt(row.token) > token) throw stale(key, token, BigInt(row.token));
        await write(conn, row !== undefined, key, token, record, keepMs);
      });
    },

    async transact<R>(
      key: string,
      token: bigint,
      effect: (tx: MysqlConnection) => R | Promise<R>,
      complete: (result: R) => IdempotencyRecord,
      keepMs: number,
    ): Promise<R> {
      checkKey(key, 'key');
      if (typeof effect !== 'function') throw new InvalidArgumentError('effect', `expected a function, got ${describe(effect)}`);
      await ensure();
      let ran = false;
      const body = async ({ own, user }: GuardedTransaction): Promise<R> => {
        // A first look: an attempt already taken over does not run its effect at all.
        const [seen] = await own('idempotency read', (conn) => rowsOf<{ token: string }>(conn.query(MARK, [key])));
        if (seen !== undefined && BigInt(seen.token) > token) throw stale(key, token, BigInt(seen.token));
        ran = true;
        const result = await user(effect);
        const record = complete(result);
        // The fence, last: the row is locked from here to COMMIT only.
        const [row] = await own('idempotency write', (conn) => rowsOf<RecordRow>(conn.query(LOCK, [key])));
        if (row !== undefined && BigInt(row.token) > token) throw stale(key, token, BigInt(row.token));
        await own('idempotency write', (conn) => write(conn, row !== undefined, key, token, record, keepMs));
        return result;
      };
      return retryLockConflicts(
        () =>
          withGuardedTransaction(
            pool,
            {
              who: 'fn',
              what: 'the idempotency transaction',
              committed: async () => undefined, // the effect's writes are the only ones before the record: no mark tells them
              partial: (problem, _certain, cause) =>
                new PartialWriteError(`idempotency:${key}`, token, `${problem}; the completed record was not written`, { cause }),
            },
            body,
          ),
        () => !ran,
      );
    },
  };
}

// ShedLock's own statements, the peer of the SQL benchmarks: what users of its JDBC provider run today,
// sent from Node as ShedLock sends them, so that leasehold is measured against the method rather than
// against the JVM.
//
// Source: lukas-krecan/ShedLock, providers/sql/shedlock-sql-support/src/main/java/net/javacrumbs/
// shedlock/provider/sql/{MySqlServerTimeStatementsSource,PostgresSqlServerTimeStatementsSource}.java
// (the same statements as providers/jdbc/shedlock-provider-jdbc-template/…/jdbctemplate/ before the
// move): the statements of `usingDbTime()`, the configuration ShedLock's README recommends, in which
// the database's clock decides expiry (as in leasehold). The tables are the README's
// ("JdbcTemplate … create lock table"). The flow is shedlock-core's StorageBasedLockProvider: the
// first attempt on a name inserts its row (INSERT IGNORE / INSERT … ON CONFLICT DO UPDATE … WHERE
// lock_until <= now); a process then remembers that the row exists and every later attempt is the
// UPDATE … WHERE name = ? AND lock_until <= now; unlock sets lock_until to
// max(now, locked_at + lockAtLeastFor). Each statement runs alone in autocommit: one round trip and
// one commit each. (Through Spring's TransactionTemplate, as JdbcTemplateStorageAccessor runs them,
// each is wrapped in a transaction of its own, which adds the driver's transaction round trips: this
// peer is ShedLock's statements at their cheapest.)
//
// ShedLock does not wait: a busy lock skips the run (the next scheduled run tries again). To wait for
// a lock on such a table, a caller tries again at a fixed interval; Spring Integration's
// JdbcLockRegistry, the JDBC table lock of the same users that does wait, sleeps 100 ms between tries
// by default (idleBetweenTries, "Defaults to 100 milliseconds"). The benches run the peer at that
// interval and at a tight one.
import { setTimeout as sleep } from 'node:timers/promises';

const MYSQL_NOW = 'UTC_TIMESTAMP(3)';
const PG_NOW = "timezone('utc', CURRENT_TIMESTAMP)";

/**
 * MySQL / MariaDB (MySqlServerTimeStatementsSource). Durations in µs; `?` placeholders, in order.
 * Each statement: (table) → (name, lockedBy, µs) → [sql, values].
 */
export const SHEDLOCK_MYSQL = {
  /** ShedLock's README, "MySQL, MariaDB". */
  createTable: (t) =>
    `CREATE TABLE ${t}(name VARCHAR(64) NOT NULL, lock_until TIMESTAMP(3) NOT NULL, ` +
    `locked_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3), locked_by VARCHAR(255) NOT NULL, PRIMARY KEY (name))`,
  insert: (t) => (name, lockedBy, atMostUs) => [
    `INSERT IGNORE INTO ${t}(name, lock_until, locked_at, locked_by) VALUES(?, TIMESTAMPADD(MICROSECOND, ?, ${MYSQL_NOW}), ${MYSQL_NOW}, ?)`,
    [name, atMostUs, lockedBy],
  ],
  update: (t) => (name, lockedBy, atMostUs) => [
    `UPDATE ${t} SET lock_until = TIMESTAMPADD(MICROSECOND, ?, ${MYSQL_NOW}), locked_at = ${MYSQL_NOW}, locked_by = ? ` +
      `WHERE name = ? AND lock_until <= ${MYSQL_NOW}`,
    [atMostUs, lockedBy, name],
  ],
  unlock: (t) => (name, lockedBy, atLeastUs) => [
    `UPDATE ${t} SET lock_until = IF (TIMESTAMPADD(MICROSECOND, ?, locked_at) > ${MYSQL_NOW} , ` +
      `TIMESTAMPADD(MICROSECOND, ?, locked_at), ${MYSQL_NOW}) WHERE name = ? AND locked_by = ?`,
    [atLeastUs, atLeastUs, name, lockedBy],
  ],
  /** µs, as ShedLock's params() passes lockAtMostFor / lockAtLeastFor (`toNanos() / 1_000`). */
  duration: (ms) => ms * 1000,
};

/** PostgreSQL (PostgresSqlServerTimeStatementsSource). Durations in seconds; $1 name, $2 duration, $3 locked_by. */
export const SHEDLOCK_POSTGRES = {
  /** ShedLock's README, "Postgres". */
  createTable: (t) =>
    `CREATE TABLE ${t}(name VARCHAR(64) NOT NULL, lock_until TIMESTAMP NOT NULL, locked_at TIMESTAMP NOT NULL, ` +
    `locked_by VARCHAR(255) NOT NULL, PRIMARY KEY (name))`,
  insert: (t) => (name, lockedBy, atMostSecs) => [
    `INSERT INTO ${t}(name, lock_until, locked_at, locked_by) VALUES($1, ${PG_NOW} + make_interval(secs => $2), ${PG_NOW}, $3) ` +
      `ON CONFLICT (name) DO UPDATE SET lock_until = ${PG_NOW} + make_interval(secs => $2), locked_at = ${PG_NOW}, locked_by = $3 ` +
      `WHERE ${t}.name = $1 AND ${t}.lock_until <= ${PG_NOW}`,
    [name, atMostSecs, lockedBy],
  ],
  update: (t) => (name, lockedBy, atMostSecs) => [
    `UPDATE ${t} SET lock_until = ${PG_NOW} + make_interval(secs => $2), locked_at = ${PG_NOW}, locked_by = $3 ` +
      `WHERE ${t}.name = $1 AND ${t}.lock_until <= ${PG_NOW}`,
    [name, atMostSecs, lockedBy],
  ],
  unlock: (t) => (name, lockedBy, atLeastSecs) => [
    `UPDATE ${t} SET lock_until = CASE WHEN locked_at + make_interval(secs => $2) > ${PG_NOW} ` +
      `THEN locked_at + make_interval(secs => $2) ELSE ${PG_NOW} END WHERE name = $1 AND locked_by = $3`,
    [name, atLeastSecs, lockedBy],
  ],
  /** Seconds, as ShedLock's params() passes them (`toMillis() / 1000d`). */
  duration: (ms) => ms / 1000,
};

/**
 * A client on ShedLock's statements: lock(name) tries (insert once per name, then update) and, while
 * the name is held, tries again every `pollMs`; it resolves to the unlock.
 *
 * - `run(sql, values, kind)` sends one statement ('acquire' or 'release': which call it is part of) and
 *   resolves to the rows it changed.
 * - `lockAtMostForMs` is ShedLock's lease (the row's lock_until): kept far above any section here, so
 *   that no overlap can come from expiry and the figures are about waiting, not about the ttl.
 * - `lockedBy`: ShedLock's default is the host name; each client here is one "host".
 */
export function shedlockClient({ dialect, table, run, lockedBy, pollMs, lockAtMostForMs = 30_000, lockAtLeastForMs = 0, close = async () => {} }) {
  const insert = dialect.insert(table);
  const update = dialect.update(table);
  const unlock = dialect.unlock(table);
  const atMost = dialect.duration(lockAtMostForMs);
  const atLeast = dialect.duration(lockAtLeastForMs);
  /** StorageBasedLockProvider's LockRecordRegistry: names whose row this client knows to exist. */
  const rows = new Set();
  const tryLock = async (name) => {
    if (!rows.has(name)) {
      const inserted = (await run(...insert(name, lockedBy, atMost), 'acquire')) > 0;
      rows.add(name);
      if (inserted) return true;
    }
    return (await run(...update(name, lockedBy, atMost), 'acquire')) > 0;
  };
  return {
    lock: async (name) => {
      while (!(await tryLock(name))) await sleep(pollMs);
      return async () => {
        await run(...unlock(name, lockedBy, atLeast), 'release');
      };
    },
    close,
  };
}

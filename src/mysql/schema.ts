import { createHash } from 'node:crypto';
import { InvalidArgumentError } from '../core/errors.js';
import { checkKnownOptions, checkObject, describe } from '../core/validate.js';
import { checkMysqlIdentifier, quoteMysql } from './util.js';

/**
 * The lease store's schema on MySQL / MariaDB, as plain SQL: four InnoDB tables and five stored
 * procedures in the connection's database. Acquire, release, cancel and a session's keep-alive and
 * end are one `CALL` each, renew one UPDATE: one round trip per operation, on any autocommit pool.
 *
 * Written for what both MariaDB 10.11 (tested here) and MySQL 8.0 run: no RETURNING, no CREATE OR
 * REPLACE PROCEDURE (DROP PROCEDURE IF EXISTS, then CREATE PROCEDURE), no MariaDB-only syntax.
 *
 * Bump SCHEMA_VERSION whenever the DDL below changes; the backend compares it with the comment of
 * the acquire procedure (information_schema.ROUTINES) to decide whether its DDL has to run.
 * /2 added sessions (a table, a column and index on the holders); /3 only changed procedures (the
 * acquire's busy answer gives the caller's queue place, release, cancel and a session's end the
 * queue's head, for the pollers' wake-ups: see wake.ts), so a /2 store is upgraded by re-creating them.
 */
export const SCHEMA_VERSION = 'leasehold-locks-mysql/3';

/**
 * SQLSTATE the acquire procedure SIGNALs when a request names a limit the key does not have (see
 * `AcquireRequest.limit`); its message ends with `held=<limit>` (or `held=none` for plain shared
 * holders). The SIGNAL rolls the call back: nothing is written.
 */
export const LIMIT_CONFLICT_STATE = 'LH001';

/** Keys are stored as their UTF-8 bytes, up to core's MAX_KEY_BYTES (1024). */
export const KEY_BYTES = 1024;
/** Owner ids are secret and opaque; core's are 32 hex characters. */
export const OWNER_BYTES = 255;
/** Public holder labels (core allows 200 characters). */
export const HOLDER_CHARS = 1024;
/** Session ids are secret and opaque; ours are 22 characters (128 random bits, base64url). A longer id names no session. */
export const SESSION_BYTES = 64;

/**
 * How long a procedure waits for a row lock another call holds (innodb_lock_wait_timeout, whole
 * seconds, set for the call and put back after it): every lock the procedures take is held for one
 * short transaction, so a wait this long means an overloaded or stuck server; the backend retries
 * the call a few times, then reports the backend unavailable.
 */
export const LOCK_WAIT_S = 2;

/** Longest table name: the derived names (the longest is `<table>_session_end`) must stay within MySQL's 64 characters. */
const MAX_TABLE_NAME = 64 - '_session_end'.length;
/** GET_LOCK names are at most 64 characters. */
const MAX_LOCK_NAME = 64;

export interface MysqlSchemaOptions {
  /**
   * Table of current holders, in the connection's database (at most 52 characters); the others are
   * `<table>_keys`, `<table>_waiters` and `<table>_sessions`, the procedures `<table>_acquire`,
   * `<table>_release`, `<table>_cancel`, `<table>_keepalive` and `<table>_session_end`.
   * @default 'leasehold_locks'
   */
  table?: string;
}

/** Every name the backend uses, quoted (unqualified: they live in the connection's current database). */
export interface SchemaNames {
  readonly table: string;
  /** One row per key ever granted: the token counter, the lock-delay, the change counter. Never deleted (I1). */
  readonly keys: string;
  /** One row per current holder (several for shared holders and permits). */
  readonly holders: string;
  /** The fair queue: one row per waiting owner, in arrival order (`seq`). */
  readonly waiters: string;
  /** Sessions (`Backend.sessions`): one row per open session, live until `expires_at`; its holders refer to it. */
  readonly sessions: string;
  readonly acquireProc: string;
  readonly releaseProc: string;
  readonly cancelProc: string;
  /** A session's keep-alive (or a session-bound holder's renewal): extends the session and every holder bound to it (`sessions.ts`). */
  readonly keepAliveProc: string;
  /** Ends a session and frees its holders, raising their keys' change counters (`sessions.ts`). */
  readonly sessionEndProc: string;
  /** The acquire procedure's name as information_schema.ROUTINES has it (the schema version is its COMMENT). */
  readonly acquireRoutine: string;
}

export function schemaNames(options: MysqlSchemaOptions | undefined): SchemaNames {
  const o = checkObject(options, 'options');
  const table = checkMysqlIdentifier(o.table ?? 'leasehold_locks', 'table');
  if (table.length > MAX_TABLE_NAME) {
    throw new InvalidArgumentError('table', `at most ${MAX_TABLE_NAME} characters (leasehold derives longer names from it), got ${table.length}`);
  }
  const q = (suffix: string): string => quoteMysql(`${table}${suffix}`);
  return {
    table,
    keys: q('_keys'),
    holders: q(''),
    waiters: q('_waiters'),
    sessions: q('_sessions'),
    acquireProc: q('_acquire'),
    releaseProc: q('_release'),
    cancelProc: q('_cancel'),
    keepAliveProc: q('_keepalive'),
    sessionEndProc: q('_session_end'),
    acquireRoutine: `${table}_acquire`,
  };
}

/** GET_LOCK name serialising the DDL of one lease table across processes (a digest when `leasehold:<db>.<table>` is too long). */
export function ddlLockName(database: string, table: string): string {
  const plain = `leasehold:${database}.${table}`;
  return plain.length <= MAX_LOCK_NAME ? plain : `leasehold:${createHash('sha256').update(`${database}.${table}`).digest('hex').slice(0, 40)}`;
}

/**
 * The opening every procedure shares: its transaction runs at READ COMMITTED (no gap locks, so calls
 * on neighbouring keys never deadlock on the gaps between their rows; every statement sees what
 * committed before it, which the row lock on the key then keeps still) with a short lock wait, put
 * back when the call ends. On any error the transaction is rolled back, the setting restored and
 * the error raised again as it was (a deadlock, a lock-wait timeout: the backend retries the call).
 *
 * SET TRANSACTION fails when the connection already has a transaction open (a pool whose
 * connection was returned mid-transaction): it must, since START TRANSACTION would commit it.
 */
const BEGIN_CALL = `
  DECLARE EXIT HANDLER FOR SQLEXCEPTION
  BEGIN
    ROLLBACK;
    SET SESSION innodb_lock_wait_timeout = v_saved_wait;
    RESIGNAL;
  END;
  SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
  SET SESSION innodb_lock_wait_timeout = ${LOCK_WAIT_S};
  START TRANSACTION;`;

/** Commits and puts the session's lock wait back, before the procedure's one result set. */
const END_CALL = `COMMIT;
    SET SESSION innodb_lock_wait_timeout = v_saved_wait;`;

/** Rolls back what the call wrote (an answer that must write nothing) and puts the lock wait back. */
const ABORT_CALL = `ROLLBACK;
    SET SESSION innodb_lock_wait_timeout = v_saved_wait;`;

/**
 * Removes the key's expired holders (and, in release, the caller's own holding: `alsoHolder`) and
 * expired queue places. The rows are read with a locking read first, so a renewal racing with the
 * purge is either seen (and its holder kept) or made to wait and then find its holder gone; that
 * read gives the number of holders removed and the end of the lock-delay that the expired ones
 * start (I8), and in release whether the caller's holding was live. Sets v_removed (rows gone),
 * v_purged_delay and v_released. The caller holds the key's row lock and has set v_now.
 */
function purge(n: SchemaNames, alsoHolder: string, key = 'p_key'): string {
  const which = `h.\`key\` = ${key} AND (h.expires_at <= v_now ${alsoHolder})`;
  return `SELECT COUNT(*),
           MAX(CASE WHEN h.expires_at <= v_now AND h.lock_delay_ms > 0 THEN h.expires_at + INTERVAL h.lock_delay_ms * 1000 MICROSECOND END),
           COALESCE(MAX(h.expires_at > v_now), FALSE)
      INTO v_removed, v_purged_delay, v_released
      FROM ${n.holders} h WHERE ${which} FOR UPDATE;
    IF v_removed > 0 THEN
      DELETE h FROM ${n.holders} h WHERE ${which};
    END IF;
    DELETE FROM ${n.waiters} WHERE \`key\` = ${key} AND expires_at <= v_now;
    SET v_removed = v_removed + ROW_COUNT();
    IF v_purged_delay IS NOT NULL AND (v_delay IS NULL OR v_purged_delay > v_delay) THEN
      SET v_delay = v_purged_delay;
    END IF;`;
}

/**
 * The key's first live queue place and first exclusive one (\`head\`, \`exclusive_head\`), after a
 * change: this instance's pollers wake at once only the waiters whose place that lets go (see
 * wake.ts), as a poll round would. Read after the commit (the call's last result set).
 */
export function queueHeads(n: SchemaNames, key = 'p_key'): string {
  const live = `w.\`key\` = ${key} AND w.expires_at > UTC_TIMESTAMP(6)`;
  return `(SELECT CAST(MIN(w.seq) AS CHAR) FROM ${n.waiters} w WHERE ${live}) AS head,
    (SELECT CAST(MIN(w.seq) AS CHAR) FROM ${n.waiters} w WHERE ${live} AND w.mode = 'exclusive') AS exclusive_head`;
}

/** The key's row lock for release, cancel and a session's end: a key never granted has nothing to release (and no row is made for it). */
function lockExistingKey(n: SchemaNames, key = 'p_key'): string {
  return `SELECT COUNT(*), MAX(k.delay_until) INTO v_found, v_delay FROM ${n.keys} k WHERE k.\`key\` = ${key} FOR UPDATE;`;
}

/** Declarations shared by the procedures (the lock wait to put back, the purge's outputs). */
const COMMON_DECLARATIONS = `
  DECLARE v_saved_wait BIGINT DEFAULT @@SESSION.innodb_lock_wait_timeout;
  DECLARE v_now DATETIME(6);
  DECLARE v_delay DATETIME(6);
  DECLARE v_removed BIGINT DEFAULT 0;
  DECLARE v_purged_delay DATETIME(6);
  DECLARE v_released BOOLEAN DEFAULT FALSE;
  DECLARE v_version BIGINT;`;

const KEY_PARAM = `p_key VARBINARY(${KEY_BYTES})`;
const OWNER_PARAM = `p_owner VARBINARY(${OWNER_BYTES})`;
const SESSION_TYPE = `VARBINARY(${SESSION_BYTES})`;

/** The acquire procedure's answer that the request's session is gone (closed, ran out, never opened). */
const SESSION_LOST_ROW = 'SELECT FALSE AS granted, NULL AS token, NULL AS holder, NULL AS retry_in_ms, NULL AS version, TRUE AS session_lost, NULL AS seq;';

/**
 * The DDL as a list of statements, each idempotent (IF NOT EXISTS; DROP PROCEDURE IF EXISTS before
 * each CREATE PROCEDURE). The backend runs them under GET_LOCK, so concurrent first starts do not
 * race, and creates the acquire procedure last: its COMMENT (the version) appears only once
 * everything else exists.
 */
export function schemaStatements(n: SchemaNames): string[] {
  return [
    // Keys as bytes (VARBINARY compares bytewise: no collation folds two keys into one, and a
    // prefix is a byte range). last_token never goes back and the row is never deleted (I1).
    `CREATE TABLE IF NOT EXISTS ${n.keys} (
  \`key\` VARBINARY(${KEY_BYTES}) NOT NULL,
  last_token BIGINT UNSIGNED NOT NULL DEFAULT 0,
  delay_until DATETIME(6) NULL,
  version BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (\`key\`)
) ENGINE=InnoDB`,

    `CREATE TABLE IF NOT EXISTS ${n.holders} (
  \`key\` VARBINARY(${KEY_BYTES}) NOT NULL,
  owner VARBINARY(${OWNER_BYTES}) NOT NULL,
  mode ENUM('exclusive', 'shared') NOT NULL,
  token BIGINT UNSIGNED NOT NULL,
  holder VARCHAR(${HOLDER_CHARS}) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  acquired_at DATETIME(6) NOT NULL,
  expires_at DATETIME(6) NOT NULL,
  lock_delay_ms BIGINT UNSIGNED NOT NULL DEFAULT 0,
  permit_limit INT NULL,
  \`session\` ${SESSION_TYPE} NULL,
  PRIMARY KEY (\`key\`, owner),
  KEY by_session (\`session\`)
) ENGINE=InnoDB`,

    // The session a holder is bound to (NULL: renewed on its own). Its expires_at is then the
    // session's, moved by every keep-alive, so it stays the one truth every other statement reads;
    // a keep-alive and a session's end find the session's holders by the index. Tables made before
    // sessions (leasehold-locks-mysql/1) get both here: MySQL 8 has no ADD COLUMN IF NOT EXISTS, so
    // the ALTER runs only when information_schema lacks the column (one ALTER: column and index
    // come together, or not at all).
    ...addColumnOnce(n, 'session', `ADD COLUMN \`session\` ${SESSION_TYPE} NULL, ADD KEY by_session (\`session\`)`),

    // Sessions (Backend.sessions): one row per session, live until expires_at (this server's clock,
    // I7). Rows that ran out are deleted by the next open (by the expiry index); their holders are
    // not touched (they expired with them, and are purged with their lock-delay like any other, I8).
    `CREATE TABLE IF NOT EXISTS ${n.sessions} (
  id ${SESSION_TYPE} NOT NULL,
  expires_at DATETIME(6) NOT NULL,
  PRIMARY KEY (id),
  KEY by_expiry (expires_at)
) ENGINE=InnoDB`,

    // seq orders the queue (AUTO_INCREMENT needs an index of its own).
    `CREATE TABLE IF NOT EXISTS ${n.waiters} (
  \`key\` VARBINARY(${KEY_BYTES}) NOT NULL,
  owner VARBINARY(${OWNER_BYTES}) NOT NULL,
  mode ENUM('exclusive', 'shared') NOT NULL,
  seq BIGINT NOT NULL AUTO_INCREMENT,
  expires_at DATETIME(6) NOT NULL,
  PRIMARY KEY (\`key\`, owner),
  UNIQUE KEY (seq)
) ENGINE=InnoDB`,

    // Release by owner and token (I4), in the statement that purges: a holder that expired before
    // its release is purged (its lock-delay starts, I8), not "released". Answers whether the
    // caller's live holding went, and the key's change counter (raised when anything went).
    `DROP PROCEDURE IF EXISTS ${n.releaseProc}`,
    `CREATE PROCEDURE ${n.releaseProc}(IN ${KEY_PARAM}, IN ${OWNER_PARAM}, IN p_token BIGINT UNSIGNED)
MODIFIES SQL DATA
proc: BEGIN${COMMON_DECLARATIONS}
  DECLARE v_found BIGINT DEFAULT 0;${BEGIN_CALL}
  ${lockExistingKey(n)}
  IF v_found = 0 THEN
    ${END_CALL}
    SELECT FALSE AS released, NULL AS version;
    LEAVE proc;
  END IF;
  SET v_now = UTC_TIMESTAMP(6);
  ${purge(n, 'OR (h.owner = p_owner AND h.token = p_token)')}
  IF v_removed > 0 THEN
    UPDATE ${n.keys} SET delay_until = v_delay, version = version + 1 WHERE \`key\` = p_key;
  END IF;
  SET v_version = (SELECT k.version FROM ${n.keys} k WHERE k.\`key\` = p_key);
  ${END_CALL}
  SELECT v_released AS released, CAST(v_version AS CHAR) AS version, ${queueHeads(n)};
END`,

    // A waiter that gave up leaves the queue, so the next one need not wait for its place to expire.
    `DROP PROCEDURE IF EXISTS ${n.cancelProc}`,
    `CREATE PROCEDURE ${n.cancelProc}(IN ${KEY_PARAM}, IN ${OWNER_PARAM})
MODIFIES SQL DATA
proc: BEGIN${COMMON_DECLARATIONS}
  DECLARE v_found BIGINT DEFAULT 0;
  DECLARE v_left BIGINT DEFAULT 0;${BEGIN_CALL}
  ${lockExistingKey(n)}
  IF v_found = 0 THEN
    ${END_CALL}
    SELECT FALSE AS left_queue, NULL AS version;
    LEAVE proc;
  END IF;
  SET v_now = UTC_TIMESTAMP(6);
  DELETE FROM ${n.waiters} WHERE \`key\` = p_key AND owner = p_owner;
  SET v_left = ROW_COUNT();
  ${purge(n, '')}
  IF v_left > 0 OR v_removed > 0 THEN
    UPDATE ${n.keys} SET delay_until = v_delay, version = version + 1 WHERE \`key\` = p_key;
  END IF;
  SET v_version = (SELECT k.version FROM ${n.keys} k WHERE k.\`key\` = p_key);
  ${END_CALL}
  SELECT v_left > 0 AS left_queue, CAST(v_version AS CHAR) AS version, ${queueHeads(n)};
END`,

    // A session's keep-alive: the session and every holder bound to it live p_ttl_ms from now (this
    // server's clock, I7), in one call; alive FALSE when the session is gone (closed, or ran out).
    // The session's row is locked first: acquires binding a holder to the session hold it in share
    // mode until they commit, so the UPDATE of the holders then sees their rows.
    // A session-bound holder's renewal calls it with p_id NULL and the holder (key, owner, token):
    // its session is kept alive, if the holder is live and still bound to it once the session's row
    // is locked (a release may have committed in between: then nothing is written).
    `DROP PROCEDURE IF EXISTS ${n.keepAliveProc}`,
    `CREATE PROCEDURE ${n.keepAliveProc}(IN p_id ${SESSION_TYPE}, IN p_ttl_ms BIGINT, IN ${KEY_PARAM}, IN ${OWNER_PARAM}, IN p_token BIGINT UNSIGNED)
MODIFIES SQL DATA
proc: BEGIN${COMMON_DECLARATIONS}
  DECLARE v_id ${SESSION_TYPE};
  DECLARE v_expiry DATETIME(6);
  DECLARE v_bound BIGINT DEFAULT 0;${BEGIN_CALL}
  SET v_id = p_id;
  IF v_id IS NULL THEN
    SET v_id = (SELECT h.\`session\` FROM ${n.holders} h
      WHERE h.\`key\` = p_key AND h.owner = p_owner AND h.token = p_token AND h.expires_at > UTC_TIMESTAMP(6));
  END IF;
  IF v_id IS NOT NULL THEN
    SELECT MAX(s.expires_at) INTO v_expiry FROM ${n.sessions} s WHERE s.id = v_id FOR UPDATE;
  END IF;
  SET v_now = UTC_TIMESTAMP(6);
  IF v_expiry IS NULL OR v_expiry <= v_now THEN
    ${END_CALL}
    SELECT FALSE AS alive;
    LEAVE proc;
  END IF;
  SET v_expiry = v_now + INTERVAL p_ttl_ms * 1000 MICROSECOND;
  UPDATE ${n.sessions} SET expires_at = v_expiry WHERE id = v_id;
  UPDATE ${n.holders} SET expires_at = v_expiry WHERE \`session\` = v_id AND expires_at > v_now;
  IF p_id IS NULL THEN
    SELECT COUNT(*) INTO v_bound FROM ${n.holders} h
      WHERE h.\`key\` = p_key AND h.owner = p_owner AND h.token = p_token AND h.\`session\` = v_id AND h.expires_at = v_expiry;
    IF v_bound = 0 THEN
      ${ABORT_CALL}
      SELECT FALSE AS alive;
      LEAVE proc;
    END IF;
  END IF;
  ${END_CALL}
  SELECT TRUE AS alive;
END`,

    // A session's end. A live session frees its holders at once, as their releases would (no
    // lock-delay), key by key in key order under each key's row lock, purging what else expired
    // there and raising the key's change counter (pollers in other processes see it); each key
    // freed is one result set (key, version) for this instance's own waiters. A session that
    // already ran out is only deleted: its holders expired with it, and their lock-delay starts when
    // they are purged (I8). The last result set says whether a live session ended.
    `DROP PROCEDURE IF EXISTS ${n.sessionEndProc}`,
    `CREATE PROCEDURE ${n.sessionEndProc}(IN p_id ${SESSION_TYPE})
MODIFIES SQL DATA
proc: BEGIN${COMMON_DECLARATIONS}
  DECLARE v_found BIGINT DEFAULT 0;
  DECLARE v_expiry DATETIME(6);
  DECLARE v_ended BOOLEAN DEFAULT FALSE;
  DECLARE v_key VARBINARY(${KEY_BYTES});${BEGIN_CALL}
  SELECT MAX(s.expires_at) INTO v_expiry FROM ${n.sessions} s WHERE s.id = p_id FOR UPDATE;
  DELETE FROM ${n.sessions} WHERE id = p_id;
  SET v_ended = COALESCE(v_expiry > UTC_TIMESTAMP(6), FALSE);
  IF v_ended THEN
    SET v_key = (SELECT MIN(h.\`key\`) FROM ${n.holders} h WHERE h.\`session\` = p_id);
    WHILE v_key IS NOT NULL DO
      ${lockExistingKey(n, 'v_key')}
      SET v_now = UTC_TIMESTAMP(6);
      ${purge(n, 'OR h.`session` = p_id', 'v_key')}
      IF v_removed > 0 THEN
        UPDATE ${n.keys} SET delay_until = v_delay, version = version + 1 WHERE \`key\` = v_key;
      END IF;
      SELECT v_key AS \`key\`, (SELECT CAST(k.version AS CHAR) FROM ${n.keys} k WHERE k.\`key\` = v_key) AS version, ${queueHeads(n, 'v_key')};
      SET v_key = (SELECT MIN(h.\`key\`) FROM ${n.holders} h WHERE h.\`session\` = p_id AND h.\`key\` > v_key);
    END WHILE;
  END IF;
  ${END_CALL}
  SELECT v_ended AS ended;
END`,

    // The whole grant in one call. A busy answer that changes nothing (a live incompatible holder,
    // the caller's queue place still fresh) is read with one statement, without locking or writing.
    // A permit (p_limit set, p_mode 'shared') also conflicts with p_limit live permits, and is
    // refused (LIMIT_CONFLICT_STATE, rolled back) when the key's shared holders have another limit.
    // Otherwise: lock the key's row (created on first use), purge expired holders (starting their
    // lock-delay, I8) and queue places, check compatibility, lock-delay and the queue, then either
    // raise the token and insert the holder in the same transaction (I1, I2), or refresh the
    // caller's place in the queue and say when to retry. Expiry instants come from this server's
    // clock only (I7), read after the row lock was granted; the client sends durations.
    // The key's change counter (version) moves whenever a waiter may go now: a holder or a queue
    // place went, or a shared grant (the next shared waiter may join); pollers compare it. A busy
    // answer to a queued request also gives the caller's place (seq): pollers wake a waiter only when
    // the queue's head has reached its place (see wake.ts), not every waiter on every release.
    // A request bound to a session (p_session) is answered session_lost, writing nothing, when the
    // session is gone; otherwise it takes the session's row in share mode (before the key's row: a
    // session's end locks in the same order) so no keep-alive runs between reading the session's
    // expiry and committing the holder that copies it, and the holder's expires_at is the session's.
    `DROP PROCEDURE IF EXISTS ${n.acquireProc}`,
    `CREATE PROCEDURE ${n.acquireProc}(
  IN ${KEY_PARAM}, IN ${OWNER_PARAM}, IN p_mode VARCHAR(9), IN p_ttl_ms BIGINT, IN p_lock_delay_ms BIGINT,
  IN p_holder VARCHAR(${HOLDER_CHARS}) CHARACTER SET utf8mb4, IN p_queue BOOLEAN, IN p_queue_ttl_ms BIGINT, IN p_limit INT,
  IN p_session ${SESSION_TYPE})
MODIFIES SQL DATA
COMMENT ${literal(SCHEMA_VERSION)}
proc: BEGIN${COMMON_DECLARATIONS}
  DECLARE v_busy BIGINT DEFAULT 0;
  DECLARE v_token BIGINT UNSIGNED;
  DECLARE v_conflict BOOLEAN DEFAULT FALSE;
  DECLARE v_holder VARCHAR(${HOLDER_CHARS}) CHARACTER SET utf8mb4;
  DECLARE v_first_expiry DATETIME(6);
  DECLARE v_my_seq BIGINT;
  DECLARE v_blocked BOOLEAN DEFAULT FALSE;
  DECLARE v_changed BOOLEAN DEFAULT FALSE;
  DECLARE v_live_delay DATETIME(6);
  DECLARE v_soonest DATETIME(6);
  DECLARE v_count BIGINT DEFAULT 0;
  DECLARE v_mismatch BOOLEAN DEFAULT FALSE;
  DECLARE v_held_limit INT;
  DECLARE v_session_expiry DATETIME(6);
  DECLARE v_message VARCHAR(128);${BEGIN_CALL}
  SET v_now = UTC_TIMESTAMP(6);

  IF p_session IS NOT NULL AND NOT EXISTS (SELECT 1 FROM ${n.sessions} s WHERE s.id = p_session AND s.expires_at > v_now) THEN
    ${ABORT_CALL}
    ${SESSION_LOST_ROW}
    LEAVE proc;
  END IF;

  -- Fast path: busy, nothing to purge, nothing to refresh (one statement, no lock, no write). At
  -- most one row matches; the aggregates make it exactly one (v_busy = 0: take the slow path).
  SELECT COUNT(*), MAX(k.version), MAX(k.delay_until), MAX(w.seq)
    INTO v_busy, v_version, v_delay, v_my_seq
    FROM ${n.keys} k LEFT JOIN ${n.waiters} w ON w.\`key\` = k.\`key\` AND w.owner = p_owner
    WHERE k.\`key\` = p_key
      AND (EXISTS (SELECT 1 FROM ${n.holders} h WHERE h.\`key\` = p_key AND h.expires_at > v_now
                   AND (p_mode = 'exclusive' OR h.mode = 'exclusive'))
           OR (p_limit IS NOT NULL
               AND (SELECT COUNT(*) FROM ${n.holders} h WHERE h.\`key\` = p_key AND h.expires_at > v_now) >= p_limit
               AND NOT EXISTS (SELECT 1 FROM ${n.holders} h WHERE h.\`key\` = p_key AND h.expires_at > v_now
                               AND NOT (h.permit_limit <=> p_limit))))
      AND NOT EXISTS (SELECT 1 FROM ${n.holders} h WHERE h.\`key\` = p_key AND h.owner = p_owner)
      AND (NOT p_queue OR w.expires_at > v_now + INTERVAL (p_queue_ttl_ms * 2 DIV 3) * 1000 MICROSECOND);

  IF v_busy > 0 THEN
    -- What the busy answer tells (read after the check: a label or an expiry a moment newer is as good).
    SET v_holder = (SELECT h.holder FROM ${n.holders} h WHERE h.\`key\` = p_key AND h.expires_at > v_now ORDER BY h.token LIMIT 1);
    SET v_first_expiry = (SELECT MIN(h.expires_at) FROM ${n.holders} h WHERE h.\`key\` = p_key AND h.expires_at > v_now);
  ELSE
    IF p_session IS NOT NULL THEN
      SELECT MAX(s.expires_at) INTO v_session_expiry FROM ${n.sessions} s WHERE s.id = p_session LOCK IN SHARE MODE;
      IF v_session_expiry IS NULL OR v_session_expiry <= UTC_TIMESTAMP(6) THEN
        ${ABORT_CALL}
        ${SESSION_LOST_ROW}
        LEAVE proc;
      END IF;
    END IF;
    -- Lock the key's row, creating it on first use (a duplicate takes the row's exclusive lock too,
    -- so first users queue on it instead of deadlocking).
    SELECT COUNT(*), MAX(k.delay_until), MAX(k.version) INTO v_busy, v_delay, v_version
      FROM ${n.keys} k WHERE k.\`key\` = p_key FOR UPDATE;
    IF v_busy = 0 THEN
      INSERT INTO ${n.keys} (\`key\`) VALUES (p_key) ON DUPLICATE KEY UPDATE version = version;
      SELECT k.delay_until, k.version INTO v_delay, v_version FROM ${n.keys} k WHERE k.\`key\` = p_key FOR UPDATE;
    END IF;
    SET v_now = UTC_TIMESTAMP(6);
    IF v_session_expiry <= v_now THEN
      -- the session ran out while this call waited for the key (the first use's key row is rolled back too)
      ${ABORT_CALL}
      ${SESSION_LOST_ROW}
      LEAVE proc;
    END IF;
    ${purge(n, '')}
    SET v_changed = v_removed > 0;

    -- The holders left are live: is the caller one of them (a retried request whose answer was
    -- lost gets its own grant back, its expiry counted from this request (I5), bound to the session
    -- it asks with now), does anyone conflict, how many hold, when does the first expire.
    SELECT MAX(CASE WHEN h.owner = p_owner THEN h.token END),
           COALESCE(MAX(p_mode = 'exclusive' OR h.mode = 'exclusive'), FALSE),
           COUNT(*),
           COALESCE(MAX(p_mode = 'shared' AND h.mode = 'shared' AND NOT (h.permit_limit <=> p_limit)), FALSE),
           MAX(h.permit_limit), MIN(h.expires_at)
      INTO v_token, v_conflict, v_count, v_mismatch, v_held_limit, v_first_expiry
      FROM ${n.holders} h WHERE h.\`key\` = p_key;
    SET v_holder = (SELECT h.holder FROM ${n.holders} h WHERE h.\`key\` = p_key ORDER BY h.token LIMIT 1);

    IF v_token IS NOT NULL THEN
      UPDATE ${n.holders} SET expires_at = COALESCE(v_session_expiry, v_now + INTERVAL p_ttl_ms * 1000 MICROSECOND), \`session\` = p_session
        WHERE \`key\` = p_key AND owner = p_owner;
      IF v_changed THEN
        UPDATE ${n.keys} SET delay_until = v_delay, version = version + 1 WHERE \`key\` = p_key;
      END IF;
      ${END_CALL}
      SELECT TRUE AS granted, CAST(v_token AS CHAR) AS token, NULL AS holder, NULL AS retry_in_ms, NULL AS version, FALSE AS session_lost, NULL AS seq;
      LEAVE proc;
    END IF;

    -- The key records its limit while held: another one is refused, and the call rolled back.
    IF v_mismatch THEN
      SET v_message = CONCAT('leasehold: the key holds permits of another limit, held=', COALESCE(v_held_limit, 'none'));
      SIGNAL SQLSTATE ${literal(LIMIT_CONFLICT_STATE)} SET MESSAGE_TEXT = v_message;
    END IF;
    SET v_conflict = v_conflict OR (p_limit IS NOT NULL AND v_count >= p_limit);

    -- A queued request goes when everyone ahead of it could go with it (shared behind shared), a
    -- permit only when fewer waiters are ahead of it than free places; a request that will not wait
    -- (tryAcquire) never barges past waiters.
    SET v_my_seq = (SELECT w.seq FROM ${n.waiters} w WHERE w.\`key\` = p_key AND w.owner = p_owner);
    SET v_blocked = EXISTS (
        SELECT 1 FROM ${n.waiters} w
        WHERE w.\`key\` = p_key AND w.owner <> p_owner AND (v_my_seq IS NULL OR w.seq < v_my_seq)
          AND (NOT p_queue OR p_mode = 'exclusive' OR w.mode = 'exclusive'))
      OR (p_limit IS NOT NULL AND (
        SELECT COUNT(*) FROM ${n.waiters} w
        WHERE w.\`key\` = p_key AND w.owner <> p_owner AND (v_my_seq IS NULL OR w.seq < v_my_seq)) >= p_limit - v_count);

    IF NOT v_conflict AND NOT v_blocked AND (v_delay IS NULL OR v_delay <= v_now) THEN
      IF v_my_seq IS NOT NULL THEN
        DELETE FROM ${n.waiters} WHERE \`key\` = p_key AND owner = p_owner;
        SET v_changed = TRUE;
      END IF;
      -- After an exclusive grant nobody else can go: waiters hear only of shared grants (the next
      -- shared waiter may join). Watchers compare last_token, which every grant raises.
      SET v_changed = v_changed AND p_mode = 'shared';
      UPDATE ${n.keys}
        SET last_token = last_token + 1, delay_until = v_delay, version = version + IF(v_changed, 1, 0)
        WHERE \`key\` = p_key;
      SET v_token = (SELECT k.last_token FROM ${n.keys} k WHERE k.\`key\` = p_key);
      INSERT INTO ${n.holders} (\`key\`, owner, mode, token, holder, acquired_at, expires_at, lock_delay_ms, permit_limit, \`session\`)
        VALUES (p_key, p_owner, p_mode, v_token, p_holder, v_now, COALESCE(v_session_expiry, v_now + INTERVAL p_ttl_ms * 1000 MICROSECOND),
                p_lock_delay_ms, IF(p_mode = 'shared', p_limit, NULL), p_session);
      ${END_CALL}
      SELECT TRUE AS granted, CAST(v_token AS CHAR) AS token, NULL AS holder, NULL AS retry_in_ms, NULL AS version, FALSE AS session_lost, NULL AS seq;
      LEAVE proc;
    END IF;

    IF p_queue THEN
      INSERT INTO ${n.waiters} (\`key\`, owner, mode, expires_at)
        VALUES (p_key, p_owner, p_mode, v_now + INTERVAL p_queue_ttl_ms * 1000 MICROSECOND)
        ON DUPLICATE KEY UPDATE expires_at = VALUES(expires_at);
      SET v_my_seq = (SELECT w.seq FROM ${n.waiters} w WHERE w.\`key\` = p_key AND w.owner = p_owner);
    END IF;
    IF v_changed THEN
      UPDATE ${n.keys} SET delay_until = v_delay, version = version + 1 WHERE \`key\` = p_key;
      SET v_version = v_version + 1;
    END IF;
  END IF;
  ${END_CALL}

  -- Busy: when the key could become free by itself (the first holder's expiry, or the end of the lock-delay).
  SET v_live_delay = IF(v_delay > v_now, v_delay, NULL);
  SET v_soonest = CASE WHEN v_first_expiry IS NULL THEN v_live_delay
                       WHEN v_live_delay IS NULL THEN v_first_expiry
                       ELSE GREATEST(v_first_expiry, v_live_delay) END;
  SELECT FALSE AS granted, NULL AS token, v_holder AS holder,
    IF(v_soonest IS NULL, NULL, CAST(GREATEST(0, CEIL(TIMESTAMPDIFF(MICROSECOND, v_now, v_soonest) / 1000)) AS CHAR)) AS retry_in_ms,
    CAST(v_version AS CHAR) AS version, FALSE AS session_lost, IF(p_queue, CAST(v_my_seq AS CHAR), NULL) AS seq;
END`,
  ];
}

/**
 * Statements that add a column (with what comes with it) to the holders' table unless it is there:
 * the ALTER is chosen by a look at information_schema and run as a prepared statement, so the DDL
 * stays plain SQL (for mysqlSchemaSql) and idempotent on MySQL 8, which has no ADD COLUMN IF NOT EXISTS.
 */
function addColumnOnce(n: SchemaNames, column: string, alteration: string): string[] {
  const alter = `ALTER TABLE ${n.holders} ${alteration}`;
  return [
    `SET @leasehold_ddl = IF(EXISTS (SELECT 1 FROM information_schema.COLUMNS
  WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ${literal(n.table)} AND COLUMN_NAME = ${literal(column)}), 'DO 0', ${literal(alter)})`,
    'PREPARE leasehold_ddl FROM @leasehold_ddl',
    'EXECUTE leasehold_ddl',
    'DEALLOCATE PREPARE leasehold_ddl',
    'SET @leasehold_ddl = NULL',
  ];
}

/** A string literal for DDL (the schema version is baked into the acquire procedure's comment). */
function literal(value: string): string {
  return `'${value.replace(/\\/g, '\\\\').replace(/'/g, "''")}'`;
}

export interface MysqlSchemaSqlOptions extends MysqlSchemaOptions {
  /**
   * For the `mysql` command-line client, which splits a script at `;` (and so cuts the procedures'
   * bodies apart): the script then starts with `DELIMITER <delimiter>`, ends each statement with it
   * and puts `DELIMITER ;` back at the end. Leave it out for a driver (mysql2 with
   * `multipleStatements: true`, a migration tool): the server itself reads `;`-separated statements.
   */
  delimiter?: string;
}

/**
 * The DDL of the lease store for `{ table }`, for users who manage schemas themselves: run it once
 * in the application's database (it is idempotent) as a user that may create tables and routines
 * (CREATE, ALTER, ALTER ROUTINE, CREATE ROUTINE), then give the backend `createSchema: false`. The
 * backend's own user then needs only SELECT, INSERT, UPDATE and DELETE on the four tables
 * (`<table>`, `<table>_keys`, `<table>_waiters`, `<table>_sessions`) and EXECUTE on the five
 * procedures (`<table>_acquire`, `_release`, `_cancel`, `_keepalive`, `_session_end`). Run again on
 * a store of an earlier version (leasehold-locks-mysql/1 or /2), the same SQL upgrades it in place:
 * it adds what is missing (from /1: the sessions table and the holders' session column and index)
 * and replaces the procedures.
 */
export function mysqlSchemaSql(options?: MysqlSchemaSqlOptions): string {
  const o = checkObject(options, 'options');
  checkKnownOptions(o, ['table', 'delimiter'], 'options');
  const statements = schemaStatements(schemaNames({ table: o.table as string | undefined }));
  if (o.delimiter === undefined) return `${statements.join(';\n\n')};\n`;
  const d = o.delimiter;
  if (typeof d !== 'string' || !/^[^\s;]{1,8}$/.test(d) || /[`'"]/.test(d)) {
    throw new InvalidArgumentError('delimiter', `expected 1–8 characters without spaces, quotes or ';' (e.g. '//'), got ${describe(d)}`);
  }
  return `DELIMITER ${d}\n\n${statements.join(`${d}\n\n`)}${d}\n\nDELIMITER ;\n`;
}

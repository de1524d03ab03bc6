import type { AcquireRequest, AcquireResult, Backend, KeyState, ReleaseRequest, RenewRequest, RenewResult } from '../core/backend.js';
import { BackendUnavailableError, ClosedError, InvalidArgumentError, LeaseholdError, limitConflict } from '../core/errors.js';
import { checkBoolean, checkInteger, checkKnownOptions, checkObject, describe, type LockMode } from '../core/validate.js';
import { createOwnPool, dropConnection, type OwnPool } from './pool.js';
import {
  ddlLockName,
  HOLDER_CHARS,
  queueHeads,
  KEY_BYTES,
  LIMIT_CONFLICT_STATE,
  OWNER_BYTES,
  SCHEMA_VERSION,
  schemaNames,
  schemaStatements,
  type MysqlSchemaOptions,
} from './schema.js';
import { mysqlSessions, sessionBytes } from './sessions.js';
import { checkPool, mapMysqlError, mysqlCode, RETRYABLE, SERVER_STATUS_IN_TRANS, type MysqlConnection, type MysqlPool } from './util.js';
import { KeyPoller, type PolledKey } from './wake.js';

export interface MysqlBackendOptions extends MysqlSchemaOptions {
  /**
   * A mysql2 connection URL, `mysql://user:password@host:3306/database` (its query parameters are
   * mysql2's options); the backend then creates (and on close ends) its own pool. Give this or `pool`.
   */
  uri?: string;
  /** A `mysql2/promise` Pool you already have; never ended by `close()`. Its connections must be in autocommit mode between uses. */
  pool?: MysqlPool;
  /** Size of the pool created from `uri`. @default 10 */
  poolSize?: number;
  /**
   * Create the tables and procedures on first use (idempotent, safe when many processes start at
   * once). `false` when you manage schemas yourself: run `mysqlSchemaSql()` as a migration. @default true
   */
  createSchema?: boolean;
  /**
   * While someone waits for a key, this backend instance reads the change counters of the keys its
   * waiters wait for every `pollMs` (one statement per round, however many waiters). A hand-off
   * then takes about pollMs/2 plus a round trip. @default 10
   */
  pollMs?: number;
  /**
   * Offer sessions: one keep-alive per client and ttl keeps all of its leases (a row in
   * `<table>_sessions` that their holders refer to, expiring by the server's clock), instead of
   * one renewal per lease. `false`: each lease is renewed on its own. @default true
   */
  sessions?: boolean;
}

/** A statement that gets no answer this long is abandoned and its connection destroyed (server hung, network black hole). */
const QUERY_TIMEOUT_MS = 10_000;
/** The schema's DDL (behind GET_LOCK, which another process may hold while it creates the same tables) gets this long. */
const DDL_TIMEOUT_MS = 60_000;
/** How long GET_LOCK waits for another process creating the same lease tables. */
const DDL_LOCK_WAIT_S = 30;
/**
 * close() waits this long for the server's goodbye (our own pool's QUIT), then drops the sockets: a
 * server that accepts connections and never answers must not keep close(), or the process, waiting.
 */
const CLOSE_TIMEOUT_MS = 2_000;
const DEFAULT_POOL_SIZE = 10;
/**
 * 10 ms: a poll round is one indexed read of a few rows, so a waiting backend instance costs the
 * server about 100 light statements a second, and a hand-off between processes about 5 ms on
 * average on top of its round trips. Measured here (MariaDB 10.11 on the same 2-core machine, from
 * the holder's release call to the waiter's grant): p50 9–14 ms, worst of 25 about 17–33 ms with
 * 10 ms; p50 about 10 ms with 5 ms, 21 ms with 20 ms, 30 ms with 50 ms (test/mysql/watch.test.ts
 * prints it). Below 10 ms the rounds cost more than they save next to the ~2–3 ms round trips.
 */
const DEFAULT_POLL_MS = 10;
/** Observers (`watch`: an election's observe, the dashboard) are told of changes within this long. */
const WATCH_POLL_MS = 100;
/** A poll round that failed is tried again after this long. */
const POLL_RETRY_MS = 1_000;
/** Keys per poll statement (its IN list); more keys take more statements per round. */
const POLL_BATCH = 500;
/**
 * A call that ended in a deadlock or a lock-wait timeout was rolled back whole and is tried again
 * this many times in all, after a full-jitter pause growing from RETRY_BASE_MS; then the backend is
 * reported unavailable.
 */
const ATTEMPTS = 4;
const RETRY_BASE_MS = 10;

/** Server errors saying the lease store is not there (dropped, or never created with createSchema: false). */
const MISSING = new Set(['ER_SP_DOES_NOT_EXIST', 'ER_NO_SUCH_TABLE']);
/** SET TRANSACTION refused: the pool's connection came with a transaction open (START TRANSACTION would commit it). */
const TRANSACTION_OPEN = 'ER_CANT_CHANGE_TX_CHARACTERISTICS';

/**
 * Per-statement driver settings, whatever the pool's own: rows as objects, big numbers and
 * decimals as strings (tokens are BIGINT UNSIGNED), no custom type casts.
 */
const QUERY_OPTIONS = Object.freeze({
  rowsAsArray: false,
  nestTables: false,
  typeCast: true,
  supportBigNumbers: true,
  bigNumberStrings: true,
  decimalNumbers: false,
  dateStrings: true,
  namedPlaceholders: false,
});

/** A pool connection that takes mysql2's per-statement options (every mysql2 connection does). */
interface QueryConnection {
  query(options: { sql: string } & typeof QUERY_OPTIONS, values?: unknown): Promise<[unknown, unknown]>;
}

type Row = Record<string, unknown>;

/**
 * Leases in MySQL or MariaDB (InnoDB). One round trip per acquire, renew, release and cancelWait (a
 * stored procedure `CALL`, or for renew one UPDATE); expiry is judged by the server's clock
 * (`UTC_TIMESTAMP(6)`, I7); each key's token counter lives in the key's row and is raised in the
 * same transaction that inserts the holder, so tokens are as durable as a committed InnoDB row
 * (I1). Waiters are served in arrival order (a queue table). No GET_LOCK for leases: it is bound to
 * one connection, breaks behind a proxy, and has neither ttl nor token.
 *
 * Wake-ups: the server cannot push, so a waiting backend instance polls the change counters of the
 * keys its waiters wait for, one statement every `pollMs` (default 10 ms) for all of them, and only
 * while someone waits; a release made through the same instance wakes its own waiters at once.
 * Only the waiters the queue lets go are woken (the head, or the run of shared waiters at the
 * head): the others do not ask again on every release (see wake.ts).
 * A hand-off between processes therefore costs about pollMs/2 plus a round trip on average, pollMs
 * plus a round trip at worst: with the default 10 ms, a p50 of 9–14 ms from the holder's release
 * call to the waiter's grant, both round trips included (MariaDB 10.11 here; see DEFAULT_POLL_MS).
 *
 * Sessions (`sessions`, on by default): one keep-alive per client and ttl renews all of its leases,
 * in one `CALL`; closing a session frees its leases at once and wakes their waiters (the keys'
 * change counters move, which pollers see; this instance's own waiters hear at once).
 *
 * Deadlocks and lock-wait timeouts roll a call back whole; it is retried inside the operation (four
 * attempts, jittered pauses), then reported as BackendUnavailableError, never as a raw driver error.
 * A release that fails is reported so; core asks again for a session-bound lease (its session's
 * keep-alives would otherwise keep the holder alive), as for every backend.
 *
 * Grants the backend's user needs: SELECT, INSERT, UPDATE, DELETE on `<table>`, `<table>_keys`,
 * `<table>_waiters` and `<table>_sessions`, and EXECUTE on the procedures `<table>_acquire`,
 * `<table>_release`, `<table>_cancel`, `<table>_keepalive` and `<table>_session_end`; with
 * `createSchema` (the default) also CREATE, ALTER, ALTER ROUTINE and CREATE ROUTINE on the database,
 * the first time and when upgrading a store of an earlier version (or apply `mysqlSchemaSql()` as a
 * migration and give `createSchema: false`). The procedures run at READ COMMITTED, which needs
 * `binlog_format` ROW or MIXED if binary logging is on (the servers' defaults).
 */
export function mysqlBackend(options: MysqlBackendOptions): Backend {
  const o = checkObject(options, 'options');
  checkKnownOptions(o, ['uri', 'pool', 'poolSize', 'table', 'createSchema', 'pollMs', 'sessions'], 'options');
  if ((o.uri === undefined) === (o.pool === undefined)) throw new InvalidArgumentError('options', 'give exactly one of uri or pool');
  if (o.uri !== undefined) checkUri(o.uri);
  if (o.pool !== undefined) checkPool(o.pool, 'pool');
  if (o.poolSize !== undefined && o.pool !== undefined) throw new InvalidArgumentError('poolSize', 'only applies to the pool made from uri');
  const poolSize = o.poolSize === undefined ? DEFAULT_POOL_SIZE : checkInteger(o.poolSize, 'poolSize', 1, 1_000);
  const createSchema = o.createSchema === undefined ? true : checkBoolean(o.createSchema, 'createSchema');
  const pollMs = o.pollMs === undefined ? DEFAULT_POLL_MS : checkInteger(o.pollMs, 'pollMs', 1, 60_000);
  const withSessions = o.sessions === undefined ? true : checkBoolean(o.sessions, 'sessions');
  const n = schemaNames({ table: o.table as string | undefined });

  let own: OwnPool | undefined;
  try {
    own = o.uri === undefined ? undefined : createOwnPool(o.uri as string, poolSize);
  } catch (cause) {
    throw new InvalidArgumentError('uri', `mysql2 refused it: ${(cause as Error)?.message ?? String(cause)}`, { cause });
  }
  const pool: MysqlPool = own?.pool ?? (o.pool as MysqlPool);

  /** The connection's database, and the version in the acquire procedure's comment (NULL: no such procedure). */
  const SCHEMA_CHECK = `SELECT DATABASE() AS db, (SELECT r.ROUTINE_COMMENT FROM information_schema.ROUTINES r
      WHERE r.ROUTINE_SCHEMA = DATABASE() AND r.ROUTINE_NAME = ? AND r.ROUTINE_TYPE = 'PROCEDURE') AS version`;
  const ACQUIRE = `CALL ${n.acquireProc}(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`;
  /**
   * Renewal: one UPDATE, only while the holder has not expired by the server's clock (I4, I7), of a
   * holder renewed on its own. A holder bound to a session matches nothing here; its renewal is
   * that session's keep-alive (the session and every holder bound to it live ttl from now, as in
   * the other backends): a second round trip, only then (see sessions.ts).
   */
  const RENEW = `UPDATE ${n.holders} SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? * 1000 MICROSECOND
    WHERE \`key\` = ? AND owner = ? AND token = CAST(? AS UNSIGNED) AND \`session\` IS NULL AND expires_at > UTC_TIMESTAMP(6)`;
  /** Tokens travel as decimal strings and are cast exactly (a string compared with a number would be compared as a double). */
  const RELEASE = `CALL ${n.releaseProc}(?, ?, CAST(? AS UNSIGNED))`;
  const CANCEL = `CALL ${n.cancelProc}(?, ?)`;
  /**
   * A poll round: each key's change counter, last token and live holders by the server's clock, and
   * the first live queue place and first exclusive one, from which the last place that could be
   * granted now is worked out (see wake.ts and uptoOf). Read-only, one statement.
   */
  const POLL = `SELECT k.\`key\` AS \`key\`, CAST(k.version AS CHAR) AS version, CAST(k.last_token AS CHAR) AS last_token,
      (SELECT COUNT(*) FROM ${n.holders} h WHERE h.\`key\` = k.\`key\` AND h.expires_at > UTC_TIMESTAMP(6)) AS live,
      ${queueHeads(n, 'k.`key`')}
    FROM ${n.keys} k WHERE k.\`key\` IN (?)`;
  /**
   * Read-only, one statement (one snapshot, one instant: UTC_TIMESTAMP is fixed per statement): the
   * keys in the byte range [$1, $2) that have holders, waiters or a lock-delay, with their live
   * holders in token order (one row per holder; a key without holders has one row of NULLs).
   * Expired rows are left for the next write to purge, and judged expired here by the server's clock.
   */
  const INSPECT = `SELECT l.\`key\` AS \`key\`, CAST(k.last_token AS CHAR) AS last_token,
      (SELECT COUNT(*) FROM ${n.waiters} w WHERE w.\`key\` = l.\`key\` AND w.expires_at > UTC_TIMESTAMP(6)) AS waiters,
      CAST(GREATEST(0, CEIL(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), GREATEST(
        COALESCE(k.delay_until, UTC_TIMESTAMP(6)),
        COALESCE((SELECT MAX(x.expires_at + INTERVAL x.lock_delay_ms * 1000 MICROSECOND) FROM ${n.holders} x
                  WHERE x.\`key\` = l.\`key\` AND x.expires_at <= UTC_TIMESTAMP(6) AND x.lock_delay_ms > 0), UTC_TIMESTAMP(6))
      )) / 1000)) AS CHAR) AS delay_ms,
      h.mode AS mode, CAST(h.token AS CHAR) AS token, h.holder AS holder,
      CAST(CEIL(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), h.expires_at) / 1000) AS CHAR) AS expires_in_ms, h.permit_limit AS permit_limit
    FROM (
      SELECT \`key\` FROM ${n.holders} WHERE \`key\` >= ? AND \`key\` < ?
      UNION SELECT \`key\` FROM ${n.waiters} WHERE \`key\` >= ? AND \`key\` < ?
      UNION SELECT \`key\` FROM ${n.keys} WHERE \`key\` >= ? AND \`key\` < ? AND delay_until > UTC_TIMESTAMP(6)
    ) l
    JOIN ${n.keys} k ON k.\`key\` = l.\`key\`
    LEFT JOIN ${n.holders} h ON h.\`key\` = l.\`key\` AND h.expires_at > UTC_TIMESTAMP(6)
    ORDER BY l.\`key\`, h.token`;

  /** Runs `fn` on one pooled connection, bounded by `ms`: a connection that broke or hung is dropped (its socket freed at once), not given back. */
  const onConnection = async <T>(ms: number, fn: (c: MysqlConnection & QueryConnection) => Promise<T>): Promise<T> => {
    const c = (await pool.getConnection()) as MysqlConnection & QueryConnection;
    let broken = false;
    try {
      return await bounded(fn(c), ms, () => {
        broken = true;
      });
    } catch (error) {
      if ((error as { fatal?: unknown } | null)?.fatal === true) broken = true;
      throw error;
    } finally {
      // dropConnection, not destroy(): mysql2's destroy() half-closes the socket and waits for the
      // server's FIN, which a frozen server never sends (the socket would stay open until it runs again).
      if (broken) dropConnection(c);
      else c.release();
    }
  };
  const send = (c: QueryConnection, sql: string, values: unknown[]): Promise<[unknown, unknown]> => c.query({ sql, ...QUERY_OPTIONS }, values);

  let closed = false;
  let ready: Promise<void> | undefined;
  const init = (): Promise<void> =>
    (ready ??= (async () => {
      const [rows] = await onConnection(QUERY_TIMEOUT_MS, (c) => send(c, SCHEMA_CHECK, [n.acquireRoutine]));
      const { db, version } = (rows as Row[])[0] ?? {};
      if (typeof db !== 'string') {
        throw new InvalidArgumentError(
          o.uri === undefined ? 'pool' : 'uri',
          'the connection has no current database: name one in the URL (mysql://user@host:3306/app) or in the pool options (database)',
        );
      }
      if (version === SCHEMA_VERSION) return;
      if (!createSchema) throw missingSchema(typeof version === 'string' ? version : undefined);
      await createOnce(db);
    })().catch((error: unknown) => {
      ready = undefined;
      throw mapError('create the lease tables', error);
    }));

  const missingSchema = (found: string | undefined): BackendUnavailableError =>
    new BackendUnavailableError(
      'mysql',
      `the lease store ${n.holders} is ${found ? `at version ${found}, expected ${SCHEMA_VERSION}` : 'missing'}; ` +
        'apply mysqlSchemaSql({ table }) as a migration, or let the backend create it (createSchema: true)',
    );

  /**
   * The DDL under GET_LOCK on one connection, so concurrent first starts do not race: whoever gets
   * the lock second finds the version in place and runs nothing (re-creating the procedures would
   * fail the other processes' calls for a moment).
   */
  const createOnce = (db: string): Promise<void> =>
    onConnection(DDL_TIMEOUT_MS, async (c) => {
      const name = ddlLockName(db, n.table);
      const [got] = await send(c, 'SELECT GET_LOCK(?, ?) AS got', [name, DDL_LOCK_WAIT_S]);
      if (Number((got as Row[])[0]?.got) !== 1) {
        throw new BackendUnavailableError('mysql', `another process kept the lock ${name} (creating the lease tables) for ${DDL_LOCK_WAIT_S} s`);
      }
      try {
        const [rows] = await send(c, SCHEMA_CHECK, [n.acquireRoutine]);
        if ((rows as Row[])[0]?.version === SCHEMA_VERSION) return;
        for (const sql of schemaStatements(n)) await send(c, sql, []);
      } finally {
        await send(c, 'DO RELEASE_LOCK(?)', [name]).catch(() => {}); // the connection's end releases it too
      }
    });

  /**
   * One statement on a pooled connection, after the schema check: a deadlock or lock-wait timeout
   * (rolled back whole) is tried again; other failures become leasehold errors.
   */
  const run = async (what: string, sql: string, values: unknown[]): Promise<unknown> => {
    await init();
    for (let attempt = 1; ; attempt++) {
      try {
        return await onConnection(QUERY_TIMEOUT_MS, async (c) => {
          const [result] = await send(c, sql, values);
          // A connection in manual-commit mode (autocommit=0) keeps a plain statement's transaction open: end it.
          const status = (result as { serverStatus?: unknown } | null)?.serverStatus;
          if (typeof status === 'number' && (status & SERVER_STATUS_IN_TRANS) !== 0) await send(c, 'COMMIT', []);
          return result;
        });
      } catch (error) {
        const code = mysqlCode(error);
        if (code !== undefined && RETRYABLE.has(code) && attempt < ATTEMPTS) {
          await new Promise((r) => setTimeout(r, Math.random() * RETRY_BASE_MS * 2 ** attempt));
          continue;
        }
        if (code !== undefined && MISSING.has(code)) ready = undefined; // dropped behind our back: check (and create) again next time
        throw mapError(attempt > 1 ? `${what} (after ${attempt} attempts)` : what, error);
      }
    }
  };
  /** The one result set of a procedure's CALL (mysql2 answers `[rows, okPacket]`). */
  const callRow = async (what: string, sql: string, values: unknown[]): Promise<Row> => {
    const result = await run(what, sql, values);
    const row = Array.isArray(result) && Array.isArray(result[0]) ? (result[0][0] as Row | undefined) : undefined;
    if (!row) throw new BackendUnavailableError('mysql', `${what}: the procedure returned no row`);
    return row;
  };

  const poller = new KeyPoller({
    pollMs,
    watchPollMs: Math.max(pollMs, WATCH_POLL_MS),
    retryMs: POLL_RETRY_MS,
    read: async (keys) => {
      const states = new Map<string, PolledKey>();
      for (let i = 0; i < keys.length; i += POLL_BATCH) {
        const batch = keys.slice(i, i + POLL_BATCH).map((k) => Buffer.from(k, 'utf8'));
        const rows = (await run('poll', POLL, [batch])) as Row[];
        for (const r of rows) {
          states.set(keyOf(r.key), {
            version: BigInt(String(r.version)),
            lastToken: String(r.last_token),
            live: Number(r.live),
            upto: uptoOf(r.head, r.exclusive_head),
          });
        }
      }
      return states;
    },
  });

  /** A release answered: this instance's waiters and watchers of the key hear of it at once. */
  const released = (key: string, r: Row): void => {
    if (r.version !== null && r.version !== undefined) poller.changed(key, BigInt(String(r.version)), true, uptoOf(r.head, r.exclusive_head));
  };
  const sessions = mysqlSessions(n, {
    run,
    changed: (key, version, head, exclusiveHead) => poller.changed(keyOf(key), version, true, uptoOf(head, exclusiveHead)),
  });

  const backend: Backend = {
    name: 'mysql',
    capabilities: Object.freeze({ fair: true, minTtlMs: 0, keepablePlaces: 'all' }),

    async acquire(req: AcquireRequest): Promise<AcquireResult> {
      const key = keyBytes(req.key);
      const owner = ownerBytes(req.owner);
      if ([...req.holder].length > HOLDER_CHARS) throw new InvalidArgumentError('holder', `at most ${HOLDER_CHARS} characters, got ${[...req.holder].length}`);
      const limit = req.mode === 'shared' ? (req.limit ?? null) : null;
      let session: Buffer | null = null;
      if (req.session !== undefined) {
        const bytes = sessionBytes(req.session);
        if (!bytes) return { granted: false, sessionLost: true }; // longer than any session id stored: no such session
        session = bytes;
      }
      let r: Row;
      try {
        r = await callRow('acquire', ACQUIRE, [key, owner, req.mode, req.ttlMs, req.lockDelayMs, req.holder, req.queue, req.queueTtlMs, limit, session]);
      } catch (error) {
        const conflict = limitConflictOf(error);
        if (!conflict) throw error;
        throw limitConflict(req.key, conflict.held, req.limit, { cause: conflict.cause });
      }
      if (Number(r.granted) === 1) {
        poller.changed(req.key, undefined, true);
        return { granted: true, token: BigInt(String(r.token)), ttlMs: req.ttlMs };
      }
      if (Number(r.session_lost) === 1) return { granted: false, sessionLost: true };
      const version = BigInt(String(r.version));
      poller.changed(req.key, version, false); // a purge it made may let this instance's other waiters go
      const seq = r.seq === null || r.seq === undefined ? undefined : BigInt(String(r.seq));
      const busy: { granted: false; holder?: string; retryInMs?: number; cursor: Cursor } = {
        granted: false,
        cursor: { version, seq, exclusive: req.mode === 'exclusive' },
      };
      if (typeof r.holder === 'string') busy.holder = r.holder;
      if (r.retry_in_ms !== null && r.retry_in_ms !== undefined) busy.retryInMs = Number(r.retry_in_ms);
      return busy;
    },

    async renew(req: RenewRequest): Promise<RenewResult> {
      const key = keyBytes(req.key);
      const owner = ownerBytes(req.owner);
      const token = req.token.toString();
      const result = await run('renew', RENEW, [req.ttlMs, key, owner, token]);
      if ((result as { affectedRows?: unknown }).affectedRows === 1 || (await sessions.renewBound(key, owner, token, req.ttlMs))) {
        return { renewed: true, ttlMs: req.ttlMs };
      }
      return { renewed: false };
    },

    async release(req: ReleaseRequest): Promise<void> {
      released(req.key, await callRow('release', RELEASE, [keyBytes(req.key), ownerBytes(req.owner), req.token.toString()]));
    },

    async cancelWait({ key, owner }) {
      const r = await callRow('cancel wait', CANCEL, [keyBytes(key), ownerBytes(owner)]);
      if (r.version !== null && r.version !== undefined) poller.changed(key, BigInt(String(r.version)), false, uptoOf(r.head, r.exclusive_head));
    },

    async inspect(prefix: string): Promise<KeyState[]> {
      const [from, to] = byteRange(prefix);
      const rows = (await run('inspect', INSPECT, [from, to, from, to, from, to])) as Row[];
      const states: KeyState[] = [];
      let current: { key: string; lastToken: bigint; holders: KeyState['holders'][number][]; waiters: number; delay: number; limit?: number } | undefined;
      const flush = (): void => {
        if (!current) return;
        if (current.holders.length > 0 || current.waiters > 0 || current.delay > 0) {
          states.push({
            key: current.key,
            lastToken: current.lastToken,
            holders: current.holders,
            waiters: current.waiters,
            lockDelayRemainingMs: current.delay,
            ...(current.limit !== undefined && { limit: current.limit }),
          });
        }
        current = undefined;
      };
      for (const r of rows) {
        const key = keyOf(r.key);
        if (current?.key !== key) {
          flush();
          current = { key, lastToken: BigInt(String(r.last_token)), holders: [], waiters: Number(r.waiters), delay: Number(r.delay_ms) };
        }
        if (r.token === null || r.token === undefined) continue;
        current.holders.push({
          mode: r.mode as LockMode,
          token: BigInt(String(r.token)),
          holder: String(r.holder),
          expiresInMs: Math.max(0, Number(r.expires_in_ms)),
        });
        if (r.mode === 'shared' && r.permit_limit !== null && r.permit_limit !== undefined) current.limit = Number(r.permit_limit);
      }
      flush();
      return states;
    },

    /** Wakes the waiter when the key's change counter passes the busy answer's and the queue's head has reached its place (see wake.ts). */
    async subscribe(key: string, onChange: () => void, cursor?: unknown): Promise<() => void> {
      if (closed) throw new ClosedError('mysql backend');
      await init();
      try {
        const c = isCursor(cursor) ? cursor : undefined;
        return await poller.subscribe(key, onChange, c?.version, c?.seq, c?.exclusive);
      } catch (error) {
        throw mapError('subscribe', error);
      }
    },

    /** Grants, releases and expiries of the key, seen by the poller every 100 ms (at once when made through this instance). */
    async watch(key: string, onChange: () => void): Promise<() => void> {
      if (closed) throw new ClosedError('mysql backend');
      await init();
      try {
        return await poller.watch(key, onChange);
      } catch (error) {
        throw mapError('watch', error);
      }
    },

    /**
     * Stops the poller; ends our own pool, waiting CLOSE_TIMEOUT_MS at most for the server's goodbye
     * before dropping its sockets. A pool passed in is left open.
     */
    async close() {
      if (closed) return;
      closed = true;
      poller.close();
      await own?.end(CLOSE_TIMEOUT_MS);
    },
  };
  if (withSessions) {
    const { open, keepAlive, close } = sessions;
    backend.sessions = { open, keepAlive, close };
  }
  return backend;
}

/** A busy answer's position: the key's change counter, and the caller's place in the key's queue (if queued). */
interface Cursor {
  readonly version: bigint;
  readonly seq: bigint | undefined;
  /** The request was exclusive: it can be granted only when the key has no live holder (see wake.ts). */
  readonly exclusive: boolean;
}

function isCursor(value: unknown): value is Cursor {
  return typeof value === 'object' && value !== null && typeof (value as Cursor).version === 'bigint';
}

/**
 * The last queue place that could be granted now, from a poll row: the head's if it is exclusive;
 * else the run of shared places at the head (up to the first exclusive one, or all of them). Null
 * when nobody is queued. A permit waiter may be in that run but beyond the free permits: it is
 * woken and asked again, which errs towards waking, never against.
 */
function uptoOf(head: unknown, exclusiveHead: unknown): bigint | null {
  if (head === null || head === undefined) return null;
  const first = BigInt(String(head));
  if (exclusiveHead === null || exclusiveHead === undefined) return null;
  const exclusive = BigInt(String(exclusiveHead));
  return exclusive === first ? first : exclusive - 1n;
}

function checkUri(value: unknown): void {
  let url: URL | undefined;
  try {
    url = typeof value === 'string' ? new URL(value) : undefined;
  } catch {
    url = undefined;
  }
  if (!url || !/^(mysql|mariadb):$/i.test(url.protocol)) {
    throw new InvalidArgumentError(
      'uri',
      `expected a mysql:// URL, e.g. mysql://user:password@127.0.0.1:3306/app, got ${describe(typeof value === 'string' ? '(a string)' : value)}`,
    );
  }
  if (url.pathname.replace(/^\//, '') === '' && !url.searchParams.has('database')) {
    throw new InvalidArgumentError('uri', 'names no database: give it as the path, e.g. mysql://user@127.0.0.1:3306/app');
  }
}

/** The key as the bytes the tables store (VARBINARY: compared bytewise, so no collation folds two keys into one). */
function keyBytes(key: string): Buffer {
  const bytes = Buffer.from(key, 'utf8');
  if (bytes.length > KEY_BYTES) throw new InvalidArgumentError('key', `is ${bytes.length} bytes long; at most ${KEY_BYTES} bytes`);
  return bytes;
}

function ownerBytes(owner: string): Buffer {
  const bytes = Buffer.from(owner, 'utf8');
  if (bytes.length > OWNER_BYTES) throw new InvalidArgumentError('owner', `is ${bytes.length} bytes long; at most ${OWNER_BYTES} bytes`);
  return bytes;
}

/** A key read back: VARBINARY columns come as Buffers. */
function keyOf(value: unknown): string {
  return Buffer.isBuffer(value) ? value.toString('utf8') : String(value);
}

/**
 * The byte range of the keys starting with `prefix`: [prefix, prefix with its last byte raised).
 * UTF-8 never contains 0xFF, so the raised byte always exists; the empty prefix spans every key.
 */
function byteRange(prefix: string): [Buffer, Buffer] {
  if (prefix === '') return [Buffer.alloc(0), Buffer.from([0xff])];
  const from = keyBytes(prefix);
  const to = Buffer.from(from);
  to[to.length - 1]! += 1;
  return [from, to];
}

/** The acquire procedure's refusal of a limit (LIMIT_CONFLICT_STATE): the key's own limit, from its message (`held=<n>|none`). */
function limitConflictOf(error: unknown): { held: number | undefined; cause: unknown } | undefined {
  const cause = error instanceof LeaseholdError ? error.cause : error;
  if ((cause as { sqlState?: unknown } | null)?.sqlState !== LIMIT_CONFLICT_STATE) return undefined;
  const held = /held=([0-9]+)$/.exec(String((cause as Error).message))?.[1];
  return { held: held === undefined ? undefined : Number(held), cause };
}

/** Rejects with BackendUnavailableError when `p` has not settled within `ms` (calling `onTimeout` first); a late outcome is dropped. */
function bounded<T>(p: Promise<T>, ms: number, onTimeout: () => void): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const timer = setTimeout(() => {
      onTimeout();
      reject(new BackendUnavailableError('mysql', `no answer within ${ms} ms; the connection was dropped`));
    }, ms);
    timer.unref?.();
    p.then(
      (value) => {
        clearTimeout(timer);
        resolve(value);
      },
      (error: unknown) => {
        clearTimeout(timer);
        reject(error);
      },
    );
  });
}

function mapError(what: string, error: unknown): LeaseholdError {
  if (error instanceof LeaseholdError) return error;
  const code = mysqlCode(error);
  if (code === TRANSACTION_OPEN) {
    return new InvalidArgumentError(
      'pool',
      `${what}: a connection of the pool has a transaction open, which leasehold's call would commit; end it before giving the connection back`,
      {
        cause: error,
      },
    );
  }
  if (code !== undefined && MISSING.has(code)) {
    return new BackendUnavailableError(
      'mysql',
      `${what} failed (${code}): the lease store is missing; apply mysqlSchemaSql({ table }) as a migration, or let the backend create it (createSchema: true)`,
      { cause: error },
    );
  }
  return mapMysqlError(what, error);
}

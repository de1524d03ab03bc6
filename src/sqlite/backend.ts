import Database from 'better-sqlite3';
import type { AcquireRequest, AcquireResult, Backend, KeyState, ReleaseRequest, RenewRequest, RenewResult } from '../core/backend.js';
import { BackendUnavailableError, InvalidArgumentError, LeaseholdError, limitConflict } from '../core/errors.js';
import { checkBoolean, checkKnownOptions, checkObject, describe, type LockMode } from '../core/validate.js';
import { SqliteSessions } from './sessions.js';
import { checkIdentifier, checkMachineClock, isSqliteError, machineClock, quoteIdent, retryBusy, type MachineClock, type SqliteDatabase } from './util.js';

export interface SqliteBackendOptions {
  /** Database file; created if missing. Give this or `database`. */
  path?: string;
  /**
   * A better-sqlite3 Database you already have (its journal mode and lifetime stay yours). Calls
   * made while it has an open transaction are refused (InvalidArgumentError): a grant inside it
   * would roll back with it.
   */
  database?: SqliteDatabase;
  /**
   * Table of current holders; the token counters, wait queue and sessions live in `<table>_tokens`,
   * `<table>_waiters` and `<table>_sessions`. @default 'leasehold_locks'
   */
  table?: string;
  /** The coordinator's clock (tests inject one). @default the machine's monotonic clock, tagged with its boot id */
  clock?: MachineClock;
  /**
   * Offer sessions: one keep-alive per client and ttl keeps all of its leases (a row in
   * `<table>_sessions` that their holders refer to), one commit per interval instead of one per
   * lease. `false`: each lease is renewed on its own. @default true
   */
  sessions?: boolean;
}

/** The answer to a request bound to a session that is gone: core ends that session and opens a new one. */
const SESSION_LOST: AcquireResult = Object.freeze({ granted: false, sessionLost: true });

/** How often a waiting process checks `PRAGMA data_version` for commits made by other processes. */
const CHANGE_POLL_MS = 5;
/** Our connection's own busy timeout: short, so a busy database never blocks the event loop for long (retries are async). */
const BUSY_TIMEOUT_MS = 100;

/**
 * Leases shared by the processes of one machine through one SQLite file (WAL). Expiry is judged
 * by the machine's monotonic clock (I7); tokens are committed with synchronous=FULL, so they
 * survive process crashes and power loss (I1). Sessions (`sessions`, on by default): one
 * keep-alive per client and ttl renews all of its leases, one commit instead of one per lease. Not
 * for network filesystems: SQLite's locking is not reliable there.
 */
export function sqliteBackend(options: SqliteBackendOptions): Backend {
  const o = checkObject(options, 'options');
  checkKnownOptions(o, ['path', 'database', 'table', 'clock', 'sessions'], 'options');
  if ((o.path === undefined) === (o.database === undefined)) throw new InvalidArgumentError('options', 'give exactly one of path or database');
  if (o.path !== undefined && (typeof o.path !== 'string' || o.path.length === 0)) {
    throw new InvalidArgumentError('path', `expected a file path, got ${describe(o.path)}`);
  }
  const database = o.database as SqliteDatabase | null | undefined;
  if (
    database !== undefined &&
    (typeof database !== 'object' || database === null || typeof database.prepare !== 'function' || typeof database.transaction !== 'function')
  ) {
    throw new InvalidArgumentError('database', `expected a better-sqlite3 Database, got ${describe(database)}`);
  }
  const table = checkIdentifier(o.table ?? 'leasehold_locks', 'table');
  const clock = o.clock === undefined ? machineClock() : checkMachineClock(o.clock);
  const ownsDb = o.path !== undefined;
  const withSessions = o.sessions === undefined ? true : checkBoolean(o.sessions, 'sessions');

  const locksT = quoteIdent(table);
  const tokensT = quoteIdent(`${table}_tokens`);
  const waitersT = quoteIdent(`${table}_waiters`);
  const sessionsT = quoteIdent(`${table}_sessions`);

  const SCHEMA = `
    CREATE TABLE IF NOT EXISTS ${tokensT} (
      key TEXT PRIMARY KEY NOT NULL,
      last_token INTEGER NOT NULL,
      delay_until INTEGER NOT NULL DEFAULT 0,
      delay_epoch TEXT NOT NULL DEFAULT ''
    ) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS ${locksT} (
      key TEXT NOT NULL,
      owner TEXT NOT NULL,
      mode TEXT NOT NULL CHECK (mode IN ('exclusive', 'shared')),
      token INTEGER NOT NULL,
      holder TEXT NOT NULL,
      expires_at INTEGER NOT NULL,
      epoch TEXT NOT NULL,
      lock_delay_ms INTEGER NOT NULL,
      permit_limit INTEGER,
      session TEXT,
      PRIMARY KEY (key, owner)
    ) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS ${waitersT} (
      key TEXT NOT NULL,
      owner TEXT NOT NULL,
      mode TEXT NOT NULL,
      seq INTEGER NOT NULL,
      expires_at INTEGER NOT NULL,
      epoch TEXT NOT NULL,
      PRIMARY KEY (key, owner)
    ) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS ${sessionsT} (
      id TEXT PRIMARY KEY NOT NULL,
      expires_at INTEGER NOT NULL,
      epoch TEXT NOT NULL
    ) WITHOUT ROWID;`;
  /**
   * A semaphore permit's limit, next to its holder (NULL: a plain lock). Tables made before permits
   * get the column on first use; rows written by an older leasehold read as plain locks.
   */
  const HAS_LIMIT_COLUMN = `SELECT 1 FROM pragma_table_info(?) WHERE name = 'permit_limit'`;
  const ADD_LIMIT_COLUMN = `ALTER TABLE ${locksT} ADD COLUMN permit_limit INTEGER`;
  /**
   * The session a holder is bound to (NULL: renewed on its own); its expires_at is then the
   * session's, moved by every keep-alive. Tables made before sessions get the column on first use,
   * then the index a keep-alive and a session's end find the session's holders by.
   */
  const HAS_SESSION_COLUMN = `SELECT 1 FROM pragma_table_info(?) WHERE name = 'session'`;
  const ADD_SESSION_COLUMN = `ALTER TABLE ${locksT} ADD COLUMN session TEXT`;
  const SESSION_INDEX = `CREATE INDEX IF NOT EXISTS ${quoteIdent(`${table}_by_session`)} ON ${locksT} (session) WHERE session IS NOT NULL`;
  const SELECT_HOLDERS = `SELECT owner, mode, token, holder, expires_at, epoch, lock_delay_ms, permit_limit FROM ${locksT} WHERE key = ?`;
  /** The first expiry among the key's holders, for `watch` (an expiry is no commit: nobody else would tell). */
  const NEXT_EXPIRY = `SELECT min(expires_at) AS at FROM ${locksT} WHERE key = ? AND epoch = ?`;
  const DELETE_HOLDER = `DELETE FROM ${locksT} WHERE key = ? AND owner = ?`;
  const DELETE_HOLDER_WITH_TOKEN = `DELETE FROM ${locksT} WHERE key = ? AND owner = ? AND token = ?`;
  const INSERT_HOLDER = `INSERT INTO ${locksT} (key, owner, mode, token, holder, expires_at, epoch, lock_delay_ms, permit_limit, session)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`;
  /** A renewal of a holder that is not bound to a session (a session-bound one is renewed by its session's keep-alive). */
  const RENEW_HOLDER = `UPDATE ${locksT} SET expires_at = ? WHERE key = ? AND owner = ? AND token = ? AND epoch = ? AND expires_at > ? AND session IS NULL`;
  /** The session of a live session-bound holder, whose renewal is that session's keep-alive. */
  const HOLDER_SESSION = `SELECT session FROM ${locksT} WHERE key = ? AND owner = ? AND token = ? AND epoch = ? AND expires_at > ? AND session IS NOT NULL`;
  /** A retried acquire of a live holder: its expiry counted from the retry, bound to the session it asks with now (or none). */
  const REBIND_HOLDER = `UPDATE ${locksT} SET expires_at = ?, session = ? WHERE key = ? AND owner = ? AND token = ? AND epoch = ? AND expires_at > ?`;
  const SELECT_TOKEN_ROW = `SELECT last_token, delay_until, delay_epoch FROM ${tokensT} WHERE key = ?`;
  /** The grant's token: the key's counter raised in the same transaction as the holder row (I1, I2). */
  const NEXT_TOKEN = `INSERT INTO ${tokensT} (key, last_token) VALUES (?, 1)
    ON CONFLICT (key) DO UPDATE SET last_token = last_token + 1 RETURNING last_token`;
  const SET_DELAY = `UPDATE ${tokensT} SET delay_until = ?, delay_epoch = ? WHERE key = ?`;
  const PURGE_WAITERS = `DELETE FROM ${waitersT} WHERE key = ? AND (expires_at <= ? OR epoch <> ?)`;
  const SELECT_WAITERS = `SELECT owner, mode FROM ${waitersT} WHERE key = ? ORDER BY seq`;
  /** Every queue place of the key, with its expiry: the read-only look of a waiter asking again. */
  const SELECT_PLACES = `SELECT owner, mode, expires_at, epoch FROM ${waitersT} WHERE key = ? ORDER BY seq`;
  const ENQUEUE = `INSERT INTO ${waitersT} (key, owner, mode, seq, expires_at, epoch)
    VALUES (@key, @owner, @mode, (SELECT coalesce(max(seq), 0) + 1 FROM ${waitersT} WHERE key = @key), @expiresAt, @epoch)
    ON CONFLICT (key, owner) DO UPDATE SET expires_at = excluded.expires_at`;
  const DEQUEUE = `DELETE FROM ${waitersT} WHERE key = ? AND owner = ?`;
  const LIST_KEYS = `SELECT key FROM ${locksT} WHERE substr(key, 1, @n) = @prefix
    UNION SELECT key FROM ${waitersT} WHERE substr(key, 1, @n) = @prefix
    UNION SELECT key FROM ${tokensT} WHERE substr(key, 1, @n) = @prefix AND delay_until > 0
    ORDER BY key`;
  const COUNT_WAITERS = `SELECT count(*) AS n FROM ${waitersT} WHERE key = ?`;

  let db: SqliteDatabase;
  try {
    db = ownsDb ? (new Database(o.path as string, { timeout: BUSY_TIMEOUT_MS }) as unknown as SqliteDatabase) : (o.database as SqliteDatabase);
  } catch (cause) {
    throw new BackendUnavailableError('sqlite', `cannot open ${o.path as string}: ${(cause as Error).message}`, { cause });
  }

  let ready: Promise<void> | undefined;
  /** Creates the tables on first use; safe when several processes start at once (IMMEDIATE transaction, busy retry). */
  const init = (): Promise<void> =>
    (ready ??= (async () => {
      if (ownsDb) {
        await retryBusy('enable WAL', () => db.pragma('journal_mode = WAL'));
        db.pragma('synchronous = FULL');
      }
      await retryBusy('create tables', () =>
        db
          .transaction(() => {
            db.exec(SCHEMA);
            if (db.prepare(HAS_LIMIT_COLUMN).get(table) === undefined) db.exec(ADD_LIMIT_COLUMN);
            if (db.prepare(HAS_SESSION_COLUMN).get(table) === undefined) db.exec(ADD_SESSION_COLUMN);
            db.exec(SESSION_INDEX);
          })
          .immediate(),
      );
    })().catch((error: unknown) => {
      ready = undefined;
      throw mapError('open', error);
    }));

  type Prepared = Record<
    | 'selectHolders'
    | 'deleteHolder'
    | 'deleteHolderWithToken'
    | 'insertHolder'
    | 'renewHolder'
    | 'holderSession'
    | 'rebindHolder'
    | 'selectTokenRow'
    | 'nextToken'
    | 'setDelay'
    | 'purgeWaiters'
    | 'selectWaiters'
    | 'selectPlaces'
    | 'enqueue'
    | 'dequeue'
    | 'listKeys'
    | 'countWaiters'
    | 'nextExpiry',
    ReturnType<SqliteDatabase['prepare']>
  >;
  let prepared: Prepared | undefined;
  const st = (): Prepared =>
    (prepared ??= {
      selectHolders: db.prepare(SELECT_HOLDERS).safeIntegers(true),
      deleteHolder: db.prepare(DELETE_HOLDER),
      deleteHolderWithToken: db.prepare(DELETE_HOLDER_WITH_TOKEN),
      insertHolder: db.prepare(INSERT_HOLDER),
      renewHolder: db.prepare(RENEW_HOLDER),
      holderSession: db.prepare(HOLDER_SESSION),
      rebindHolder: db.prepare(REBIND_HOLDER),
      selectTokenRow: db.prepare(SELECT_TOKEN_ROW).safeIntegers(true),
      nextToken: db.prepare(NEXT_TOKEN).safeIntegers(true),
      setDelay: db.prepare(SET_DELAY),
      purgeWaiters: db.prepare(PURGE_WAITERS),
      selectWaiters: db.prepare(SELECT_WAITERS),
      selectPlaces: db.prepare(SELECT_PLACES).safeIntegers(true),
      enqueue: db.prepare(ENQUEUE),
      dequeue: db.prepare(DEQUEUE),
      listKeys: db.prepare(LIST_KEYS),
      countWaiters: db.prepare(COUNT_WAITERS),
      nextExpiry: db.prepare(NEXT_EXPIRY).safeIntegers(true),
    });

  interface HolderRow {
    owner: string;
    mode: LockMode;
    token: bigint;
    holder: string;
    expires_at: bigint;
    epoch: string;
    lock_delay_ms: bigint;
    permit_limit: bigint | null;
  }

  /** Keys whose holders this connection changed in the operation under way; `watch` observers hear of them once it commits. */
  const changedKeys = new Set<string>();

  /**
   * A shared request's limit against the key's live shared holders (permits record theirs): another
   * limit, or permits mixed with plain shared holders, is refused before anything is written (the
   * transaction rolls back).
   */
  const checkLimit = (req: AcquireRequest, holders: readonly HolderRow[]): void => {
    if (req.mode !== 'shared') return;
    const asked = req.limit;
    for (const h of holders) {
      const held = h.permit_limit === null ? undefined : Number(h.permit_limit);
      if (h.mode === 'shared' && held !== asked) throw limitConflict(req.key, held, asked);
    }
  };

  /** The holders leave room for the request: none, all shared and (for a permit) fewer than its limit. */
  const compatibleWith = (req: AcquireRequest, holders: readonly HolderRow[]): boolean =>
    holders.length === 0 || (req.mode === 'shared' && holders.every((h) => h.mode === 'shared') && (req.limit === undefined || holders.length < req.limit));

  /**
   * Fair order: a queued request goes only when everyone ahead of it could go with it (no exclusive
   * request on either side), and a permit only when fewer permit waiters are ahead than free places.
   * `ahead` is the queue before the caller's place (the whole queue when it has none).
   */
  const clearOf = (req: AcquireRequest, holders: readonly HolderRow[], ahead: readonly { mode: LockMode }[]): boolean =>
    ahead.every((w) => req.mode === 'shared' && w.mode === 'shared') && (req.limit === undefined || ahead.length < req.limit - holders.length);

  /** Removes expired holders of `key` (starting their lock-delay, I8) and expired queue places; returns the live holders. */
  const purge = (key: string, now: number, epoch: string): HolderRow[] => {
    const s = st();
    const live: HolderRow[] = [];
    let delayUntil = 0;
    for (const row of s.selectHolders.all(key) as HolderRow[]) {
      const sameEpoch = row.epoch === epoch;
      const expiresAt = Number(row.expires_at);
      if (sameEpoch && expiresAt > now) {
        live.push(row);
        continue;
      }
      s.deleteHolder.run(key, row.owner);
      changedKeys.add(key);
      if (sameEpoch && row.lock_delay_ms > 0n) delayUntil = Math.max(delayUntil, expiresAt + Number(row.lock_delay_ms));
    }
    if (delayUntil > 0) {
      const t = s.selectTokenRow.get(key) as { delay_until: bigint; delay_epoch: string } | undefined;
      const current = t && t.delay_epoch === epoch ? Number(t.delay_until) : 0;
      if (delayUntil > current) s.setDelay.run(delayUntil, epoch, key);
    }
    s.purgeWaiters.run(key, now, epoch);
    return live;
  };

  const acquireTx = (req: AcquireRequest): AcquireResult => {
    const s = st();
    const now = clock.now();
    const epoch = clock.epoch;
    // A request bound to a session that is gone is answered so before anything is written.
    const sessionExpiry = req.session === undefined ? undefined : sessions.expiry(req.session, now, epoch);
    if (req.session !== undefined && sessionExpiry === undefined) return SESSION_LOST;
    /** A session-bound holder lives as long as its session (each keep-alive moves both). */
    const expiresAt = sessionExpiry ?? now + req.ttlMs;
    const holders = purge(req.key, now, epoch);
    const mine = holders.find((h) => h.owner === req.owner);
    if (mine) {
      // A retry whose earlier answer was lost: the same grant, its expiry counted from this request
      // (I5), bound to the session it asks with now.
      s.rebindHolder.run(expiresAt, req.session ?? null, req.key, req.owner, mine.token, epoch, now);
      return { granted: true, token: mine.token, ttlMs: req.ttlMs };
    }
    checkLimit(req, holders);
    const t = s.selectTokenRow.get(req.key) as { delay_until: bigint; delay_epoch: string } | undefined;
    const delayUntil = t && t.delay_epoch === epoch ? Number(t.delay_until) : 0;
    const waiters = s.selectWaiters.all(req.key) as { owner: string; mode: LockMode }[];
    const place = waiters.findIndex((w) => w.owner === req.owner);
    // A request that will not wait (tryAcquire) never barges past waiters.
    const clearAhead = req.queue ? clearOf(req, holders, place < 0 ? waiters : waiters.slice(0, place)) : waiters.length === 0;

    if (compatibleWith(req, holders) && now >= delayUntil && clearAhead) {
      const { last_token: token } = s.nextToken.get(req.key) as { last_token: bigint };
      const limit = req.mode === 'shared' ? (req.limit ?? null) : null;
      s.insertHolder.run(req.key, req.owner, req.mode, token, req.holder, expiresAt, epoch, req.lockDelayMs, limit, req.session ?? null);
      s.dequeue.run(req.key, req.owner);
      changedKeys.add(req.key);
      return { granted: true, token, ttlMs: req.ttlMs };
    }
    if (req.queue) {
      // A fresh place is left as it is: refreshing it on every ask would be a commit that wakes every other waiter.
      const fresh =
        place >= 0 &&
        Number((s.selectPlaces.all(req.key) as { owner: string; expires_at: bigint }[]).find((w) => w.owner === req.owner)?.expires_at ?? 0) - now >=
          req.queueTtlMs / 2;
      if (!fresh) s.enqueue.run({ key: req.key, owner: req.owner, mode: req.mode, expiresAt: now + req.queueTtlMs, epoch });
    }
    let soonest = delayUntil > now ? delayUntil : Infinity;
    for (const h of holders) soonest = Math.min(soonest, Math.max(Number(h.expires_at), delayUntil));
    const busy = { granted: false as const, holder: holders[0]?.holder };
    return soonest === Infinity ? busy : { ...busy, retryInMs: Math.max(0, soonest - now) };
  };

  /**
   * A queued waiter asking again (woken by someone's commit, or core's periodic check) first looks
   * without writing: while it cannot be granted and its place is fresh, it is answered busy from a
   * read, with no write lock and no commit. Without this every commit woke every waiter into a
   * write transaction whose commit woke all the others again (8 processes: 9–16 fsyncs per
   * contended section, bench/README.md). Undefined means "needs the write transaction": it can be
   * granted, it holds already, something expired (purge writes, and starts lock-delay), or its
   * place is missing or past half of its time.
   */
  const peekTx = (req: AcquireRequest): AcquireResult | undefined => {
    if (!req.queue) return undefined;
    const s = st();
    const now = clock.now();
    const epoch = clock.epoch;
    if (req.session !== undefined && sessions.expiry(req.session, now, epoch) === undefined) return SESSION_LOST;
    const holders = s.selectHolders.all(req.key) as HolderRow[];
    if (holders.some((h) => h.owner === req.owner || h.epoch !== epoch || Number(h.expires_at) <= now)) return undefined;
    const places = s.selectPlaces.all(req.key) as { owner: string; mode: LockMode; expires_at: bigint; epoch: string }[];
    if (places.some((w) => w.epoch !== epoch || Number(w.expires_at) <= now)) return undefined;
    const mine = places.findIndex((w) => w.owner === req.owner);
    if (mine < 0 || Number(places[mine]!.expires_at) - now < req.queueTtlMs / 2) return undefined;
    // A limit the key refuses is answered by the write transaction (which writes nothing then).
    if (req.mode === 'shared' && holders.some((h) => h.mode === 'shared' && (h.permit_limit === null ? undefined : Number(h.permit_limit)) !== req.limit)) {
      return undefined;
    }
    const t = s.selectTokenRow.get(req.key) as { delay_until: bigint; delay_epoch: string } | undefined;
    const delayUntil = t && t.delay_epoch === epoch ? Number(t.delay_until) : 0;
    if (compatibleWith(req, holders) && now >= delayUntil && clearOf(req, holders, places.slice(0, mine))) return undefined;
    let soonest = delayUntil > now ? delayUntil : Infinity;
    for (const h of holders) soonest = Math.min(soonest, Math.max(Number(h.expires_at), delayUntil));
    const busy = { granted: false as const, holder: holders[0]?.holder };
    return soonest === Infinity ? busy : { ...busy, retryInMs: Math.max(0, soonest - now) };
  };

  // Wake-ups: our own commits notify subscribers of this backend directly; commits by other
  // processes are seen by polling PRAGMA data_version (cheap, no lock) while anyone waits or watches.
  const subscribers = new Set<() => void>();
  /** `watch` observers by key, each key with a timer at its first holder's expiry. */
  const watched = new Map<string, { fns: Set<() => void>; timer: ReturnType<typeof setTimeout> | undefined }>();
  let pollTimer: ReturnType<typeof setInterval> | undefined;
  let lastVersion = -1;
  const notifyAll = (): void => {
    for (const fn of [...subscribers]) fn();
  };

  /** Arms the key's expiry timer at its first holder's expiry (a renewal moves it: the observer is then told spuriously). */
  const armExpiry = (key: string): void => {
    const w = watched.get(key);
    if (!w) return;
    if (w.timer) clearTimeout(w.timer);
    w.timer = undefined;
    let at: number | undefined;
    try {
      const row = st().nextExpiry.get(key, clock.epoch) as { at: bigint | null } | undefined;
      at = row?.at === null || row?.at === undefined ? undefined : Number(row.at);
    } catch {
      return; // closed or unreadable: the next commit seen re-arms it
    }
    if (at === undefined) return;
    w.timer = setTimeout(() => fireWatch(key), Math.max(0, at - clock.now()) + 1);
    w.timer.unref();
  };
  const fireWatch = (key: string): void => {
    const w = watched.get(key);
    if (!w) return;
    for (const fn of w.fns) queueMicrotask(fn);
    armExpiry(key);
  };
  /** After our own commit: the keys whose holders it changed. (Other processes' commits reach every key, through data_version.) */
  const flushChanges = (): void => {
    const keys = [...changedKeys];
    changedKeys.clear();
    for (const key of keys) fireWatch(key);
  };
  const startPolling = (): void => {
    if (pollTimer || !db.open) return;
    lastVersion = Number(db.pragma('data_version', { simple: true }));
    pollTimer = setInterval(() => {
      try {
        const v = Number(db.pragma('data_version', { simple: true }));
        if (v !== lastVersion) {
          lastVersion = v;
          notifyAll();
          for (const key of watched.keys()) fireWatch(key);
        }
      } catch {
        // The database was closed or is unreadable; waiters fall back to core's periodic re-check.
      }
    }, CHANGE_POLL_MS);
    pollTimer.unref();
  };
  const stopPolling = (): void => {
    if (pollTimer) clearInterval(pollTimer);
    pollTimer = undefined;
  };

  let closed = false;
  const run = async <T>(what: string, op: () => T): Promise<T> => {
    // Inside a transaction the user left open on their connection, our writes would commit or roll
    // back with it: a rollback takes the token counter back (the next grant repeats the token), or
    // the tables created on first use.
    if (db.inTransaction) {
      throw new InvalidArgumentError(
        'database',
        `${what}: the connection has an open transaction, which leasehold's writes would join; finish it first or give the backend its own connection (path)`,
      );
    }
    await init();
    try {
      const result = await retryBusy(what, op);
      flushChanges();
      return result;
    } catch (error) {
      changedKeys.clear(); // rolled back
      throw mapError(what, error);
    }
  };

  const sessions = new SqliteSessions({
    db,
    clock,
    locksTable: locksT,
    sessionsTable: sessionsT,
    run,
    purge,
    changed: (key) => changedKeys.add(key),
    wake: notifyAll,
  });

  const backend: Backend = {
    name: 'sqlite',
    capabilities: Object.freeze({ fair: true, minTtlMs: 0, keepablePlaces: 'all' }),

    acquire: (req) => run('acquire', () => db.transaction(peekTx).deferred(req) ?? db.transaction(acquireTx).immediate(req)),

    async renew(req: RenewRequest): Promise<RenewResult> {
      // A holder bound to a session is renewed by its session's keep-alive: every lease of that session with it (as memory and Redis do).
      const renewed = await run('renew', () =>
        db
          .transaction((): boolean => {
            const s = st();
            const now = clock.now();
            if (s.renewHolder.run(now + req.ttlMs, req.key, req.owner, req.token, clock.epoch, now).changes === 1) return true;
            const bound = s.holderSession.get(req.key, req.owner, req.token, clock.epoch, now) as { session: string } | undefined;
            return bound !== undefined && sessions.keepAlive(bound.session, req.ttlMs);
          })
          .immediate(),
      );
      return renewed ? { renewed: true, ttlMs: req.ttlMs } : { renewed: false };
    },

    async release(req: ReleaseRequest): Promise<void> {
      // Purge first: a holder that already expired is not "released" — its lock-delay starts (I8).
      const { changes } = await run('release', () =>
        db
          .transaction(() => {
            purge(req.key, clock.now(), clock.epoch);
            const result = st().deleteHolderWithToken.run(req.key, req.owner, req.token);
            if (result.changes > 0) changedKeys.add(req.key);
            return result;
          })
          .immediate(),
      );
      if (changes > 0) notifyAll();
    },

    async cancelWait({ key, owner }) {
      const { changes } = await run('cancel wait', () => st().dequeue.run(key, owner));
      if (changes > 0) notifyAll();
    },

    async subscribe(_key: string, onChange: () => void) {
      await run('subscribe', () => startPolling());
      subscribers.add(onChange);
      return () => {
        subscribers.delete(onChange);
        if (subscribers.size === 0 && watched.size === 0) stopPolling();
      };
    },

    /** Any commit to the database by another connection (data_version) or a change of the key by this one; and the key's expiries. */
    async watch(key: string, onChange: () => void) {
      await run('watch', () => startPolling());
      let w = watched.get(key);
      if (!w) watched.set(key, (w = { fns: new Set(), timer: undefined }));
      w.fns.add(onChange);
      armExpiry(key);
      const entry = w;
      return () => {
        entry.fns.delete(onChange);
        if (entry.fns.size === 0 && watched.get(key) === entry) {
          if (entry.timer) clearTimeout(entry.timer);
          watched.delete(key);
        }
        if (subscribers.size === 0 && watched.size === 0) stopPolling();
      };
    },

    async inspect(prefix: string): Promise<KeyState[]> {
      return run('inspect', () =>
        db
          .transaction((): KeyState[] => {
            const s = st();
            const now = clock.now();
            const out: KeyState[] = [];
            for (const { key } of s.listKeys.all({ n: [...prefix].length, prefix }) as { key: string }[]) {
              const holders = purge(key, now, clock.epoch);
              const t = s.selectTokenRow.get(key) as { last_token: bigint; delay_until: bigint; delay_epoch: string } | undefined;
              const delay = t && t.delay_epoch === clock.epoch ? Math.max(0, Number(t.delay_until) - now) : 0;
              const waiters = Number((s.countWaiters.get(key) as { n: number }).n);
              if (holders.length === 0 && waiters === 0 && delay === 0) continue;
              const limit = holders.find((h) => h.permit_limit !== null)?.permit_limit;
              out.push({
                key,
                lastToken: t?.last_token ?? 0n,
                holders: holders.map((h) => ({ mode: h.mode, token: h.token, holder: h.holder, expiresInMs: Math.max(0, Number(h.expires_at) - now) })),
                waiters,
                lockDelayRemainingMs: delay,
                ...(limit !== undefined && limit !== null && { limit: Number(limit) }),
              });
            }
            return out;
          })
          .immediate(),
      );
    },

    async close() {
      if (closed) return;
      closed = true;
      stopPolling();
      notifyAll();
      subscribers.clear();
      for (const w of watched.values()) {
        if (w.timer) clearTimeout(w.timer);
        for (const fn of w.fns) fn();
      }
      watched.clear();
      if (ownsDb && db.open) db.close();
    },
  };
  if (withSessions) backend.sessions = sessions.support();
  return backend;
}

function mapError(what: string, error: unknown): LeaseholdError {
  if (error instanceof LeaseholdError) return error;
  if (isSqliteError(error)) return new BackendUnavailableError('sqlite', `${what} failed: ${(error as Error).message}`, { cause: error });
  return new BackendUnavailableError('sqlite', `${what} failed: ${String((error as Error)?.message ?? error)}`, { cause: error });
}

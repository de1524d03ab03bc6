import { createHash } from 'node:crypto';
import { InvalidArgumentError } from '../core/errors.js';
import { checkKnownOptions, checkObject } from '../core/validate.js';
import { checkPgIdentifier, quotePg } from './util.js';

/**
 * The lease store's schema, as plain SQL: five tables and seven functions in one schema. Every
 * operation of the backend is one statement (a function called by one SELECT, or one UPDATE), so
 * it works through any pooler, including PgBouncer in transaction mode.
 *
 * Bump SCHEMA_VERSION whenever the DDL below changes; the backend compares it with the comment on
 * the acquire function to decide whether its DDL has to run. (A function whose result columns
 * change needs a DROP FUNCTION first: CREATE OR REPLACE cannot change them.)
 */
export const SCHEMA_VERSION = 'leasehold-locks/5';

/**
 * SQLSTATE of the acquire function's refusal of a limit the key does not have (see
 * `AcquireRequest.limit`); its DETAIL is the key's limit, or `none` for plain shared holders. The
 * error rolls the call back: nothing is written.
 */
export const LIMIT_CONFLICT_STATE = 'LH001';

/** The acquire function's argument types before semaphore permits (leasehold-locks/2), dropped by the DDL. */
const ACQUIRE_ARGS_V2 = 'text, text, text, bigint, bigint, text, boolean, bigint';
/** Before sessions (leasehold-locks/3 and /4), dropped by the DDL too. */
const ACQUIRE_ARGS_V4 = `${ACQUIRE_ARGS_V2}, integer`;
const ACQUIRE_ARGS = `${ACQUIRE_ARGS_V4}, text`;

/** Longest table name: the derived names (`<table>_waiters`, `<table>_acquire`, …) must stay within PostgreSQL's 63 bytes. */
const MAX_TABLE_NAME = 50;

export interface PostgresSchemaOptions {
  /** Schema that holds the tables and functions (created if missing). @default 'public' */
  schema?: string;
  /** Table of current holders; the others are `<table>_keys`, `<table>_waiters`, `<table>_watched` and `<table>_sessions`. @default 'leasehold_locks' */
  table?: string;
}

/** Every name the backend uses, quoted and schema-qualified. */
export interface SchemaNames {
  readonly schema: string;
  readonly table: string;
  /** One row per key ever granted: the token counter, the lock-delay, the change counter. Never deleted (I1). */
  readonly keys: string;
  /** One row per current holder (several for shared holders). */
  readonly holders: string;
  /** The fair queue: one row per waiting owner, in arrival order (`seq`). */
  readonly waiters: string;
  /** Watch marks: one row per key and watching backend instance, live until `expires_at` (see `watchFn`). */
  readonly watched: string;
  /** Sessions (`Backend.sessions`): one row per open session, live until `expires_at`; its holders refer to it. */
  readonly sessions: string;
  /** The index of holders by session, unqualified (an index lives in its table's schema). */
  readonly sessionIndex: string;
  readonly notifyFn: string;
  readonly acquireFn: string;
  readonly releaseFn: string;
  readonly cancelFn: string;
  /** Marks a key watched (or keeps the mark) and reads what a watcher compares: `src/postgres/watch.ts`. */
  readonly watchFn: string;
  /** A session's keep-alive: extends the session and every holder bound to it (`src/postgres/sessions.ts`). */
  readonly keepAliveFn: string;
  /** Ends a session and frees its holders, waking their waiters (`src/postgres/sessions.ts`). */
  readonly sessionEndFn: string;
  /** `to_regproc` argument naming the acquire function (the schema version is its comment). */
  readonly acquireRegproc: string;
  /** LISTEN/NOTIFY channel of this lease table; the payload of each notification is `<upto>:<key>` (see the notify function). */
  readonly channel: string;
  /** Advisory-lock name serialising this table's DDL across processes. */
  readonly ddlLock: string;
}

export function schemaNames(options: PostgresSchemaOptions | undefined): SchemaNames {
  const o = checkObject(options, 'options');
  const schema = checkPgIdentifier(o.schema ?? 'public', 'schema');
  const table = checkPgIdentifier(o.table ?? 'leasehold_locks', 'table');
  if (table.length > MAX_TABLE_NAME) {
    throw new InvalidArgumentError('table', `at most ${MAX_TABLE_NAME} characters (leasehold derives longer names from it), got ${table.length}`);
  }
  const s = quotePg(schema);
  const q = (suffix: string): string => `${s}.${quotePg(`${table}${suffix}`)}`;
  const plainChannel = `leasehold:${schema}.${table}`;
  return {
    schema,
    table,
    keys: q('_keys'),
    holders: q(''),
    waiters: q('_waiters'),
    watched: q('_watched'),
    sessions: q('_sessions'),
    sessionIndex: quotePg(`${table}_by_session`),
    notifyFn: q('_notify'),
    acquireFn: q('_acquire'),
    releaseFn: q('_release'),
    cancelFn: q('_cancel'),
    watchFn: q('_watch'),
    keepAliveFn: q('_keepalive'),
    sessionEndFn: q('_session_end'),
    acquireRegproc: q('_acquire'),
    // Channel names are identifiers (at most 63 bytes): long schema.table pairs get a digest instead.
    channel: Buffer.byteLength(plainChannel) <= 63 ? plainChannel : `leasehold:${createHash('sha256').update(`${schema}.${table}`).digest('hex').slice(0, 40)}`,
    ddlLock: `leasehold:${schema}.${table}`,
  };
}

/**
 * One statement that removes the key's expired holders (and, in release, the caller's own live
 * holding: `alsoHolder`) and expired queue places. Sets v_removed (rows gone), v_purged_delay (the
 * end of the lock-delay the expired holders start, I8) and v_released (the caller's live holding
 * went). The caller holds the key's row lock and has set v_now.
 */
function purge(n: SchemaNames, alsoHolder: string): string {
  return `WITH gone AS (
      DELETE FROM ${n.holders} h WHERE h.key = p_key AND (h.expires_at <= v_now ${alsoHolder})
      RETURNING h.expires_at > v_now AS live, h.expires_at + h.lock_delay_ms * interval '1 millisecond' AS until, h.lock_delay_ms
    ), gone_waiters AS (
      DELETE FROM ${n.waiters} w WHERE w.key = p_key AND w.expires_at <= v_now RETURNING 1
    )
    SELECT count(*) + (SELECT count(*) FROM gone_waiters), max(gone.until) FILTER (WHERE NOT gone.live AND gone.lock_delay_ms > 0),
           coalesce(bool_or(gone.live), false)
      INTO v_removed, v_purged_delay${alsoHolder ? ', v_released' : ''} FROM gone;`;
}

/** A string literal for DDL (the channel name is baked into the functions). */
function literal(value: string): string {
  return `'${value.replace(/'/g, "''")}'`;
}

/**
 * The DDL as a list of statements, each idempotent (IF NOT EXISTS, CREATE OR REPLACE). The backend
 * runs them inside one transaction under an advisory transaction lock, so concurrent first starts
 * do not race in the catalog.
 */
export function schemaStatements(n: SchemaNames): string[] {
  return [
    `CREATE SCHEMA IF NOT EXISTS ${quotePg(n.schema)}`,

    `CREATE TABLE IF NOT EXISTS ${n.keys} (
  key text COLLATE "C" PRIMARY KEY,
  last_token bigint NOT NULL DEFAULT 0 CHECK (last_token >= 0),
  delay_until timestamptz,
  version bigint NOT NULL DEFAULT 0
)`,

    `CREATE TABLE IF NOT EXISTS ${n.holders} (
  key text COLLATE "C" NOT NULL,
  owner text NOT NULL,
  mode text NOT NULL CHECK (mode IN ('exclusive', 'shared')),
  token bigint NOT NULL CHECK (token > 0),
  holder text NOT NULL,
  acquired_at timestamptz NOT NULL,
  expires_at timestamptz NOT NULL,
  lock_delay_ms bigint NOT NULL DEFAULT 0 CHECK (lock_delay_ms >= 0),
  permit_limit integer CHECK (permit_limit BETWEEN 1 AND 10000),
  session text,
  PRIMARY KEY (key, owner)
)`,

    // A semaphore permit's limit next to its holder (NULL: a plain lock); tables made before
    // permits get it here (rows written before read as plain locks).
    `ALTER TABLE ${n.holders} ADD COLUMN IF NOT EXISTS permit_limit integer CHECK (permit_limit BETWEEN 1 AND 10000)`,

    // The session a holder is bound to (NULL: renewed on its own). Its expires_at is then the
    // session's, moved by every keep-alive, so it stays the one truth every other query reads.
    // Tables made before sessions get it here.
    `ALTER TABLE ${n.holders} ADD COLUMN IF NOT EXISTS session text`,

    // A keep-alive and a session's end find the session's holders by it.
    `CREATE INDEX IF NOT EXISTS ${n.sessionIndex} ON ${n.holders} (session) WHERE session IS NOT NULL`,

    // Sessions (Backend.sessions): one row per session, live until expires_at (this server's
    // clock, I7). Rows that ran out are deleted by the next open; their holders are not touched
    // (they expired with them, and are purged with their lock-delay like any other, I8).
    `CREATE TABLE IF NOT EXISTS ${n.sessions} (
  id text PRIMARY KEY,
  expires_at timestamptz NOT NULL
)`,

    `CREATE TABLE IF NOT EXISTS ${n.waiters} (
  key text COLLATE "C" NOT NULL,
  owner text NOT NULL,
  mode text NOT NULL CHECK (mode IN ('exclusive', 'shared')),
  seq bigint GENERATED ALWAYS AS IDENTITY,
  expires_at timestamptz NOT NULL,
  PRIMARY KEY (key, owner)
)`,

    // Who watches a key (Backend.watch): one row per key and watching backend instance, live until
    // expires_at (this server's clock, I7) and renewed by the watcher well before then. A grant
    // that no queued waiter needs to hear of NOTIFYs only while its key has a live mark: a NOTIFY
    // serialises commits server-wide, so keys nobody watches must not pay for one on every grant. A
    // watcher that crashed stops renewing, and its mark runs out.
    `CREATE TABLE IF NOT EXISTS ${n.watched} (
  key text COLLATE "C" NOT NULL,
  watcher text NOT NULL,
  expires_at timestamptz NOT NULL,
  PRIMARY KEY (key, watcher)
)`,

    // Tells the key's waiters that it may have become free. The payload is `<upto>:<key>`: only
    // queued waiters with seq <= upto could be granted now (the exclusive head of the queue, or the
    // run of shared waiters at its head), so the others are not woken for nothing; `*` (nobody
    // queued) wakes every subscriber of the key. (A grant that changes nothing for waiters sends
    // `0:<key>`, which wakes only the key's watchers, subscribers without a queue place, and only
    // while the key is watched: see the watched table.)
    `CREATE OR REPLACE FUNCTION ${n.notifyFn}(p_key text)
RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
  -- PL/pgSQL rather than SQL: its plan is cached per connection (a SQL function is planned on every call).
  PERFORM pg_notify(${literal(n.channel)}, coalesce((
    SELECT CASE WHEN head.mode = 'exclusive' THEN head.seq
      ELSE coalesce((SELECT min(w.seq) - 1 FROM ${n.waiters} w
                     WHERE w.key = p_key AND w.expires_at > clock_timestamp() AND w.mode = 'exclusive' AND w.seq > head.seq),
                    9223372036854775807) END::text
    FROM (SELECT w.seq, w.mode FROM ${n.waiters} w
          WHERE w.key = p_key AND w.expires_at > clock_timestamp() ORDER BY w.seq LIMIT 1) head
  ), '*') || ':' || p_key);
END
$fn$`,

    // The whole grant in one call. A busy answer that changes nothing (a live incompatible holder,
    // the caller's queue place still fresh) is read from one snapshot without locking or writing.
    // A permit (p_limit set, p_mode 'shared') also conflicts with p_limit live permits, and is
    // refused (LIMIT_CONFLICT_STATE, rolled back) when the key's shared holders have another limit.
    // Otherwise: lock the key's row (created on first use), purge expired holders (starting their
    // lock-delay, I8) and queue places, check compatibility, lock-delay and the queue, then either
    // raise the token and insert the holder in the same transaction (I1, I2), or refresh the
    // caller's place in the queue and say when to retry. Expiry instants come from this server's
    // clock only (I7); the client sends durations.
    // A request bound to a session (p_session) is answered session_lost, writing nothing, when the
    // session is gone; otherwise it takes the session's row (FOR KEY SHARE, before the key's row: a
    // session's end locks in the same order) so no keep-alive runs between reading the session's
    // expiry and committing the holder that copies it, and the holder's expires_at is the session's.
    `DROP FUNCTION IF EXISTS ${n.acquireFn}(${ACQUIRE_ARGS_V2})`,

    `DROP FUNCTION IF EXISTS ${n.acquireFn}(${ACQUIRE_ARGS_V4})`,

    `CREATE OR REPLACE FUNCTION ${n.acquireFn}(
  p_key text, p_owner text, p_mode text, p_ttl_ms bigint, p_lock_delay_ms bigint, p_holder text,
  p_queue boolean, p_queue_ttl_ms bigint, p_limit integer, p_session text
) RETURNS TABLE (granted boolean, token bigint, holder text, retry_in_ms bigint, version bigint, seq bigint, session_lost boolean)
LANGUAGE plpgsql SET lock_timeout = '2s' AS $fn$
DECLARE
  v_now timestamptz := clock_timestamp();
  v_delay timestamptz;
  v_version bigint;
  v_removed bigint;
  v_purged_delay timestamptz;
  v_token bigint;
  v_conflict boolean;
  v_holder text;
  v_first_expiry timestamptz;
  v_my_seq bigint;
  v_blocked boolean;
  v_changed boolean;
  v_live_delay timestamptz;
  v_soonest timestamptz;
  v_count bigint;
  v_mismatch boolean;
  v_held_limit integer;
  v_session_expiry timestamptz;
BEGIN
  IF p_session IS NOT NULL AND NOT EXISTS (SELECT 1 FROM ${n.sessions} s WHERE s.id = p_session AND s.expires_at > v_now) THEN
    RETURN QUERY SELECT false, NULL::bigint, NULL::text, NULL::bigint, NULL::bigint, NULL::bigint, true;
    RETURN;
  END IF;

  -- Fast path: busy, nothing to purge, nothing to refresh (one statement, one snapshot, no write).
  SELECT k.version, k.delay_until, w.seq,
         (SELECT h.holder FROM ${n.holders} h WHERE h.key = p_key AND h.expires_at > v_now ORDER BY h.token LIMIT 1),
         (SELECT min(h.expires_at) FROM ${n.holders} h WHERE h.key = p_key AND h.expires_at > v_now)
    INTO v_version, v_delay, v_my_seq, v_holder, v_first_expiry
    FROM ${n.keys} k LEFT JOIN ${n.waiters} w ON w.key = k.key AND w.owner = p_owner
    WHERE k.key = p_key
      AND (EXISTS (SELECT 1 FROM ${n.holders} h WHERE h.key = p_key AND h.expires_at > v_now
                   AND (p_mode = 'exclusive' OR h.mode = 'exclusive'))
           OR (p_limit IS NOT NULL
               AND (SELECT count(*) FROM ${n.holders} h WHERE h.key = p_key AND h.expires_at > v_now) >= p_limit
               AND NOT EXISTS (SELECT 1 FROM ${n.holders} h WHERE h.key = p_key AND h.expires_at > v_now
                               AND h.permit_limit IS DISTINCT FROM p_limit)))
      AND NOT EXISTS (SELECT 1 FROM ${n.holders} h WHERE h.key = p_key AND h.owner = p_owner)
      AND (NOT p_queue OR w.expires_at > v_now + p_queue_ttl_ms * interval '1 millisecond' * 2 / 3);

  IF NOT FOUND THEN
    IF p_session IS NOT NULL THEN
      SELECT s.expires_at INTO v_session_expiry FROM ${n.sessions} s WHERE s.id = p_session FOR KEY SHARE;
      IF v_session_expiry IS NULL OR v_session_expiry <= clock_timestamp() THEN
        RETURN QUERY SELECT false, NULL::bigint, NULL::text, NULL::bigint, NULL::bigint, NULL::bigint, true;
        RETURN;
      END IF;
    END IF;
    SELECT k.delay_until, k.version INTO v_delay, v_version FROM ${n.keys} k WHERE k.key = p_key FOR UPDATE;
    IF NOT FOUND THEN
      INSERT INTO ${n.keys} (key) VALUES (p_key) ON CONFLICT (key) DO NOTHING;
      SELECT k.delay_until, k.version INTO v_delay, v_version FROM ${n.keys} k WHERE k.key = p_key FOR UPDATE;
    END IF;
    v_now := clock_timestamp();
    IF v_session_expiry <= v_now THEN
      -- the session ran out while this call waited for the key
      RETURN QUERY SELECT false, NULL::bigint, NULL::text, NULL::bigint, NULL::bigint, NULL::bigint, true;
      RETURN;
    END IF;
    ${purge(n, '')}
    v_delay := greatest(v_delay, v_purged_delay);
    v_changed := v_removed > 0;

    -- The holders left are live: is the caller one of them (a retried request whose answer was
    -- lost gets its own grant back, its expiry counted from this request (I5), bound to the
    -- session it asks with now), does anyone
    -- conflict, who holds, when does the first expire.
    SELECT max(h.token) FILTER (WHERE h.owner = p_owner), coalesce(bool_or(p_mode = 'exclusive' OR h.mode = 'exclusive'), false),
           (array_agg(h.holder ORDER BY h.token))[1], min(h.expires_at), count(*),
           coalesce(bool_or(p_mode = 'shared' AND h.mode = 'shared' AND h.permit_limit IS DISTINCT FROM p_limit), false), max(h.permit_limit)
      INTO v_token, v_conflict, v_holder, v_first_expiry, v_count, v_mismatch, v_held_limit
      FROM ${n.holders} h WHERE h.key = p_key;
    IF v_token IS NOT NULL THEN
      UPDATE ${n.holders} h SET expires_at = coalesce(v_session_expiry, v_now + p_ttl_ms * interval '1 millisecond'), session = p_session
        WHERE h.key = p_key AND h.owner = p_owner;
      IF v_changed THEN
        UPDATE ${n.keys} k SET delay_until = v_delay, version = k.version + 1 WHERE k.key = p_key;
        PERFORM ${n.notifyFn}(p_key);
      END IF;
      RETURN QUERY SELECT true, v_token, NULL::text, NULL::bigint, NULL::bigint, NULL::bigint, false;
      RETURN;
    END IF;

    -- The key records its limit while held: another one is refused, and the call rolled back.
    IF v_mismatch THEN
      RAISE EXCEPTION 'leasehold: the key holds permits of another limit' USING ERRCODE = ${literal(LIMIT_CONFLICT_STATE)},
        DETAIL = coalesce(v_held_limit::text, 'none');
    END IF;
    v_conflict := v_conflict OR (p_limit IS NOT NULL AND v_count >= p_limit);

    -- A queued request goes when everyone ahead of it could go with it (shared behind shared), a
    -- permit only when fewer waiters are ahead of it than free places; a request that will not wait
    -- (tryAcquire) never barges past waiters.
    SELECT me.seq, EXISTS (
        SELECT 1 FROM ${n.waiters} w
        WHERE w.key = p_key AND w.owner <> p_owner AND (me.seq IS NULL OR w.seq < me.seq)
          AND (NOT p_queue OR p_mode = 'exclusive' OR w.mode = 'exclusive'))
        OR (p_limit IS NOT NULL AND (
          SELECT count(*) FROM ${n.waiters} w
          WHERE w.key = p_key AND w.owner <> p_owner AND (me.seq IS NULL OR w.seq < me.seq)) >= p_limit - v_count)
      INTO v_my_seq, v_blocked
      FROM (SELECT (SELECT w.seq FROM ${n.waiters} w WHERE w.key = p_key AND w.owner = p_owner) AS seq) me;

    IF NOT v_conflict AND NOT v_blocked AND (v_delay IS NULL OR v_delay <= v_now) THEN
      IF v_my_seq IS NOT NULL THEN
        DELETE FROM ${n.waiters} w WHERE w.key = p_key AND w.owner = p_owner;
        v_changed := true;
      END IF;
      -- After an exclusive grant nobody else can go: waiters hear only of shared grants (the next
      -- shared waiter may join), and the version moves only when they hear. Watchers hear of every
      -- grant, but a key nobody watches sends no NOTIFY for a grant waiters need not hear of.
      v_changed := v_changed AND p_mode = 'shared';
      UPDATE ${n.keys} k
        SET last_token = k.last_token + 1, delay_until = v_delay,
            version = k.version + CASE WHEN v_changed THEN 1 ELSE 0 END
        WHERE k.key = p_key
        RETURNING k.last_token INTO v_token;
      INSERT INTO ${n.holders} (key, owner, mode, token, holder, acquired_at, expires_at, lock_delay_ms, permit_limit, session)
        VALUES (p_key, p_owner, p_mode, v_token, p_holder, v_now, coalesce(v_session_expiry, v_now + p_ttl_ms * interval '1 millisecond'),
                p_lock_delay_ms, CASE WHEN p_mode = 'shared' THEN p_limit END, p_session);
      IF v_changed THEN
        PERFORM ${n.notifyFn}(p_key);
      ELSIF EXISTS (SELECT 1 FROM ${n.watched} x WHERE x.key = p_key AND x.expires_at > v_now) THEN
        PERFORM pg_notify(${literal(n.channel)}, '0:' || p_key);
      END IF;
      RETURN QUERY SELECT true, v_token, NULL::text, NULL::bigint, NULL::bigint, NULL::bigint, false;
      RETURN;
    END IF;

    IF p_queue THEN
      INSERT INTO ${n.waiters} AS w (key, owner, mode, expires_at)
        VALUES (p_key, p_owner, p_mode, v_now + p_queue_ttl_ms * interval '1 millisecond')
        ON CONFLICT (key, owner) DO UPDATE SET expires_at = EXCLUDED.expires_at
        RETURNING w.seq INTO v_my_seq;
    END IF;
    IF v_changed THEN
      UPDATE ${n.keys} k SET delay_until = v_delay, version = k.version + 1 WHERE k.key = p_key RETURNING k.version INTO v_version;
      PERFORM ${n.notifyFn}(p_key);
    END IF;
  END IF;

  -- Busy: when the key could become free by itself (the first holder's expiry, or the end of the lock-delay).
  v_live_delay := CASE WHEN v_delay > v_now THEN v_delay END;
  v_soonest := CASE WHEN v_first_expiry IS NULL THEN v_live_delay ELSE greatest(v_first_expiry, v_live_delay) END;
  RETURN QUERY SELECT false, NULL::bigint, v_holder,
    CASE WHEN v_soonest IS NULL THEN NULL ELSE greatest(0, ceil(extract(epoch FROM v_soonest - v_now) * 1000))::bigint END,
    v_version, CASE WHEN p_queue THEN v_my_seq END, false;
END
$fn$`,

    // Release by owner and token (I4), in the statement that purges: a holder that expired before
    // its release is purged (its lock-delay starts, I8), not "released".
    `CREATE OR REPLACE FUNCTION ${n.releaseFn}(p_key text, p_owner text, p_token bigint)
RETURNS boolean
LANGUAGE plpgsql SET lock_timeout = '2s' AS $fn$
DECLARE
  v_now timestamptz;
  v_removed bigint;
  v_purged_delay timestamptz;
  v_released boolean;
BEGIN
  PERFORM 1 FROM ${n.keys} k WHERE k.key = p_key FOR UPDATE;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  v_now := clock_timestamp();
  ${purge(n, 'OR (h.owner = p_owner AND h.token = p_token)')}
  IF v_removed > 0 THEN
    UPDATE ${n.keys} k SET delay_until = greatest(k.delay_until, v_purged_delay), version = k.version + 1 WHERE k.key = p_key;
    PERFORM ${n.notifyFn}(p_key);
  END IF;
  RETURN v_released;
END
$fn$`,

    // A waiter that gave up leaves the queue, so the next one need not wait for its place to expire.
    `CREATE OR REPLACE FUNCTION ${n.cancelFn}(p_key text, p_owner text)
RETURNS boolean
LANGUAGE plpgsql SET lock_timeout = '2s' AS $fn$
DECLARE
  v_now timestamptz;
  v_removed bigint;
  v_purged_delay timestamptz;
  v_released boolean;
  v_left boolean;
BEGIN
  PERFORM 1 FROM ${n.keys} k WHERE k.key = p_key FOR UPDATE;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  v_now := clock_timestamp();
  DELETE FROM ${n.waiters} w WHERE w.key = p_key AND w.owner = p_owner;
  v_left := FOUND;
  ${purge(n, '')}
  IF v_left OR v_removed > 0 THEN
    UPDATE ${n.keys} k SET delay_until = greatest(k.delay_until, v_purged_delay), version = k.version + 1 WHERE k.key = p_key;
    PERFORM ${n.notifyFn}(p_key);
  END IF;
  RETURN v_left;
END
$fn$`,

    // A watcher's mark and look (src/postgres/watch.ts). A new mark is written under the key's row
    // lock, which every grant holds until it commits: a grant either committed before the mark (and
    // the state read below, after the lock, sees it) or reads the mark afterwards and NOTIFYs, to a
    // watcher already LISTENing. A mark with more than 5/6 of p_mark_ms left was written moments ago
    // (a look at a holder's expiry right after a renewal of the mark): no write then. Expired marks
    // of the key are deleted on the way. Returns the key's last token, its live holders and the ms
    // until the first of them expires (NULL: none), which the watcher compares between two looks.
    `CREATE OR REPLACE FUNCTION ${n.watchFn}(p_key text, p_watcher text, p_mark_ms bigint)
RETURNS TABLE (last_token bigint, holders bigint, next_expiry_ms bigint)
LANGUAGE plpgsql SET lock_timeout = '2s' AS $fn$
DECLARE
  v_now timestamptz := clock_timestamp();
  v_expires timestamptz;
BEGIN
  SELECT x.expires_at INTO v_expires FROM ${n.watched} x WHERE x.key = p_key AND x.watcher = p_watcher;
  IF v_expires IS NULL OR v_expires <= v_now + p_mark_ms * interval '1 millisecond' * 5 / 6 THEN
    INSERT INTO ${n.keys} (key) VALUES (p_key) ON CONFLICT (key) DO NOTHING;
    PERFORM 1 FROM ${n.keys} k WHERE k.key = p_key FOR KEY SHARE;
    v_now := clock_timestamp();
    DELETE FROM ${n.watched} x WHERE x.key = p_key AND x.expires_at <= v_now AND x.watcher <> p_watcher;
    INSERT INTO ${n.watched} AS x (key, watcher, expires_at) VALUES (p_key, p_watcher, v_now + p_mark_ms * interval '1 millisecond')
      ON CONFLICT (key, watcher) DO UPDATE SET expires_at = EXCLUDED.expires_at;
  END IF;
  v_now := clock_timestamp();
  RETURN QUERY SELECT coalesce((SELECT k.last_token FROM ${n.keys} k WHERE k.key = p_key), 0),
    (SELECT count(*) FROM ${n.holders} h WHERE h.key = p_key AND h.expires_at > v_now),
    (SELECT greatest(0, ceil(extract(epoch FROM min(h.expires_at) - v_now) * 1000))::bigint
       FROM ${n.holders} h WHERE h.key = p_key AND h.expires_at > v_now);
END
$fn$`,

    // A session's keep-alive: the session and every holder bound to it live p_ttl_ms from now (this
    // server's clock, I7), in one call; false when the session is gone (closed, or ran out). FOR
    // UPDATE waits for acquires binding a holder to the session (they hold its row FOR KEY SHARE
    // until they commit); the UPDATE of the holders, a statement of its own, then sees their rows.
    `CREATE OR REPLACE FUNCTION ${n.keepAliveFn}(p_id text, p_ttl_ms bigint)
RETURNS boolean
LANGUAGE plpgsql SET lock_timeout = '2s' AS $fn$
DECLARE
  v_now timestamptz;
  v_expiry timestamptz;
BEGIN
  SELECT s.expires_at INTO v_expiry FROM ${n.sessions} s WHERE s.id = p_id FOR UPDATE;
  v_now := clock_timestamp();
  IF v_expiry IS NULL OR v_expiry <= v_now THEN
    RETURN false;
  END IF;
  v_expiry := v_now + p_ttl_ms * interval '1 millisecond';
  UPDATE ${n.sessions} s SET expires_at = v_expiry WHERE s.id = p_id;
  UPDATE ${n.holders} h SET expires_at = v_expiry WHERE h.session = p_id AND h.expires_at > v_now;
  RETURN true;
END
$fn$`,

    // A session's end. A live session frees its holders at once, as their releases would (no
    // lock-delay), key by key under each key's row lock (in key order, so two ends never wait on
    // each other), purging what else expired there and waking the key's waiters (NOTIFY). A session
    // that already ran out is only deleted: its holders expired with it, and their lock-delay starts
    // when they are purged (I8). Returns whether a live session ended.
    `CREATE OR REPLACE FUNCTION ${n.sessionEndFn}(p_id text)
RETURNS boolean
LANGUAGE plpgsql SET lock_timeout = '2s' AS $fn$
DECLARE
  p_key text;
  v_now timestamptz;
  v_expiry timestamptz;
  v_removed bigint;
  v_purged_delay timestamptz;
  v_released boolean;
BEGIN
  DELETE FROM ${n.sessions} s WHERE s.id = p_id RETURNING s.expires_at INTO v_expiry;
  IF v_expiry IS NULL OR v_expiry <= clock_timestamp() THEN
    RETURN false;
  END IF;
  FOR p_key IN SELECT DISTINCT h.key FROM ${n.holders} h WHERE h.session = p_id ORDER BY 1 LOOP
    PERFORM 1 FROM ${n.keys} k WHERE k.key = p_key FOR UPDATE;
    v_now := clock_timestamp();
    ${purge(n, 'OR h.session = p_id')}
    IF v_removed > 0 THEN
      UPDATE ${n.keys} k SET delay_until = greatest(k.delay_until, v_purged_delay), version = k.version + 1 WHERE k.key = p_key;
      PERFORM ${n.notifyFn}(p_key);
    END IF;
  END LOOP;
  RETURN true;
END
$fn$`,

    `COMMENT ON FUNCTION ${n.acquireFn}(${ACQUIRE_ARGS}) IS ${literal(SCHEMA_VERSION)}`,
  ];
}

/**
 * The DDL of the lease store for `{ schema, table }`, for users who manage schemas themselves: run
 * it once (it is idempotent) with a role that may create tables and functions, then give the
 * backend `createSchema: false`. The backend's own role then needs only SELECT, INSERT, UPDATE and
 * DELETE on the five tables (`<table>`, `<table>_keys`, `<table>_waiters`, `<table>_watched`,
 * `<table>_sessions`) and EXECUTE on the seven functions (`<table>_notify`, `_acquire`, `_release`,
 * `_cancel`, `_watch`, `_keepalive`, `_session_end`). Upgrading a store of an earlier version in
 * place (the same SQL, run again) adds the new tables, columns and index and replaces the functions.
 */
export function postgresSchemaSql(options?: PostgresSchemaOptions): string {
  const o = checkObject(options, 'options');
  checkKnownOptions(o, ['schema', 'table'], 'options');
  return `${schemaStatements(schemaNames(o as PostgresSchemaOptions)).join(';\n\n')};\n`;
}

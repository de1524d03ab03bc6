import { createHash } from 'node:crypto';
import { InvalidArgumentError } from '../core/errors.js';
import { checkKnownOptions, checkObject } from '../core/validate.js';
import { checkPgIdentifier, quotePg } from './util.js';

/**
 * The lease store's schema, as plain SQL: three tables and four functions in one schema. Every
 * operation of the backend is one statement (a function called by one SELECT, or one UPDATE), so
 * it works through any pooler, including PgBouncer in transaction mode.
 *
 * Bump SCHEMA_VERSION whenever the DDL below changes; the backend compares it with the comment on
 * the acquire function to decide whether its DDL has to run.
 */
export const SCHEMA_VERSION = 'leasehold-locks/1';

/** Longest table name: the derived names (`<table>_waiters`, `<table>_acquire`, …) must stay within PostgreSQL's 63 bytes. */
const MAX_TABLE_NAME = 50;

export interface PostgresSchemaOptions {
  /** Schema that holds the tables and functions (created if missing). @default 'public' */
  schema?: string;
  /** Table of current holders; the others are `<table>_keys` and `<table>_waiters`. @default 'leasehold_locks' */
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
  readonly purgeFn: string;
  readonly acquireFn: string;
  readonly releaseFn: string;
  readonly cancelFn: string;
  /** `to_regproc` argument naming the acquire function (the schema version is its comment). */
  readonly acquireRegproc: string;
  /** LISTEN/NOTIFY channel of this lease table; the payload of each notification is the key. */
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
    purgeFn: q('_purge'),
    acquireFn: q('_acquire'),
    releaseFn: q('_release'),
    cancelFn: q('_cancel'),
    acquireRegproc: q('_acquire'),
    // Channel names are identifiers (at most 63 bytes): long schema.table pairs get a digest instead.
    channel: Buffer.byteLength(plainChannel) <= 63 ? plainChannel : `leasehold:${createHash('sha256').update(`${schema}.${table}`).digest('hex').slice(0, 40)}`,
    ddlLock: `leasehold:${schema}.${table}`,
  };
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
  const notify = `PERFORM pg_notify(${literal(n.channel)}, p_key);`;
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
  PRIMARY KEY (key, owner)
)`,

    `CREATE TABLE IF NOT EXISTS ${n.waiters} (
  key text COLLATE "C" NOT NULL,
  owner text NOT NULL,
  mode text NOT NULL CHECK (mode IN ('exclusive', 'shared')),
  seq bigint GENERATED ALWAYS AS IDENTITY,
  expires_at timestamptz NOT NULL,
  PRIMARY KEY (key, owner)
)`,

    // Removes the key's expired holders and expired queue places. Returns how many rows went and the
    // end of the lock-delay that the expired holders start (I8). The caller holds the key row lock.
    `CREATE OR REPLACE FUNCTION ${n.purgeFn}(p_key text, p_now timestamptz, OUT removed integer, OUT delay_until timestamptz)
LANGUAGE plpgsql AS $fn$
DECLARE
  v_waiters integer;
BEGIN
  WITH gone AS (
    DELETE FROM ${n.holders} h WHERE h.key = p_key AND h.expires_at <= p_now
    RETURNING h.expires_at + h.lock_delay_ms * interval '1 millisecond' AS until, h.lock_delay_ms
  )
  SELECT count(*)::integer, max(gone.until) FILTER (WHERE gone.lock_delay_ms > 0) INTO removed, delay_until FROM gone;
  WITH gone AS (DELETE FROM ${n.waiters} w WHERE w.key = p_key AND w.expires_at <= p_now RETURNING 1)
  SELECT count(*)::integer INTO v_waiters FROM gone;
  removed := removed + v_waiters;
END
$fn$`,

    // The whole grant in one call: lock the key's row (created on first use), purge, check
    // compatibility, lock-delay and the queue, then either raise the token and insert the holder in
    // the same transaction (I1, I2), or refresh the caller's place in the queue and say when to retry.
    // Expiry instants come from this server's clock only (I7); the client sends durations.
    `CREATE OR REPLACE FUNCTION ${n.acquireFn}(
  p_key text, p_owner text, p_mode text, p_ttl_ms bigint, p_lock_delay_ms bigint, p_holder text,
  p_queue boolean, p_queue_ttl_ms bigint
) RETURNS TABLE (granted boolean, token bigint, holder text, retry_in_ms bigint, version bigint)
LANGUAGE plpgsql SET lock_timeout = '2s' AS $fn$
DECLARE
  v_now timestamptz;
  v_key record;
  v_purge record;
  v_delay timestamptz;
  v_changed boolean;
  v_token bigint;
  v_version bigint;
  v_my_seq bigint;
  v_free boolean;
  v_clear boolean;
  v_soonest timestamptz;
  v_holder text;
BEGIN
  INSERT INTO ${n.keys} AS k (key) VALUES (p_key) ON CONFLICT (key) DO NOTHING;
  SELECT k.last_token, k.delay_until, k.version INTO v_key FROM ${n.keys} k WHERE k.key = p_key FOR UPDATE;
  v_now := clock_timestamp();
  SELECT * INTO v_purge FROM ${n.purgeFn}(p_key, v_now);
  v_delay := greatest(v_key.delay_until, v_purge.delay_until);
  v_changed := v_purge.removed > 0;

  -- The same owner asking again (a retried request whose answer was lost) gets its own grant back.
  SELECT h.token INTO v_token FROM ${n.holders} h WHERE h.key = p_key AND h.owner = p_owner;
  IF FOUND THEN
    IF v_changed THEN
      UPDATE ${n.keys} k SET delay_until = v_delay, version = k.version + 1 WHERE k.key = p_key;
      ${notify}
    END IF;
    RETURN QUERY SELECT true, v_token, NULL::text, NULL::bigint, NULL::bigint;
    RETURN;
  END IF;

  v_free := (v_delay IS NULL OR v_delay <= v_now) AND NOT EXISTS (
    SELECT 1 FROM ${n.holders} h WHERE h.key = p_key AND (p_mode = 'exclusive' OR h.mode = 'exclusive'));
  IF p_queue THEN
    -- A queued request goes when everyone ahead of it could go with it (shared behind shared).
    SELECT w.seq INTO v_my_seq FROM ${n.waiters} w WHERE w.key = p_key AND w.owner = p_owner;
    v_clear := NOT EXISTS (
      SELECT 1 FROM ${n.waiters} w
      WHERE w.key = p_key AND (v_my_seq IS NULL OR w.seq < v_my_seq) AND w.owner <> p_owner
        AND (p_mode = 'exclusive' OR w.mode = 'exclusive'));
  ELSE
    -- A request that will not wait (tryAcquire) never barges past waiters.
    v_clear := NOT EXISTS (SELECT 1 FROM ${n.waiters} w WHERE w.key = p_key);
  END IF;

  IF v_free AND v_clear THEN
    IF p_queue THEN
      DELETE FROM ${n.waiters} w WHERE w.key = p_key AND w.owner = p_owner;
      -- The next waiter may now be at the head of the queue (shared behind shared).
      v_changed := v_changed OR FOUND;
    END IF;
    UPDATE ${n.keys} k
      SET last_token = k.last_token + 1, delay_until = v_delay,
          version = k.version + CASE WHEN v_changed THEN 1 ELSE 0 END
      WHERE k.key = p_key
      RETURNING k.last_token INTO v_token;
    INSERT INTO ${n.holders} (key, owner, mode, token, holder, acquired_at, expires_at, lock_delay_ms)
      VALUES (p_key, p_owner, p_mode, v_token, p_holder, v_now, v_now + p_ttl_ms * interval '1 millisecond', p_lock_delay_ms);
    IF v_changed THEN
      ${notify}
    END IF;
    RETURN QUERY SELECT true, v_token, NULL::text, NULL::bigint, NULL::bigint;
    RETURN;
  END IF;

  IF p_queue THEN
    INSERT INTO ${n.waiters} AS w (key, owner, mode, expires_at)
      VALUES (p_key, p_owner, p_mode, v_now + p_queue_ttl_ms * interval '1 millisecond')
      ON CONFLICT (key, owner) DO UPDATE SET expires_at = EXCLUDED.expires_at;
  END IF;
  IF v_changed THEN
    UPDATE ${n.keys} k SET delay_until = v_delay, version = k.version + 1 WHERE k.key = p_key RETURNING k.version INTO v_version;
    ${notify}
  ELSE
    v_version := v_key.version;
  END IF;
  SELECT h.holder INTO v_holder FROM ${n.holders} h WHERE h.key = p_key ORDER BY h.token LIMIT 1;
  -- When the key could become free by itself: the first holder's expiry, or the end of the lock-delay.
  SELECT least(CASE WHEN v_delay > v_now THEN v_delay END, min(greatest(h.expires_at, v_delay)))
    INTO v_soonest FROM ${n.holders} h WHERE h.key = p_key;
  RETURN QUERY SELECT false, NULL::bigint, v_holder,
    CASE WHEN v_soonest IS NULL THEN NULL ELSE greatest(0, ceil(extract(epoch FROM v_soonest - v_now) * 1000))::bigint END,
    v_version;
END
$fn$`,

    // Release by owner and token (I4). Expired holders are purged first, so a holder that expired
    // before its release starts its lock-delay (I8) instead of being "released".
    `CREATE OR REPLACE FUNCTION ${n.releaseFn}(p_key text, p_owner text, p_token bigint)
RETURNS boolean
LANGUAGE plpgsql SET lock_timeout = '2s' AS $fn$
DECLARE
  v_purge record;
  v_released boolean;
BEGIN
  PERFORM 1 FROM ${n.keys} k WHERE k.key = p_key FOR UPDATE;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  SELECT * INTO v_purge FROM ${n.purgeFn}(p_key, clock_timestamp());
  DELETE FROM ${n.holders} h WHERE h.key = p_key AND h.owner = p_owner AND h.token = p_token;
  v_released := FOUND;
  IF v_released OR v_purge.removed > 0 THEN
    UPDATE ${n.keys} k SET delay_until = greatest(k.delay_until, v_purge.delay_until), version = k.version + 1 WHERE k.key = p_key;
    ${notify}
  END IF;
  RETURN v_released;
END
$fn$`,

    // A waiter that gave up leaves the queue, so the next one need not wait for its place to expire.
    `CREATE OR REPLACE FUNCTION ${n.cancelFn}(p_key text, p_owner text)
RETURNS boolean
LANGUAGE plpgsql SET lock_timeout = '2s' AS $fn$
DECLARE
  v_purge record;
  v_left boolean;
BEGIN
  PERFORM 1 FROM ${n.keys} k WHERE k.key = p_key FOR UPDATE;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  SELECT * INTO v_purge FROM ${n.purgeFn}(p_key, clock_timestamp());
  DELETE FROM ${n.waiters} w WHERE w.key = p_key AND w.owner = p_owner;
  v_left := FOUND;
  IF v_left OR v_purge.removed > 0 THEN
    UPDATE ${n.keys} k SET delay_until = greatest(k.delay_until, v_purge.delay_until), version = k.version + 1 WHERE k.key = p_key;
    ${notify}
  END IF;
  RETURN v_left;
END
$fn$`,

    `COMMENT ON FUNCTION ${n.acquireFn}(text, text, text, bigint, bigint, text, boolean, bigint) IS ${literal(SCHEMA_VERSION)}`,
  ];
}

/**
 * The DDL of the lease store for `{ schema, table }`, for users who manage schemas themselves: run
 * it once (it is idempotent) with a role that may create tables and functions, then give the
 * backend `createSchema: false`. The backend's own role then needs only SELECT, INSERT, UPDATE and
 * DELETE on the three tables and EXECUTE on the four functions.
 */
export function postgresSchemaSql(options?: PostgresSchemaOptions): string {
  const o = checkObject(options, 'options');
  checkKnownOptions(o, ['schema', 'table'], 'options');
  return `${schemaStatements(schemaNames(o as PostgresSchemaOptions)).join(';\n\n')};\n`;
}

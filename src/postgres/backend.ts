import * as pg from './driver.js';
import type { AcquireRequest, AcquireResult, Backend, KeyState, ReleaseRequest, RenewRequest, RenewResult } from '../core/backend.js';
import { settleWithin } from '../core/call.js';
import { BackendUnavailableError, InvalidArgumentError, LeaseholdError, limitConflict } from '../core/errors.js';
import { checkBoolean, checkInteger, checkKnownOptions, checkObject, describe, type LockMode } from '../core/validate.js';
import { Listener, type ListenConnection } from './listener.js';
import { LIMIT_CONFLICT_STATE, SCHEMA_VERSION, schemaNames, schemaStatements, type PostgresSchemaOptions } from './schema.js';
import { checkPool, createOnce, mapPgError, type PgClient, type PgPool } from './util.js';
import { postgresSessions } from './sessions.js';
import { KeyWatches } from './watch.js';

export interface PostgresBackendOptions extends PostgresSchemaOptions {
  /** A pg connection string; the backend then creates (and on close ends) its own pool. Give this or `pool`. */
  connectionString?: string;
  /** A pg `Pool` you already have (it may sit behind PgBouncer in transaction mode); never ended by `close()`. */
  pool?: PgPool;
  /** Size of the pool created from `connectionString`. @default 10 */
  poolSize?: number;
  /**
   * Create the tables and functions on first use (idempotent, safe when many processes start at
   * once). `false` when you manage schemas yourself: run `postgresSchemaSql()` as a migration. @default true
   */
  createSchema?: boolean;
  /**
   * Wake waiters with LISTEN/NOTIFY (one extra connection per backend instance while someone waits).
   * `false`: waiters poll with backoff. @default true
   */
  listen?: boolean;
  /**
   * Where the LISTEN connection goes. Behind PgBouncer in transaction mode, point this at PostgreSQL
   * itself (or at a session-mode pool): LISTEN does not survive transaction pooling. @default
   * `connectionString`, or else one client checked out of `pool` for as long as someone waits
   */
  listenConnectionString?: string;
  /**
   * Offer sessions: one keep-alive per client and ttl keeps all of its leases (a row in
   * `<table>_sessions` that their holders refer to, expiring by the server's clock), instead of
   * one renewal per lease. `false`: each lease is renewed on its own. @default true
   */
  sessions?: boolean;
}

/** Connecting to a server that does not answer fails after this long, as BackendUnavailableError, instead of hanging. */
const CONNECT_TIMEOUT_MS = 5_000;
/** A statement on our own pool that gets no answer this long is abandoned and its connection destroyed (server hung, network black hole). */
const QUERY_TIMEOUT_MS = 10_000;
/**
 * close() waits this long for the server's goodbye (the end of the LISTEN connection, the pool's
 * end), then drops the sockets: a server that accepts connections and never answers (frozen,
 * a black-holed link) must not keep close(), or the process, waiting.
 */
const CLOSE_TIMEOUT_MS = 2_000;
/** Idle connections of our own pool are closed after this long. */
const IDLE_TIMEOUT_MS = 10_000;
const DEFAULT_POOL_SIZE = 10;
/** application_name of the LISTEN connection (unless the connection string names one): the pool's connections are 'leasehold'. */
const LISTEN_APPLICATION_NAME = 'leasehold-listen';
/** Server errors that mean "this key cannot be stored" (a database whose encoding lacks its characters), not an outage. */
const UNSTORABLE = new Set(['22021', '22P05']);

/**
 * Leases in PostgreSQL. One statement per acquire, renew and release; expiry is judged by the
 * server's clock (I7); each key's token counter lives in the key's row and is raised in the same
 * transaction that inserts the holder, so tokens are as durable as the database (I1). Waiters are
 * served in arrival order and woken by LISTEN/NOTIFY, with core's bounded fallback poll behind it.
 * Sessions (`sessions`, on by default): one keep-alive per client and ttl renews all of its leases.
 * No advisory locks: they are bound to a session, break behind transaction pooling, and have
 * neither ttl nor token.
 */
export function postgresBackend(options: PostgresBackendOptions): Backend {
  const o = checkObject(options, 'options');
  checkKnownOptions(o, ['connectionString', 'pool', 'poolSize', 'schema', 'table', 'createSchema', 'listen', 'listenConnectionString', 'sessions'], 'options');
  if ((o.connectionString === undefined) === (o.pool === undefined)) throw new InvalidArgumentError('options', 'give exactly one of connectionString or pool');
  if (o.connectionString !== undefined && (typeof o.connectionString !== 'string' || o.connectionString.length === 0)) {
    throw new InvalidArgumentError('connectionString', `expected a PostgreSQL connection string, got ${describe(o.connectionString)}`);
  }
  if (o.listenConnectionString !== undefined && (typeof o.listenConnectionString !== 'string' || o.listenConnectionString.length === 0)) {
    throw new InvalidArgumentError('listenConnectionString', `expected a PostgreSQL connection string, got ${describe(o.listenConnectionString)}`);
  }
  if (o.pool !== undefined) checkPool(o.pool, 'pool');
  if (o.poolSize !== undefined && o.pool !== undefined) throw new InvalidArgumentError('poolSize', 'only applies to the pool made from connectionString');
  const poolSize = o.poolSize === undefined ? DEFAULT_POOL_SIZE : checkInteger(o.poolSize, 'poolSize', 1, 1_000);
  const createSchema = o.createSchema === undefined ? true : checkBoolean(o.createSchema, 'createSchema');
  const listen = o.listen === undefined ? true : checkBoolean(o.listen, 'listen');
  if (!listen && o.listenConnectionString !== undefined) throw new InvalidArgumentError('listenConnectionString', 'given with listen: false');
  const withSessions = o.sessions === undefined ? true : checkBoolean(o.sessions, 'sessions');
  const n = schemaNames({ schema: o.schema as string | undefined, table: o.table as string | undefined });

  const ownPool = o.connectionString === undefined ? undefined : makePool(o.connectionString as string, poolSize);
  const pool: PgPool = ownPool ?? (o.pool as PgPool);

  /** Whether the acquire function carries our schema version (its comment); NULL when it does not exist. */
  const SCHEMA_CHECK = `SELECT obj_description(to_regproc($1), 'pg_proc') AS version`;
  const ACQUIRE = `SELECT granted, token::text AS token, holder, retry_in_ms::text AS retry_in_ms, version::text AS version, seq::text AS seq,
      session_lost
    FROM ${n.acquireFn}($1, $2, $3, $4::bigint, $5::bigint, $6, $7::boolean, $8::bigint, $9::integer, $10)`;
  /**
   * Renewal, one statement, only while the holder has not expired by the server's clock (I4, I7):
   * an UPDATE of its expiry; or, for a holder bound to a session, that session's keep-alive (the
   * session and every holder bound to it live ttl from now, as in the memory and Redis backends).
   */
  const RENEW = `WITH own AS (
      UPDATE ${n.holders} SET expires_at = clock_timestamp() + $4::bigint * interval '1 millisecond'
      WHERE key = $1 AND owner = $2 AND token = $3::bigint AND session IS NULL AND expires_at > clock_timestamp()
      RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM own) OR coalesce((
      SELECT ${n.keepAliveFn}(h.session, $4::bigint) FROM ${n.holders} h
      WHERE h.key = $1 AND h.owner = $2 AND h.token = $3::bigint AND h.session IS NOT NULL AND h.expires_at > clock_timestamp()), false) AS renewed`;
  const RELEASE = `SELECT ${n.releaseFn}($1, $2, $3::bigint) AS released`;
  const CANCEL = `SELECT ${n.cancelFn}($1, $2) AS left_queue`;
  /** The key's change counter, compared with a busy answer's cursor when a waiter subscribes. */
  const VERSION = `SELECT version::text AS version FROM ${n.keys} WHERE key = $1`;
  /** Read-only: expired rows are left for the next write to purge, and judged expired here by the server's clock. */
  const INSPECT = `WITH t AS (SELECT clock_timestamp() AS now),
    listed AS (
      SELECT key FROM ${n.holders} WHERE key >= $1 AND starts_with(key, $1)
      UNION SELECT key FROM ${n.waiters} WHERE key >= $1 AND starts_with(key, $1)
      UNION SELECT key FROM ${n.keys}, t WHERE key >= $1 AND starts_with(key, $1) AND delay_until > t.now
    ),
    states AS (
      SELECT k.key, k.last_token,
        (SELECT coalesce(json_agg(json_build_object(
            'mode', h.mode, 'token', h.token::text, 'holder', h.holder,
            'expiresInMs', ceil(extract(epoch FROM h.expires_at - t.now) * 1000)) ORDER BY h.token), '[]'::json)
          FROM ${n.holders} h WHERE h.key = k.key AND h.expires_at > t.now) AS holders,
        (SELECT count(*) FROM ${n.waiters} w WHERE w.key = k.key AND w.expires_at > t.now) AS waiters,
        (SELECT max(h.permit_limit) FROM ${n.holders} h WHERE h.key = k.key AND h.expires_at > t.now AND h.mode = 'shared') AS permit_limit,
        greatest(0, ceil(extract(epoch FROM greatest(k.delay_until,
          (SELECT max(h.expires_at + h.lock_delay_ms * interval '1 millisecond') FROM ${n.holders} h
            WHERE h.key = k.key AND h.expires_at <= t.now AND h.lock_delay_ms > 0)) - t.now) * 1000)) AS delay_ms
      FROM listed JOIN ${n.keys} k USING (key), t
    )
    SELECT key, last_token::text AS last_token, holders, waiters::integer AS waiters, coalesce(delay_ms, 0)::bigint::text AS delay_ms, permit_limit
    FROM states WHERE json_array_length(holders) > 0 OR waiters > 0 OR delay_ms > 0
    ORDER BY key`;

  let closed = false;
  let ready: Promise<void> | undefined;
  const init = (): Promise<void> =>
    (ready ??= (async () => {
      const { rows } = await pool.query(SCHEMA_CHECK, [n.acquireRegproc]);
      const found = rows[0]?.version as string | null | undefined;
      if (found === SCHEMA_VERSION) return;
      if (!createSchema) {
        throw new BackendUnavailableError(
          'postgres',
          `the lease store ${n.holders} is ${found ? `at version ${found}, expected ${SCHEMA_VERSION}` : 'missing'}; ` +
            'apply postgresSchemaSql({ schema, table }) as a migration, or let the backend create it (createSchema: true)',
        );
      }
      const ddl = schemaStatements(n).filter((sql) => n.schema !== 'public' || !sql.startsWith('CREATE SCHEMA'));
      await createOnce(pool, n.ddlLock, ddl); // retries catalog races with other leasehold DDL
    })().catch((error: unknown) => {
      ready = undefined;
      throw mapError('create the lease tables', error);
    }));

  /** One statement on the pool, after the schema check; driver errors become leasehold errors. */
  const query = async (what: string, text: string, values: unknown[]): Promise<Record<string, unknown>[]> => {
    await init();
    try {
      return (await pool.query(text, values)).rows;
    } catch (error) {
      throw mapError(what, error);
    }
  };

  const listener = listen
    ? new Listener({
        channel: n.channel,
        connect: async () => {
          const target = (o.listenConnectionString as string | undefined) ?? (o.connectionString as string | undefined);
          if (target !== undefined) {
            // named apart from the pool's connections, so operators can tell it in pg_stat_activity
            const client = new pg.Client({ ...clientConfig(target), fallback_application_name: LISTEN_APPLICATION_NAME });
            client.on('error', () => {}); // until the listener attaches its own handler
            try {
              await client.connect();
            } catch (error) {
              await client.end().catch(() => {});
              throw error;
            }
            return client as unknown as ListenConnection;
          }
          const client = await pool.connect();
          if (typeof (client as Partial<ListenConnection>).on !== 'function') {
            client.release();
            throw new InvalidArgumentError('pool', 'its clients cannot LISTEN (no event emitter); give listenConnectionString or listen: false');
          }
          return client as unknown as ListenConnection;
        },
        dispose: async (connection) => {
          // Both ways end the connection politely (Terminate, then our FIN) and wait for the server
          // to close its side; a frozen server never does: after CLOSE_TIMEOUT_MS the socket is destroyed.
          const open = socketOf(connection)?.destroyed === false;
          const ended = new Promise<void>((resolve) => (connection as unknown as pg.Client).once('end', () => resolve()));
          if ('release' in connection && typeof (connection as PgClient).release === 'function') {
            // A pool client that has LISTENed is never given back: destroy it, the pool makes a fresh one.
            (connection as unknown as PgClient).release(true);
            if (open) await settleWithin(ended, CLOSE_TIMEOUT_MS);
          } else {
            await settleWithin(Promise.race([ended, (connection as unknown as pg.Client).end()]), CLOSE_TIMEOUT_MS);
          }
          socketOf(connection)?.destroy();
        },
      })
    : undefined;

  /** Backend.watch: LISTEN plus a mark that makes the key's grants NOTIFY (see watch.ts). */
  const watches = listener
    ? new KeyWatches({
        names: n,
        query,
        listen: async (key, onNotify) => {
          try {
            return await listener.add(key, onNotify);
          } catch (error) {
            throw mapError('listen', error);
          }
        },
      })
    : undefined;

  const backend: Backend = {
    name: 'postgres',
    capabilities: Object.freeze({ fair: true, minTtlMs: 0, keepablePlaces: 'all' }),

    async acquire(req: AcquireRequest): Promise<AcquireResult> {
      const limit = req.mode === 'shared' ? (req.limit ?? null) : null;
      await init();
      let r: Record<string, unknown> | undefined;
      try {
        [r] = (
          await pool.query(ACQUIRE, [
            req.key,
            req.owner,
            req.mode,
            req.ttlMs,
            req.lockDelayMs,
            req.holder,
            req.queue,
            req.queueTtlMs,
            limit,
            req.session ?? null,
          ])
        ).rows;
      } catch (error) {
        if (sqlState(error) !== LIMIT_CONFLICT_STATE) throw mapError('acquire', error);
        const detail = (error as { detail?: unknown }).detail;
        const held = typeof detail === 'string' && /^[0-9]+$/.test(detail) ? Number(detail) : undefined;
        throw limitConflict(req.key, held, req.limit, { cause: error });
      }
      if (!r) throw new BackendUnavailableError('postgres', 'acquire returned no row');
      if (r.granted === true) return { granted: true, token: BigInt(r.token as string), ttlMs: req.ttlMs };
      if (r.session_lost === true) return { granted: false, sessionLost: true };
      const busy: { granted: false; holder?: string; retryInMs?: number; cursor?: unknown } = { granted: false };
      if (typeof r.holder === 'string') busy.holder = r.holder;
      if (typeof r.retry_in_ms === 'string') busy.retryInMs = Number(r.retry_in_ms);
      if (listener) busy.cursor = { version: r.version as string, seq: typeof r.seq === 'string' ? BigInt(r.seq) : undefined } satisfies Cursor;
      return busy;
    },

    async renew(req: RenewRequest): Promise<RenewResult> {
      const [r] = await query('renew', RENEW, [req.key, req.owner, req.token.toString(), req.ttlMs]);
      return r?.renewed === true ? { renewed: true, ttlMs: req.ttlMs } : { renewed: false };
    },

    async release(req: ReleaseRequest): Promise<void> {
      await query('release', RELEASE, [req.key, req.owner, req.token.toString()]);
    },

    async cancelWait({ key, owner }) {
      await query('cancel wait', CANCEL, [key, owner]);
    },

    async inspect(prefix: string): Promise<KeyState[]> {
      const rows = await query('inspect', INSPECT, [prefix]);
      return rows.map((r) => ({
        key: r.key as string,
        lastToken: BigInt(r.last_token as string),
        holders: (r.holders as { mode: LockMode; token: string; holder: string; expiresInMs: number }[]).map((h) => ({
          mode: h.mode,
          token: BigInt(h.token),
          holder: h.holder,
          expiresInMs: Math.max(0, Number(h.expiresInMs)),
        })),
        waiters: Number(r.waiters),
        lockDelayRemainingMs: Number(r.delay_ms),
        ...(typeof r.permit_limit === 'number' && { limit: r.permit_limit }),
      }));
    },

    /**
     * Bounded: this instance's watch marks get CLOSE_TIMEOUT_MS to be deleted (else they run out by
     * themselves), then the LISTEN connection and our own pool get as long to end politely, then
     * their sockets are dropped (a statement still in flight on a frozen server is cut by its
     * QUERY_TIMEOUT_MS at the latest). A pool passed in is left open.
     */
    async close() {
      if (closed) return;
      closed = true;
      if (watches) await settleWithin(watches.close(), CLOSE_TIMEOUT_MS);
      await Promise.all([listener?.close(), ownPool ? settleWithin(ownPool.end(), CLOSE_TIMEOUT_MS) : undefined]);
    },
  };

  if (withSessions) backend.sessions = postgresSessions(n, query);
  if (listener) {
    backend.subscribe = async (key: string, onChange: () => void, cursor?: unknown): Promise<() => void> => {
      await init();
      const c = isCursor(cursor) ? cursor : undefined;
      let off: () => void;
      try {
        off = await listener.add(key, onChange, c?.seq);
      } catch (error) {
        throw mapError('listen', error);
      }
      // No lost wake-ups: LISTEN is active now, so any change after this read will be notified; a
      // change between the busy answer and now shows as a different version.
      if (c) {
        try {
          const { rows } = await pool.query(VERSION, [key]);
          if ((rows[0]?.version ?? '0') !== c.version) queueMicrotask(onChange);
        } catch {
          queueMicrotask(onChange); // could not tell: let core look again
        }
      }
      return off;
    };
  }
  if (watches) {
    /**
     * Every NOTIFY of the key (releases, purges, queue changes, and grants while the key is marked
     * watched), from the backend's one LISTEN connection; and looks at the first holder's expiry,
     * which sends no NOTIFY, and every 10 s, told only when the key's holders moved.
     */
    backend.watch = async (key: string, onChange: () => void): Promise<() => void> => {
      await init();
      return watches.watch(key, onChange);
    };
  }
  return backend;
}

/**
 * A pg client's socket, to destroy it after a goodbye the server did not answer (destroy() on a
 * closed socket does nothing). pg has no public call for it; `connection.stream` is the socket pg
 * itself destroys in `end()` when a query is active. Undefined for other clients.
 */
function socketOf(client: unknown): { readonly destroyed: boolean; destroy(): void } | undefined {
  const stream = (client as { connection?: { stream?: { destroyed?: unknown; destroy?: unknown } } } | null)?.connection?.stream;
  return stream && typeof stream.destroy === 'function' && typeof stream.destroyed === 'boolean'
    ? (stream as { destroyed: boolean; destroy(): void })
    : undefined;
}

/** The pool made from a connection string: bounded connect and statement times, so a dead server is an error, not a hang. */
function makePool(connectionString: string, max: number): pg.Pool {
  const pool = new pg.Pool({ ...clientConfig(connectionString), max, idleTimeoutMillis: IDLE_TIMEOUT_MS, allowExitOnIdle: true });
  // An idle connection that breaks (server restart) is reported here; without a listener it would crash the process.
  pool.on('error', () => {});
  return pool;
}

function clientConfig(connectionString: string): pg.ClientConfig {
  return {
    connectionString,
    connectionTimeoutMillis: CONNECT_TIMEOUT_MS,
    query_timeout: QUERY_TIMEOUT_MS,
    keepAlive: true,
    fallback_application_name: 'leasehold',
  };
}

/** A busy answer's position: the key's change counter, and the caller's place in the queue (if queued). */
interface Cursor {
  readonly version: string;
  readonly seq: bigint | undefined;
}

function isCursor(value: unknown): value is Cursor {
  return typeof value === 'object' && value !== null && typeof (value as Cursor).version === 'string';
}

function sqlState(error: unknown): string | undefined {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === 'string' ? code : undefined;
}

function mapError(what: string, error: unknown): LeaseholdError {
  if (error instanceof LeaseholdError) return error;
  if (UNSTORABLE.has(sqlState(error) ?? '')) {
    return new InvalidArgumentError('key', `the database cannot store it (${sqlState(error)}): ${(error as Error).message}`, { cause: error });
  }
  return mapPgError(what, error);
}

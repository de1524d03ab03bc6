import { InvalidArgumentError, StaleTokenError } from '../core/errors.js';
import { transactionControl } from '../core/fence.js';
import type { IdempotencyRecord, TransactionalIdempotencyStore } from '../core/idempotency.js';
import { checkKey, checkKnownOptions, checkObject, describe } from '../core/validate.js';
import { withGuardedTransaction } from './transaction.js';
import { checkPgIdentifier, checkPool, createOnce, mapPgError, quotePg, type PgClient, type PgPool } from './util.js';

export interface PostgresIdempotencyStoreOptions {
  /** Schema of the records table (created if missing). @default 'public' */
  schema?: string;
  /** Table of records (created on first use). @default 'leasehold_idempotency' */
  table?: string;
}

/** Expired rows purged by one put, so a put never pays for a long backlog. */
const PURGE_BATCH = 64;

/**
 * Idempotency records in PostgreSQL, one row per key. The row is also the key's fence: its `token`
 * is the highest token that wrote for the key, and every write is one upsert that changes the row
 * only when stored <= token (I3; the row lock serialises writers of a key), so a zombie attempt's
 * late write is refused (StaleTokenError) and changes nothing. Giving a key back (fn threw) keeps
 * the row, with no state, for its mark.
 *
 * Every row expires keepMs after its last write, by the server's clock (`now()`, I7): `get` no
 * longer sees it, and each put purges up to 64 expired rows of other keys in the same statement
 * (`FOR UPDATE SKIP LOCKED`: it never waits). The mark goes with the row: an attempt that wakes more
 * than keepMs (default 24 h) after the key's last write is no longer refused.
 *
 * `transact` (for `runInTransaction`) runs `effect(client)` in one transaction on one pooled
 * client and writes the completed record last, fenced, in the same transaction: a refusal or an
 * error rolls the effect back with it. The record's row is not locked while `effect` runs (a
 * first look skips an effect that is already stale), so an attempt paused inside its transaction
 * does not stop the one that takes over, and is refused whole when it wakes. `effect` gets a
 * guarded view of the client that refuses BEGIN, COMMIT, ROLLBACK, `release()` and `end()`.
 */
export function postgresIdempotencyStore(pool: PgPool, options?: PostgresIdempotencyStoreOptions): TransactionalIdempotencyStore<PgClient> {
  checkPool(pool, 'pool');
  const o = checkObject(options, 'options');
  checkKnownOptions(o, ['schema', 'table'], 'options');
  const schema = checkPgIdentifier(o.schema ?? 'public', 'schema');
  const tableName = checkPgIdentifier(o.table ?? 'leasehold_idempotency', 'table');
  const table = `${quotePg(schema)}.${quotePg(tableName)}`;

  const CREATE_SCHEMA = `CREATE SCHEMA IF NOT EXISTS ${quotePg(schema)}`;
  const CREATE = `CREATE TABLE IF NOT EXISTS ${table} (
    key text PRIMARY KEY,
    token bigint NOT NULL CHECK (token > 0),
    state text CHECK (state IN ('in-progress', 'completed')),
    payload_hash text NOT NULL DEFAULT '',
    value text,
    expires_at timestamptz NOT NULL
  )`;
  const INDEX = `CREATE INDEX IF NOT EXISTS ${quotePg(`${tableName.slice(0, 50)}_expires_at`)} ON ${table} (expires_at)`;
  /** A live record: a state (not given back) and not expired. */
  const GET = `SELECT token, state, payload_hash, value FROM ${table} WHERE key = $1 AND state IS NOT NULL AND expires_at > now()`;
  const MARK = `SELECT token FROM ${table} WHERE key = $1`;
  /**
   * Purges a batch of other keys' expired rows, then writes the record (state NULL: given back)
   * only when stored <= token: no row returned means refused.
   */
  const UPSERT = `WITH purged AS (
      DELETE FROM ${table} WHERE key IN (
        SELECT key FROM ${table} WHERE expires_at <= now() AND key <> $1 LIMIT ${PURGE_BATCH} FOR UPDATE SKIP LOCKED))
    INSERT INTO ${table} AS r (key, token, state, payload_hash, value, expires_at)
    VALUES ($1, $2, $3, $4, $5, now() + $6::double precision * interval '1 millisecond')
    ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token, state = EXCLUDED.state, payload_hash = EXCLUDED.payload_hash,
      value = EXCLUDED.value, expires_at = EXCLUDED.expires_at
    WHERE r.token <= EXCLUDED.token
    RETURNING token`;

  /** UPSERT, except that a live completed record is left as it is (the claim then replays it). */
  const CLAIM = UPSERT.replace(
    'WHERE r.token <= EXCLUDED.token',
    "WHERE r.token <= EXCLUDED.token AND (r.state IS DISTINCT FROM 'completed' OR r.expires_at <= now())",
  );

  let ready: Promise<void> | undefined;
  const ensure = (): Promise<void> =>
    (ready ??= createOnce(pool, `leasehold:${schema}.${tableName}`, schema === 'public' ? [CREATE, INDEX] : [CREATE_SCHEMA, CREATE, INDEX]).catch(
      (error: unknown) => {
        ready = undefined;
        throw mapPgError('create idempotency table', error);
      },
    ));

  const params = (key: string, token: bigint, record: IdempotencyRecord | undefined, keepMs: number): unknown[] => [
    key,
    token.toString(),
    record?.state ?? null,
    record?.payloadHash ?? '',
    record?.value ?? null,
    Math.round(keepMs),
  ];
  /** The refusal of a write under token: the mark that refused it, read after. */
  const stale = async (db: PgPool | PgClient, key: string, token: bigint): Promise<StaleTokenError> => {
    const { rows } = await db.query(MARK, [key]);
    return new StaleTokenError(`idempotency:${key}`, token, rows.length === 0 ? token : BigInt(rows[0]!.token as string));
  };

  return {
    async get(key) {
      checkKey(key, 'key');
      await ensure();
      try {
        const { rows } = await pool.query(GET, [key]);
        const row = rows[0];
        if (!row) return undefined;
        return {
          state: row.state as IdempotencyRecord['state'],
          token: BigInt(row.token as string),
          payloadHash: row.payload_hash as string,
          ...(row.value === null ? {} : { value: row.value as string }),
        };
      } catch (error) {
        throw mapPgError('idempotency read', error);
      }
    },

    async claim(key, token, record, keepMs) {
      checkKey(key, 'key');
      await ensure();
      let refused: StaleTokenError | undefined;
      try {
        const written = await pool.query(CLAIM, params(key, token, record, keepMs));
        if (written.rowCount === 1) return undefined;
        // Not written: a live completed record (replayed), or a newer token (refused).
        const { rows } = await pool.query(GET, [key]);
        const row = rows[0];
        if (row?.state === 'completed') {
          return {
            state: 'completed',
            token: BigInt(row.token as string),
            payloadHash: row.payload_hash as string,
            ...(row.value === null ? {} : { value: row.value as string }),
          };
        }
        refused = await stale(pool, key, token);
      } catch (error) {
        throw mapPgError('idempotency claim', error);
      }
      throw refused;
    },

    async put(key, token, record, keepMs) {
      checkKey(key, 'key');
      await ensure();
      let refused: StaleTokenError | undefined;
      try {
        const written = await pool.query(UPSERT, params(key, token, record, keepMs));
        if (written.rowCount === 0) refused = await stale(pool, key, token);
      } catch (error) {
        throw mapPgError('idempotency write', error);
      }
      if (refused) throw refused;
    },

    async transact<R>(
      key: string,
      token: bigint,
      effect: (tx: PgClient) => R | Promise<R>,
      complete: (result: R) => IdempotencyRecord,
      keepMs: number,
    ): Promise<R> {
      checkKey(key, 'key');
      if (typeof effect !== 'function') throw new InvalidArgumentError('effect', `expected a function, got ${describe(effect)}`);
      await ensure();
      return withGuardedTransaction(
        pool,
        {
          refuse: refusePg,
          beginWhat: 'begin',
          aborted: () => new InvalidArgumentError('effect', 'a statement inside fn failed and aborted the transaction; nothing was committed'),
        },
        async ({ client, user, own }) => {
          // A first look: an attempt already taken over does not run its effect at all.
          const { rows } = await own('idempotency read', () => client.query(MARK, [key]));
          if (rows.length > 0 && BigInt(rows[0]!.token as string) > token)
            throw new StaleTokenError(`idempotency:${key}`, token, BigInt(rows[0]!.token as string));
          const result = await user(effect);
          const record = complete(result);
          // The fence, last: the row is locked from here to COMMIT only.
          let written: Awaited<ReturnType<PgClient['query']>>;
          try {
            written = await client.query(UPSERT, params(key, token, record, keepMs));
          } catch (error) {
            if ((error as { code?: unknown } | null)?.code === '25P02')
              throw new InvalidArgumentError('effect', 'a statement inside fn failed and aborted the transaction; nothing was committed', { cause: error });
            throw mapPgError('idempotency write', error);
          }
          if (written.rowCount === 0) throw await own('idempotency read', () => stale(client, key, token));
          return result;
        },
      );
    },
  };
}

/** What the effect must not do with the pooled client: end or open the transaction, release or close the client. */
function refusePg(method: string, args: unknown[]): string | undefined {
  if (method === 'release' || method === 'end' || method === 'connect') {
    return `fn called ${method}() on the idempotency transaction's pooled client; the store releases it after COMMIT (refused; rolled back)`;
  }
  if (method === 'query') {
    const q = args[0] as { text?: unknown } | string | null | undefined;
    const text = typeof q === 'string' ? q : typeof q === 'object' && q !== null && typeof q.text === 'string' ? q.text : undefined;
    const statement = text === undefined ? undefined : transactionControl(text);
    if (statement !== undefined) return `fn ran ${statement} inside the idempotency transaction, which commits or rolls back itself (refused; rolled back)`;
  }
  return undefined;
}

import { BackendUnavailableError, InvalidArgumentError, LeaseholdError } from '../core/errors.js';
import { describe } from '../core/validate.js';

/** The few methods of a pg `PoolClient` that leasehold calls (typed structurally). */
export interface PgClient {
  query(text: string, values?: unknown[]): Promise<{ rows: Record<string, unknown>[]; rowCount: number | null; command?: string }>;
  release(destroy?: boolean | Error): void;
  /** pg clients are event emitters: a checked-out client reports a dropped connection as an 'error' event. */
  on?(event: 'error', listener: (error: Error) => void): unknown;
  removeListener?(event: 'error', listener: (error: Error) => void): unknown;
}

/** The few methods of a pg `Pool` that leasehold calls. */
export interface PgPool {
  connect(): Promise<PgClient>;
  query(text: string, values?: unknown[]): Promise<{ rows: Record<string, unknown>[]; rowCount: number | null }>;
}

const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_$]{0,62}$/;

export function checkPgIdentifier(value: unknown, argument: string): string {
  if (typeof value !== 'string' || !IDENTIFIER.test(value)) {
    throw new InvalidArgumentError(argument, `expected a SQL identifier (letters, digits, _, $; at most 63), got ${describe(value)}`);
  }
  return value;
}

/** Quotes an identifier for PostgreSQL (names are validated too; quoting keeps case and reserved words safe). */
export function quotePg(name: string): string {
  return `"${name.replace(/"/g, '""')}"`;
}

export function checkPool(value: unknown, argument: string): PgPool {
  const p = value as PgPool | null;
  if (typeof p !== 'object' || p === null || typeof p.connect !== 'function' || typeof p.query !== 'function') {
    throw new InvalidArgumentError(argument, `expected a pg Pool (connect, query), got ${describe(value)}`);
  }
  return p;
}

/**
 * Driver and server failures become BackendUnavailableError, classified by SQLSTATE class or the
 * Node error code, never by message text. The original error is kept as `cause`.
 */
export function mapPgError(what: string, error: unknown): LeaseholdError {
  if (error instanceof LeaseholdError) return error;
  const e = error as { code?: unknown; message?: unknown } | null;
  const code = typeof e?.code === 'string' ? e.code : undefined;
  const message = typeof e?.message === 'string' ? e.message : String(error);
  return new BackendUnavailableError('postgres', `${what} failed${code ? ` (${code})` : ''}: ${message}`, { cause: error });
}

/**
 * A pg client checked out of a pool has no 'error' listener: if its connection drops between two
 * queries (a server restart), the 'error' event would crash the process. Listens while the client
 * is out; `onError` learns that the connection is broken (release it with the error to destroy it).
 * Returns the function that stops listening, to call before `release`.
 */
export function guardClient(client: PgClient, onError: (error: Error) => void): () => void {
  if (typeof client.on !== 'function') return () => {};
  client.on('error', onError);
  return () => client.removeListener?.('error', onError);
}

/**
 * Runs `fn` in one transaction on one pooled client: BEGIN, `fn(client)`, COMMIT; ROLLBACK and
 * rethrow on error. A client whose connection broke (an 'error' event, a failed ROLLBACK) is
 * destroyed rather than returned to the pool.
 */
export async function withTransaction<T>(pool: PgPool, fn: (client: PgClient) => Promise<T>): Promise<T> {
  const client = await pool.connect();
  let broken: Error | undefined;
  const unguard = guardClient(client, (e) => {
    broken = e;
  });
  try {
    await client.query('BEGIN');
    const result = await fn(client);
    await client.query('COMMIT');
    return result;
  } catch (error) {
    await client.query('ROLLBACK').catch((e: Error) => {
      broken = e;
    });
    throw error;
  } finally {
    unguard();
    client.release(broken);
  }
}

/**
 * Catalog races between processes creating different leasehold objects in one new schema (their
 * advisory locks differ, their CREATE SCHEMA IF NOT EXISTS collide): trying again succeeds.
 */
const DDL_RACES = new Set(['23505', '42P06', '42P07', '42710', '42723']);
/** Attempts of one DDL run before a catalog race is reported. */
const DDL_ATTEMPTS = 3;

/**
 * Runs DDL once per process and target under a transaction-scoped advisory lock, so concurrent
 * first uses of one target do not race in the catalog; a race with another target's DDL (see
 * DDL_RACES) is retried.
 */
export async function createOnce(pool: PgPool, lockName: string, statements: string[]): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    try {
      await withTransaction(pool, async (client) => {
        await client.query('SELECT pg_advisory_xact_lock(hashtext($1))', [lockName]);
        for (const sql of statements) await client.query(sql);
      });
      return;
    } catch (error) {
      const code = (error as { code?: unknown } | null)?.code;
      if (attempt >= DDL_ATTEMPTS || typeof code !== 'string' || !DDL_RACES.has(code)) throw error;
    }
  }
}

import { BackendUnavailableError, InvalidArgumentError, LeaseholdError } from '../core/errors.js';
import { describe } from '../core/validate.js';

/** The few methods of a `mysql2/promise` pool connection that leasehold calls (typed structurally). */
export interface MysqlConnection {
  query(sql: string, values?: unknown): Promise<[unknown, unknown]>;
  execute?(sql: string, values?: unknown): Promise<[unknown, unknown]>;
  release(): void;
  /** Ends the connection for good (a broken one must not go back to the pool). */
  destroy?(): void;
  readonly threadId?: number | null;
}

/** The few methods of a `mysql2/promise` Pool that leasehold calls. */
export interface MysqlPool {
  getConnection(): Promise<MysqlConnection>;
  query(sql: string, values?: unknown): Promise<[unknown, unknown]>;
}

/** A server status flag in every OK packet: the connection is inside a transaction (SERVER_STATUS_IN_TRANS). */
export const SERVER_STATUS_IN_TRANS = 0x0001;

/** Server errors after which the same statement, run again, may well succeed: the transaction was rolled back or timed out waiting. */
export const RETRYABLE = new Set(['ER_LOCK_DEADLOCK', 'ER_LOCK_WAIT_TIMEOUT']);

const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_$]{0,63}$/;

export function checkMysqlIdentifier(value: unknown, argument: string): string {
  if (typeof value !== 'string' || !IDENTIFIER.test(value)) {
    throw new InvalidArgumentError(argument, `expected a SQL identifier (letters, digits, _, $; at most 64), got ${describe(value)}`);
  }
  return value;
}

/** Quotes an identifier for MySQL / MariaDB (names are validated too; quoting keeps reserved words safe). */
export function quoteMysql(name: string): string {
  return `\`${name.replace(/`/g, '``')}\``;
}

export function checkPool(value: unknown, argument: string): MysqlPool {
  const p = value as MysqlPool | null;
  if (typeof p !== 'object' || p === null || typeof p.getConnection !== 'function' || typeof p.query !== 'function') {
    throw new InvalidArgumentError(argument, `expected a mysql2/promise Pool (getConnection, query), got ${describe(value)}`);
  }
  return p;
}

/** The driver's error code (`ER_LOCK_DEADLOCK`, `ECONNREFUSED`, …), if any. */
export function mysqlCode(error: unknown): string | undefined {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === 'string' ? code : undefined;
}

/**
 * Driver and server failures become BackendUnavailableError, classified by the driver's error code,
 * never by message text. The original error is kept as `cause`.
 */
export function mapMysqlError(what: string, error: unknown): LeaseholdError {
  if (error instanceof LeaseholdError) return error;
  const code = mysqlCode(error);
  const message = typeof (error as { message?: unknown } | null)?.message === 'string' ? (error as Error).message : String(error);
  return new BackendUnavailableError('mysql', `${what} failed${code ? ` (${code})` : ''}: ${message}`, { cause: error });
}

import { readFileSync } from 'node:fs';
import { BackendUnavailableError, InvalidArgumentError } from '../core/errors.js';
import { describe } from '../core/validate.js';

/** The few methods of a better-sqlite3 `Database` that leasehold calls (typed structurally). */
export interface SqliteDatabase {
  prepare(source: string): SqliteStatement;
  exec(source: string): unknown;
  pragma(source: string, options?: { simple?: boolean }): unknown;
  // biome-ignore lint/suspicious/noExplicitAny: matches better-sqlite3's own variadic typing
  transaction(fn: (...args: any[]) => any): { (...args: any[]): any; immediate(...args: any[]): any; deferred(...args: any[]): any };
  close(): unknown;
  readonly open: boolean;
  readonly inTransaction: boolean;
  readonly name: string;
}

export interface SqliteStatement {
  run(...params: unknown[]): { changes: number };
  get(...params: unknown[]): unknown;
  all(...params: unknown[]): unknown[];
  safeIntegers(toggle?: boolean): SqliteStatement;
}

/** SQL identifiers we accept for table names: plain names, quoted anyway. */
const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_]{0,62}$/;

export function checkIdentifier(value: unknown, argument: string): string {
  if (typeof value !== 'string' || !IDENTIFIER.test(value)) {
    throw new InvalidArgumentError(argument, `expected a SQL identifier (letters, digits, _; at most 63), got ${describe(value)}`);
  }
  return value;
}

export function quoteIdent(name: string): string {
  return `"${name.replace(/"/g, '""')}"`;
}

/** SQLite result codes that mean "someone else holds the write lock right now". */
function isBusy(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  return code === 'SQLITE_BUSY' || code === 'SQLITE_BUSY_SNAPSHOT' || code === 'SQLITE_LOCKED' || code === 'SQLITE_BUSY_TIMEOUT';
}

export function isSqliteError(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === 'string' && code.startsWith('SQLITE_');
}

/**
 * Runs a synchronous SQLite operation, retrying asynchronously while the database is busy (another
 * process is writing). The connection's own busy timeout is kept short so the event loop is never
 * blocked for long; the retries here yield to it. Gives up after `budgetMs`.
 */
export async function retryBusy<T>(what: string, op: () => T, budgetMs = 5_000): Promise<T> {
  const start = performance.now();
  for (let attempt = 0; ; attempt++) {
    try {
      return op();
    } catch (error) {
      if (!isBusy(error)) throw error;
      if (performance.now() - start > budgetMs) {
        throw new BackendUnavailableError('sqlite', `${what}: database stayed locked for ${budgetMs} ms`, { cause: error });
      }
      await new Promise((r) => setTimeout(r, Math.random() * Math.min(50, 2 ** attempt)));
    }
  }
}

/**
 * The clock the coordinator judges expiry by on one machine: the kernel's monotonic clock, which
 * every process on the machine shares and which NTP does not step, tagged with the boot id so a
 * row written before a reboot (when the clock restarted) reads as expired, never as far in the
 * future. Off Linux there is no boot id to read; the wall clock is used instead.
 */
export interface MachineClock {
  /** Milliseconds; comparable between processes of this machine within one `epoch`. */
  now(): number;
  /** Changes when `now` restarts (a reboot). */
  readonly epoch: string;
}

export function checkMachineClock(value: unknown, argument = 'clock'): MachineClock {
  const c = value as MachineClock | null;
  if (typeof c !== 'object' || c === null || typeof c.now !== 'function' || typeof c.epoch !== 'string') {
    throw new InvalidArgumentError(argument, `expected { now(), epoch: string }, got ${describe(value)}`);
  }
  return c;
}

let cachedMachineClock: MachineClock | undefined;

export function machineClock(): MachineClock {
  if (cachedMachineClock) return cachedMachineClock;
  let bootId: string | undefined;
  try {
    bootId = readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();
  } catch {
    bootId = undefined;
  }
  cachedMachineClock = bootId ? { now: () => Number(process.hrtime.bigint() / 1_000_000n), epoch: `boot:${bootId}` } : { now: () => Date.now(), epoch: 'wall' };
  return cachedMachineClock;
}

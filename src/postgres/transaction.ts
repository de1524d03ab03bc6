import { guardHandle } from '../core/fence.js';
import { guardClient, mapPgError, type PgClient, type PgPool } from './util.js';

/** How one store runs a transaction around a user's function (the fence's `mutate`, the idempotency store's `effect`). */
export interface GuardedTransactionOptions {
  /** What the user's function may not do with the pooled client: the refusal's message, or undefined to let the call through. */
  readonly refuse: (method: string, args: unknown[]) => string | undefined;
  /** Opens the transaction (one round trip). @default 'BEGIN' */
  readonly begin?: string;
  /** Names a failed `begin` for mapPgError. */
  readonly beginWhat: string;
  /** Ends the transaction; its last answer is what was done. @default 'COMMIT' */
  readonly commit?: string;
  /** Why `commit` failed; runs while the client is still checked out, before the ROLLBACK. @default mapPgError('commit') */
  readonly commitFailed?: (client: PgClient, error: unknown) => Promise<Error>;
  /** The error when `commit` answers ROLLBACK: a failed statement of the user's function aborted the transaction. */
  readonly aborted: () => Error;
}

/** What the store's body gets: the client for its own statements, and the guarded view for the user's function. */
export interface GuardedTransaction {
  /** The pooled client itself, for the store's own statements. */
  readonly client: PgClient;
  /**
   * Runs the user's function on the guarded view of the client; its result or error reaches the
   * caller unchanged. The view refuses every call once it settles, and a refusal the function caught
   * is thrown all the same (rolled back).
   */
  user<R>(fn: (tx: PgClient) => R | Promise<R>): Promise<R>;
  /** One of the store's own statements: its failure is mapped by mapPgError(what). */
  own<T>(what: string, op: () => Promise<T>): Promise<T>;
}

/** Refused calls whose API is asynchronous: refused with a rejected promise. */
const PG_ASYNC: ReadonlySet<string> = new Set(['query', 'end', 'connect']);

/**
 * Runs `body` in one transaction on one pooled client: `begin`, `body`, `commit`; ROLLBACK and
 * rethrow on error (a refusal of the guarded view first). A connection that drops mid-transaction
 * (server restart) does not crash the process, and a client whose connection broke (an 'error'
 * event, a failed ROLLBACK) is destroyed rather than returned to the pool.
 */
export async function withGuardedTransaction<R>(pool: PgPool, options: GuardedTransactionOptions, body: (tx: GuardedTransaction) => Promise<R>): Promise<R> {
  let client: PgClient;
  try {
    client = await pool.connect();
  } catch (error) {
    throw mapPgError('connect', error);
  }
  let broken: Error | undefined;
  let inTx = false;
  const unguard = guardClient(client, (e) => {
    broken = e;
  });
  const guard = guardHandle(client, options.refuse, PG_ASYNC);
  const tx: GuardedTransaction = {
    client,
    async user<T>(fn: (tx: PgClient) => T | Promise<T>): Promise<T> {
      let result: T;
      try {
        result = await fn(guard.handle);
      } finally {
        guard.revoke();
      }
      if (guard.misuse) throw guard.misuse; // the function caught the refusal: roll back all the same
      return result;
    },
    own,
  };
  try {
    await own(options.beginWhat, () => client.query(options.begin ?? 'BEGIN'));
    inTx = true;
    const result = await body(tx);
    let committed: unknown;
    try {
      committed = await client.query(options.commit ?? 'COMMIT');
      inTx = false;
    } catch (error) {
      throw options.commitFailed ? await options.commitFailed(client, error) : mapPgError('commit', error);
    }
    // COMMIT of a transaction that a failed statement of the user's function aborted answers ROLLBACK, not an error.
    const last = (Array.isArray(committed) ? committed[committed.length - 1] : committed) as { command?: string } | undefined;
    if (last?.command === 'ROLLBACK') throw options.aborted();
    return result;
  } catch (error) {
    if (inTx) {
      await client.query('ROLLBACK').catch((e: Error) => {
        broken = e;
      });
    }
    throw guard.misuse ?? error;
  } finally {
    guard.revoke();
    unguard();
    client.release(broken);
  }
}

/** Errors of the store's own statements; the user's function's reach the caller unchanged. */
async function own<T>(what: string, op: () => Promise<T>): Promise<T> {
  try {
    return await op();
  } catch (error) {
    throw mapPgError(what, error);
  }
}

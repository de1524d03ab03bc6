import { InvalidArgumentError, PartialWriteError, StaleTokenError } from '../core/errors.js';
import { FENCE_GUARD_OPTIONS, fenceTokenCheck, transactionControl, type Fence, type FenceGuardOptions } from '../core/fence.js';
import type { TokenInput } from '../core/token.js';
import { checkKey, checkKnownOptions, checkObject, describe } from '../core/validate.js';
import { withGuardedTransaction } from './transaction.js';
import { checkPgIdentifier, checkPool, createOnce, mapPgError, quotePg, type PgClient, type PgPool } from './util.js';

export interface PostgresFenceOptions extends FenceGuardOptions {
  /** Schema of the high-water mark table (created if missing). @default 'public' */
  schema?: string;
  /** Table of high-water marks. @default 'leasehold_fences' */
  table?: string;
}

/**
 * A fence for data in PostgreSQL. Each `write` takes one pooled client and runs one transaction:
 * the resource's mark is raised only when stored <= token (the row lock then serialises every
 * writer of that resource until commit), `mutate(client)` runs in the same transaction, and a
 * refusal or an error in `mutate` rolls everything back.
 *
 * `mutate` gets a guarded view of the client: `release()`, `end()` and statements that end or open
 * a transaction (COMMIT, END, ROLLBACK but ROLLBACK TO, ABORT, BEGIN, START TRANSACTION, PREPARE
 * TRANSACTION) are refused with InvalidArgumentError naming `mutate`, and the write is rolled back
 * even if `mutate` caught the error; after `write` settles the view refuses every call (the client
 * is back in the pool). `mutate` runs inside a savepoint that the fence releases in the same round
 * trip as its COMMIT, so a ROLLBACK or COMMIT hidden in a multi-statement string is found before
 * anything more is committed: a rollback (with or without a new BEGIN) is InvalidArgumentError,
 * nothing committed; a commit is PartialWriteError (the mark and what `mutate` ran before its
 * COMMIT were committed together).
 */
export function postgresFence(pool: PgPool, options?: PostgresFenceOptions): Fence<PgClient> {
  checkPool(pool, 'pool');
  const o = checkObject(options, 'options');
  checkKnownOptions(o, ['schema', 'table', ...FENCE_GUARD_OPTIONS], 'options');
  const readToken = fenceTokenCheck(o);
  const schema = checkPgIdentifier(o.schema ?? 'public', 'schema');
  const tableName = checkPgIdentifier(o.table ?? 'leasehold_fences', 'table');
  const table = `${quotePg(schema)}.${quotePg(tableName)}`;

  const CREATE_SCHEMA = `CREATE SCHEMA IF NOT EXISTS ${quotePg(schema)}`;
  const CREATE = `CREATE TABLE IF NOT EXISTS ${table} (
    resource text PRIMARY KEY,
    token bigint NOT NULL CHECK (token > 0),
    updated_at timestamptz NOT NULL DEFAULT now()
  )`;
  /** Opens the transaction and the savepoint `mutate` runs in (one round trip, simple protocol). */
  const BEGIN = `BEGIN; SAVEPOINT ${SAVEPOINT}`;
  /** Raises the mark only when stored <= token (I3); no row returned means refused. `before` is the mark it replaced. */
  const RAISE = `WITH old AS (SELECT token FROM ${table} WHERE resource = $1)
    INSERT INTO ${table} AS f (resource, token) VALUES ($1, $2)
    ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token, updated_at = now() WHERE f.token <= EXCLUDED.token
    RETURNING token, (SELECT token FROM old) AS before`;
  /**
   * Fails (and skips the COMMIT) unless the transaction is still the fence's: 25P02 when a
   * statement of mutate failed, 3B001 when mutate ended the transaction and began another, 25P01
   * when it ended it.
   */
  const COMMIT = `RELEASE SAVEPOINT ${SAVEPOINT}; COMMIT`;
  const SELECT = `SELECT token FROM ${table} WHERE resource = $1`;

  /**
   * Why the fence's RELEASE + COMMIT failed. Runs its statements on `client` while the write still
   * has it; the caller rolls back afterwards (a ROLLBACK outside a transaction only warns).
   */
  const commitFailed = async (client: PgClient, resource: string, t: bigint, before: bigint | undefined, error: unknown): Promise<Error> => {
    switch ((error as { code?: unknown } | null)?.code) {
      case '25P02':
        return new InvalidArgumentError('mutate', 'a statement inside mutate failed and aborted the transaction; nothing was committed', { cause: error });
      case '3B001':
        return new InvalidArgumentError(
          'mutate',
          'mutate ended the fenced transaction and began another (a ROLLBACK or COMMIT inside a multi-statement string?); it was rolled back, nothing of it committed',
          { cause: error },
        );
      case '25P01': {
        // mutate ended the transaction itself: committed (the mark is there) or rolled back (it is not)
        let mark: bigint | undefined;
        try {
          const { rows } = await client.query(SELECT, [resource]);
          mark = rows.length === 0 ? undefined : BigInt(rows[0]!.token as string);
        } catch (e) {
          return mapPgError('read mark', e);
        }
        if (mark === t) {
          const maybe = before === t ? 'committed (or rolled back: the mark was already at this token)' : 'committed';
          return new PartialWriteError(
            resource,
            t,
            `mutate ended the fenced transaction itself (a COMMIT inside a multi-statement string?): it was ${maybe} with whatever mutate ran before that; the rest of mutate ran outside the fence`,
            { cause: error },
          );
        }
        return new InvalidArgumentError(
          'mutate',
          'mutate rolled back the fenced transaction itself (a ROLLBACK inside a multi-statement string?); the mark was not raised and nothing the fence ran was committed',
          { cause: error },
        );
      }
      default:
        return mapPgError('commit', error);
    }
  };

  let ready: Promise<void> | undefined;
  const ensure = (): Promise<void> =>
    (ready ??= createOnce(pool, `leasehold:${schema}.${tableName}`, schema === 'public' ? [CREATE] : [CREATE_SCHEMA, CREATE]).catch((error: unknown) => {
      ready = undefined;
      throw mapPgError('create fence table', error);
    }));

  return {
    async write<R>(resource: string, token: TokenInput, mutate: (tx: PgClient) => R | Promise<R>, writeOptions?: unknown): Promise<R> {
      checkKey(resource, 'resource');
      const t = readToken(resource, token, writeOptions);
      if (typeof mutate !== 'function') throw new InvalidArgumentError('mutate', `expected a function, got ${describe(mutate)}`);
      await ensure();
      let before: bigint | undefined;
      return withGuardedTransaction(
        pool,
        {
          refuse: refusePg,
          begin: BEGIN,
          beginWhat: 'fence check',
          commit: COMMIT,
          commitFailed: (client, error) => commitFailed(client, resource, t, before, error),
          aborted: () => new InvalidArgumentError('mutate', 'a statement inside mutate failed and aborted the transaction; nothing was committed'),
        },
        async ({ client, user }) => {
          try {
            const raised = await client.query(RAISE, [resource, t.toString()]);
            if (raised.rowCount === 0) {
              const { rows } = await client.query(SELECT, [resource]);
              throw new StaleTokenError(resource, t, BigInt(rows[0]!.token as string));
            }
            const b = raised.rows[0]!.before;
            before = b === null || b === undefined ? undefined : BigInt(b as string);
          } catch (error) {
            throw error instanceof StaleTokenError ? error : mapPgError('fence check', error);
          }
          return user(mutate); // the user's error reaches the caller unchanged (after ROLLBACK)
        },
      );
    },

    async highest(resource: string): Promise<bigint | null> {
      checkKey(resource, 'resource');
      await ensure();
      try {
        const { rows } = await pool.query(SELECT, [resource]);
        return rows.length === 0 ? null : BigInt(rows[0]!.token as string);
      } catch (error) {
        throw mapPgError('read mark', error);
      }
    },
  };
}

/** The savepoint `mutate` runs in; the fence releases it just before COMMIT (gone: the transaction is not the fence's any more). */
const SAVEPOINT = 'leasehold_fence_write';

/** What `mutate` must not do with the pooled client: end or open the transaction, release or close the client. */
function refusePg(method: string, args: unknown[]): string | undefined {
  if (method === 'release' || method === 'end' || method === 'connect') {
    return `mutate called ${method}() on the fence's pooled client; the fence releases it after COMMIT (refused; the write was rolled back)`;
  }
  if (method === 'query') {
    const q = args[0] as { text?: unknown } | string | null | undefined;
    const text = typeof q === 'string' ? q : typeof q === 'object' && q !== null && typeof q.text === 'string' ? q.text : undefined;
    const statement = text === undefined ? undefined : transactionControl(text);
    if (statement !== undefined)
      return `mutate ran ${statement} inside the fenced transaction; the fence commits or rolls back itself (refused; the write was rolled back)`;
  }
  return undefined;
}

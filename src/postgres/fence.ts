import { InvalidArgumentError, StaleTokenError } from '../core/errors.js';
import type { Fence } from '../core/fence.js';
import { toToken, type TokenInput } from '../core/token.js';
import { checkKey, checkKnownOptions, checkObject, describe } from '../core/validate.js';
import { checkPgIdentifier, checkPool, createOnce, guardClient, mapPgError, quotePg, type PgClient, type PgPool } from './util.js';

export interface PostgresFenceOptions {
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
 */
export function postgresFence(pool: PgPool, options?: PostgresFenceOptions): Fence<PgClient> {
  checkPool(pool, 'pool');
  const o = checkObject(options, 'options');
  checkKnownOptions(o, ['schema', 'table'], 'options');
  const schema = checkPgIdentifier(o.schema ?? 'public', 'schema');
  const tableName = checkPgIdentifier(o.table ?? 'leasehold_fences', 'table');
  const table = `${quotePg(schema)}.${quotePg(tableName)}`;

  const CREATE_SCHEMA = `CREATE SCHEMA IF NOT EXISTS ${quotePg(schema)}`;
  const CREATE = `CREATE TABLE IF NOT EXISTS ${table} (
    resource text PRIMARY KEY,
    token bigint NOT NULL CHECK (token > 0),
    updated_at timestamptz NOT NULL DEFAULT now()
  )`;
  /** Raises the mark only when stored <= token (I3); no row returned means refused. */
  const RAISE = `INSERT INTO ${table} AS f (resource, token) VALUES ($1, $2)
    ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token, updated_at = now() WHERE f.token <= EXCLUDED.token
    RETURNING token`;
  const SELECT = `SELECT token FROM ${table} WHERE resource = $1`;

  let ready: Promise<void> | undefined;
  const ensure = (): Promise<void> =>
    (ready ??= createOnce(pool, `leasehold:${schema}.${tableName}`, schema === 'public' ? [CREATE] : [CREATE_SCHEMA, CREATE]).catch((error: unknown) => {
      ready = undefined;
      throw mapPgError('create fence table', error);
    }));

  return {
    async write<R>(resource: string, token: TokenInput, mutate: (tx: PgClient) => R | Promise<R>): Promise<R> {
      checkKey(resource, 'resource');
      const t = toToken(token);
      if (typeof mutate !== 'function') throw new InvalidArgumentError('mutate', `expected a function, got ${describe(mutate)}`);
      await ensure();
      let client: PgClient;
      try {
        client = await pool.connect();
      } catch (error) {
        throw mapPgError('connect', error);
      }
      let broken: Error | undefined;
      let inTx = false;
      // a connection that drops between two statements (server restart) must not crash the process
      const unguard = guardClient(client, (e) => {
        broken = e;
      });
      try {
        try {
          await client.query('BEGIN');
          inTx = true;
          const raised = await client.query(RAISE, [resource, t.toString()]);
          if (raised.rowCount === 0) {
            const { rows } = await client.query(SELECT, [resource]);
            throw new StaleTokenError(resource, t, BigInt(rows[0]!.token as string));
          }
        } catch (error) {
          throw error instanceof StaleTokenError ? error : mapPgError('fence check', error);
        }
        const result = await mutate(client); // the user's error reaches the caller unchanged (after ROLLBACK below)
        let committed: { command?: string };
        try {
          committed = await client.query('COMMIT');
          inTx = false;
        } catch (error) {
          throw mapPgError('commit', error);
        }
        // COMMIT of a transaction that an error inside mutate aborted answers ROLLBACK, not an error.
        if (committed.command === 'ROLLBACK') {
          throw new InvalidArgumentError('mutate', 'a statement inside mutate failed and aborted the transaction; nothing was committed');
        }
        return result;
      } catch (error) {
        if (inTx) {
          await client.query('ROLLBACK').catch((e: Error) => {
            broken = e;
          });
        }
        throw error;
      } finally {
        unguard();
        client.release(broken);
      }
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

import { randomBytes } from 'node:crypto';
import type { SessionSupport } from '../core/backend.js';
import type { SchemaNames } from './schema.js';

/** Expired sessions deleted by one open at most: the work of a call stays bounded, and every open deletes some. */
const PURGE_BATCH = 100;

/** Runs one statement on the backend's pool (after its schema check), with leasehold's errors. */
type Query = (what: string, text: string, values: unknown[]) => Promise<Record<string, unknown>[]>;

/**
 * Sessions on PostgreSQL (`Backend.sessions`): a row in `<table>_sessions` that the client's
 * session-bound holders refer to, with its expiry by the server's clock (I7). One keep-alive per
 * client and ttl moves the session's expiry and every bound holder's in one call, so a client
 * holding many leases renews once per interval, not once per lease; each holder's `expires_at`
 * stays the one truth that grants, purges, inspect and watch read. Each method is one statement
 * (a function from schema.ts, or one INSERT), so it works through PgBouncer in transaction mode.
 */
export function postgresSessions(n: SchemaNames, query: Query): SessionSupport {
  /** A session living ttl from now; the first sessions that ran out are deleted on the way (their holders expired with them). */
  const OPEN = `WITH expired AS (
      DELETE FROM ${n.sessions} WHERE id IN (
        SELECT id FROM ${n.sessions} WHERE expires_at <= clock_timestamp() LIMIT ${PURGE_BATCH} FOR UPDATE SKIP LOCKED)
    )
    INSERT INTO ${n.sessions} (id, expires_at) VALUES ($1, clock_timestamp() + $2::bigint * interval '1 millisecond')`;
  /** The session and its holders live ttl from now; false when it is gone (see the function in schema.ts). */
  const KEEP_ALIVE = `SELECT ${n.keepAliveFn}($1, $2::bigint) AS alive`;
  /** Ends the session, freeing its holders and waking their waiters (see the function in schema.ts). */
  const END = `SELECT ${n.sessionEndFn}($1) AS ended`;

  return {
    async open(ttlMs) {
      // 128 random bits: the id is a secret (whoever knows it can bind leases to the session, or end it)
      const id = randomBytes(16).toString('base64url');
      await query('session open', OPEN, [id, ttlMs]);
      return { id, ttlMs };
    },
    async keepAlive(id, ttlMs) {
      const [row] = await query('session keep-alive', KEEP_ALIVE, [id, ttlMs]);
      return row?.alive === true;
    },
    async close(id) {
      await query('session close', END, [id]);
    },
  };
}

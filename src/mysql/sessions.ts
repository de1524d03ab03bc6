import { randomBytes } from 'node:crypto';
import type { SessionSupport } from '../core/backend.js';
import { BackendUnavailableError } from '../core/errors.js';
import { type SchemaNames, SESSION_BYTES } from './schema.js';

/** Expired sessions deleted by one open at most: the work of a call stays bounded, and every open deletes some. */
const PURGE_BATCH = 100;

type Row = Record<string, unknown>;

/** What the sessions need of the backend that owns the tables. */
export interface SessionHost {
  /**
   * Runs one statement on a pooled connection after the schema check, retrying deadlocks and
   * lock-wait timeouts, with leasehold's errors; resolves with mysql2's result.
   */
  run(what: string, sql: string, values: unknown[]): Promise<unknown>;
  /**
   * A session's end freed the key's holders and raised its change counter to `version`: this
   * instance's waiters (those whose queue place `head` and `exclusiveHead` let go) and watchers hear of it now.
   */
  changed(key: unknown, version: bigint, head: unknown, exclusiveHead: unknown): void;
}

/** `Backend.sessions`, plus the renewal of a session-bound holder (backend.ts's renew falls back to it). */
export interface MysqlSessions extends SessionSupport {
  /** Keeps alive the session the holder is bound to, if it is live and still bound to it; false otherwise. */
  renewBound(key: Buffer, owner: Buffer, token: string, ttlMs: number): Promise<boolean>;
}

/**
 * Sessions on MySQL / MariaDB: a row in `<table>_sessions` that the client's session-bound holders
 * refer to, with its expiry by the server's clock (`UTC_TIMESTAMP(6)`, I7). One keep-alive per
 * client and ttl moves the session's expiry and every bound holder's in one `CALL` (one
 * transaction), so a client holding many leases renews once per interval, not once per lease; each
 * holder's `expires_at` stays the one truth that grants, purges, inspect and the poller read.
 * Closing a live session frees its leases at once (no lock-delay) and raises their keys' change
 * counters, which other processes' pollers see and this instance's waiters hear at once; a session
 * that ran out frees them with their lock-delay (I8).
 */
export function mysqlSessions(n: SchemaNames, host: SessionHost): MysqlSessions {
  /** The first sessions that ran out are deleted on the way (their holders expired with them), in expiry order by its index. */
  const PURGE = `DELETE FROM ${n.sessions} WHERE expires_at <= UTC_TIMESTAMP(6) ORDER BY expires_at LIMIT ${PURGE_BATCH}`;
  /** A session living ttl from now (the server's clock). */
  const OPEN = `INSERT INTO ${n.sessions} (id, expires_at) VALUES (?, UTC_TIMESTAMP(6) + INTERVAL ? * 1000 MICROSECOND)`;
  /**
   * The session and its holders live ttl from now; alive false when it is gone (see the procedure
   * in schema.ts). With a NULL id and a holder: the session that holder is bound to.
   */
  const KEEP_ALIVE = `CALL ${n.keepAliveProc}(?, ?, ?, ?, CAST(? AS UNSIGNED))`;
  /** Ends the session, freeing its holders; one result set per key freed, then whether a live session ended (see schema.ts). */
  const END = `CALL ${n.sessionEndProc}(?)`;

  /** The keep-alive procedure's one row: alive or not. */
  const keepAlive = async (what: string, values: unknown[]): Promise<boolean> => {
    const row = resultSets(await host.run(what, KEEP_ALIVE, values))[0]?.[0];
    if (!row) throw new BackendUnavailableError('mysql', `${what}: the procedure returned no row`);
    return Number(row.alive) === 1;
  };

  return {
    async open(ttlMs) {
      // 128 random bits: the id is a secret (whoever knows it can bind leases to the session, or end it)
      const id = randomBytes(16).toString('base64url');
      await host.run('session open', PURGE, []);
      await host.run('session open', OPEN, [Buffer.from(id, 'utf8'), ttlMs]);
      return { id, ttlMs };
    },

    async keepAlive(id, ttlMs) {
      const bytes = sessionBytes(id);
      if (!bytes) return false;
      return keepAlive('session keep-alive', [bytes, ttlMs, null, null, null]);
    },

    async close(id) {
      const bytes = sessionBytes(id);
      if (!bytes) return;
      for (const rows of resultSets(await host.run('session close', END, [bytes]))) {
        const row = rows[0];
        if (row && 'key' in row && row.version !== null && row.version !== undefined)
          host.changed(row.key, BigInt(String(row.version)), row.head, row.exclusive_head);
      }
    },

    renewBound(key, owner, token, ttlMs) {
      return keepAlive('renew', [null, ttlMs, key, owner, token]);
    },
  };
}

/**
 * The session id as the tables store it; undefined for an id no session of ours can have (not a
 * string, or longer than the column): such an id names a session that is gone.
 */
export function sessionBytes(id: unknown): Buffer | undefined {
  if (typeof id !== 'string') return undefined;
  const bytes = Buffer.from(id, 'utf8');
  return bytes.length <= SESSION_BYTES ? bytes : undefined;
}

/** The result sets of a procedure's CALL (mysql2 answers `[rows, rows, …, okPacket]`). */
function resultSets(result: unknown): Row[][] {
  return Array.isArray(result) ? (result.filter((r) => Array.isArray(r)) as Row[][]) : [];
}

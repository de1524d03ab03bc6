import { randomBytes } from 'node:crypto';
import type { SessionSupport } from '../core/backend.js';
import type { MachineClock, SqliteDatabase, SqliteStatement } from './util.js';

/** Expired sessions deleted by one open at most: the work of a call stays bounded, and every open deletes some. */
const PURGE_BATCH = 100;

/** The sessions' statements, over the quoted holders' and sessions' tables. */
function sessionSql(locks: string, sessions: string) {
  return {
    select: `SELECT expires_at, epoch FROM ${sessions} WHERE id = ?`,
    insert: `INSERT INTO ${sessions} (id, expires_at, epoch) VALUES (?, ?, ?)`,
    /** Sessions that ran out (or belong to an earlier boot): their holders expired with them and are purged on their own. */
    purge: `DELETE FROM ${sessions} WHERE id IN (SELECT id FROM ${sessions} WHERE expires_at <= ? OR epoch <> ? LIMIT ${PURGE_BATCH})`,
    /** A keep-alive: the session, while live, then every live holder bound to it, to the same new expiry. */
    extend: `UPDATE ${sessions} SET expires_at = ? WHERE id = ? AND epoch = ? AND expires_at > ?`,
    extendHolders: `UPDATE ${locks} SET expires_at = ? WHERE session = ? AND epoch = ? AND expires_at > ?`,
    remove: `DELETE FROM ${sessions} WHERE id = ?`,
    /** The keys a session holds, and its holders of one key (found through the holders' session index). */
    keys: `SELECT DISTINCT key FROM ${locks} WHERE session = ?`,
    removeHolders: `DELETE FROM ${locks} WHERE key = ? AND session = ?`,
  };
}

type Statements = { [K in keyof ReturnType<typeof sessionSql>]: SqliteStatement };

/** What the sessions need of the backend that owns the tables. */
export interface SessionHost {
  readonly db: SqliteDatabase;
  readonly clock: MachineClock;
  /** The holders' table and the sessions' table, quoted. */
  readonly locksTable: string;
  readonly sessionsTable: string;
  /** Runs one operation (after the tables exist, retrying while the file is busy), with leasehold's errors. */
  run<T>(what: string, op: () => T): Promise<T>;
  /** Removes the key's expired holders, starting their lock-delay (I8), inside the caller's transaction. */
  purge(key: string, now: number, epoch: string): unknown;
  /** The key's holders changed in this transaction: its observers hear of it once it commits. */
  changed(key: string): void;
  /** Wakes this backend's waiters (other processes see the commit through data_version). */
  wake(): void;
}

/**
 * Sessions on SQLite: a row in `<table>_sessions` that session-bound holders refer to, expiring by
 * the machine's clock (I7) within its boot epoch. A session-bound holder's `expires_at` is the
 * session's, moved by every keep-alive in the same transaction, so it stays the one truth that
 * grants, purges and inspect read. One keep-alive per client and ttl is one commit, however many
 * leases the client holds.
 */
export class SqliteSessions {
  readonly #h: SessionHost;
  readonly #sql: ReturnType<typeof sessionSql>;
  #st: Statements | undefined;

  constructor(host: SessionHost) {
    this.#h = host;
    this.#sql = sessionSql(host.locksTable, host.sessionsTable);
  }

  /** Prepared on first use (the tables exist by then). */
  #statements(): Statements {
    const { db } = this.#h;
    const q = this.#sql;
    return (this.#st ??= {
      select: db.prepare(q.select).safeIntegers(true),
      insert: db.prepare(q.insert),
      purge: db.prepare(q.purge),
      extend: db.prepare(q.extend),
      extendHolders: db.prepare(q.extendHolders),
      remove: db.prepare(q.remove),
      keys: db.prepare(q.keys),
      removeHolders: db.prepare(q.removeHolders),
    });
  }

  /** The session's expiry if it is live at `now`, else undefined (closed, ran out, or of an earlier boot). */
  expiry(id: string, now: number, epoch: string): number | undefined {
    const row = this.#statements().select.get(id) as { expires_at: bigint; epoch: string } | undefined;
    if (!row || row.epoch !== epoch) return undefined;
    const at = Number(row.expires_at);
    return at > now ? at : undefined;
  }

  /** Inside a write transaction: the session and every holder bound to it live `ttlMs` from now; false when it is gone. */
  keepAlive(id: string, ttlMs: number): boolean {
    const s = this.#statements();
    const now = this.#h.clock.now();
    const epoch = this.#h.clock.epoch;
    if (s.extend.run(now + ttlMs, id, epoch, now).changes === 0) return false;
    s.extendHolders.run(now + ttlMs, id, epoch, now);
    return true;
  }

  /** `Backend.sessions`: one IMMEDIATE transaction per call. */
  support(): SessionSupport {
    const { db, clock, run } = this.#h;
    return {
      open: async (ttlMs) => {
        // 128 random bits: the id is a secret (whoever knows it can bind leases to the session, or end it)
        const id = randomBytes(16).toString('base64url');
        await run('session open', () =>
          db
            .transaction(() => {
              const s = this.#statements();
              const now = clock.now();
              s.purge.run(now, clock.epoch);
              s.insert.run(id, now + ttlMs, clock.epoch);
            })
            .immediate(),
        );
        return { id, ttlMs };
      },
      keepAlive: (id, ttlMs) => run('session keep-alive', () => db.transaction(() => this.keepAlive(id, ttlMs)).immediate() as boolean),
      close: async (id) => {
        const ended = await run('session close', () => db.transaction(() => this.#end(id)).immediate() as boolean);
        if (ended) this.#h.wake();
      },
    };
  }

  /**
   * Ends the session. A live one frees its holders at once, as their releases would (no
   * lock-delay), purging what else expired on their keys; one that already ran out is only deleted:
   * its holders expired with it and start their lock-delay when purged (I8). True if a live session ended.
   */
  #end(id: string): boolean {
    const s = this.#statements();
    const now = this.#h.clock.now();
    const epoch = this.#h.clock.epoch;
    const live = this.expiry(id, now, epoch) !== undefined;
    s.remove.run(id);
    if (!live) return false;
    for (const { key } of s.keys.all(id) as { key: string }[]) {
      this.#h.purge(key, now, epoch);
      s.removeHolders.run(key, id);
      this.#h.changed(key);
    }
    return true;
  }
}

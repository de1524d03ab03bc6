import { randomUUID } from 'node:crypto';
import type { WatchKey } from '../core/backend.js';
import { KeyWatchSet, type WatchedKey } from '../core/key-watches.js';
import type { SchemaNames } from './schema.js';

/** Timings of key watches, each with its reason. */
export const WATCH_DEFAULTS = Object.freeze({
  /**
   * 30 s: a watcher that vanished without unwatching (crashed, cut off) costs the key's grants a
   * NOTIFY each for at most this long.
   */
  markMs: 30_000,
  /**
   * 10 s: the mark is renewed this often (three times per mark, so one slow or failed renewal does
   * not let it lapse), and the key's state compared, so a change missed while the mark had lapsed
   * or the LISTEN connection was reconnecting is told within this long.
   */
  refreshMs: 10_000,
  /** 1 s: a look that failed (the server unreachable) is tried again this soon. */
  retryMs: 1_000,
});

/** The statements of key watches for one lease table (named beside the operation that runs them). */
function watchStatements(n: SchemaNames) {
  return {
    /** Marks the key watched by `$2` for `$3` ms (or keeps a fresh mark) and reads the key's state: see `watchFn` in schema.ts. */
    LOOK: `SELECT last_token::text AS last_token, holders::text AS holders, next_expiry_ms::text AS next_expiry_ms
      FROM ${n.watchFn}($1, $2, $3::bigint)`,
    /** The last local watcher of the key stopped: its grants stop sending NOTIFY (unless another instance watches). */
    UNMARK: `DELETE FROM ${n.watched} WHERE key = $1 AND watcher = $2`,
    /** The backend closes: every mark it still has goes. */
    UNMARK_ALL: `DELETE FROM ${n.watched} x USING unnest($1::text[], $2::text[]) AS u(key, watcher)
      WHERE x.key = u.key AND x.watcher = u.watcher`,
  };
}

export interface KeyWatchesOptions {
  readonly names: SchemaNames;
  /** Subscribes to the key's notifications on the backend's LISTEN connection; resolves once LISTEN is active. */
  listen(key: string, onNotify: () => void): Promise<() => void>;
  /** Runs one statement on the backend's pool (after its schema check), failures mapped to leasehold errors. */
  query(what: string, text: string, values: unknown[]): Promise<Record<string, unknown>[]>;
}

/** One watched key of this instance: its mark is the row (key, watcher) of the watched table. */
interface MarkedKey extends WatchedKey {
  readonly key: string;
  readonly watcher: string;
}

/**
 * `Backend.watch` on PostgreSQL: change notifications of keys, from the backend's LISTEN connection.
 *
 * - Releases, purges and queue changes always NOTIFY (waiters need them). A grant that no queued
 *   waiter needs to hear of NOTIFYs (`0:<key>`) only while the key carries a live watch mark, so a
 *   key nobody watches costs nothing more than before watches existed: no extra statement, and no
 *   NOTIFY, which would serialise its commit with every other NOTIFYing commit on the server.
 * - Each backend instance keeps one mark per key it watches (several local watchers of one key
 *   share it, and its LISTEN subscription), set for `markMs` by the server's clock and renewed
 *   every `refreshMs`; it is deleted when the last local watcher of the key stops or the backend
 *   closes. A watcher that crashed stops renewing and its mark runs out.
 * - Each renewal, and a look at the first live holder's expiry (which sends no NOTIFY), compares
 *   the key's last token and live holder count with the previous look's and tells the watchers if
 *   they moved: every grant raises the one, every release or expiry without a grant lowers the other.
 *
 * `onChange` may fire more than once per change and spuriously; a callback that throws does not
 * keep the others from being told.
 */
export class KeyWatches {
  readonly #options: KeyWatchesOptions;
  readonly #sql: ReturnType<typeof watchStatements>;
  readonly #instance = randomUUID();
  #next = 0;
  readonly #set: KeyWatchSet<MarkedKey>;

  constructor(options: KeyWatchesOptions) {
    this.#options = options;
    this.#sql = watchStatements(options.names);
    this.#set = new KeyWatchSet({ open: (key) => this.#open(key), refreshMs: WATCH_DEFAULTS.refreshMs, retryMs: WATCH_DEFAULTS.retryMs });
  }

  readonly watch: WatchKey = (key, onChange) => this.#set.watch(key, onChange);

  /** Stops every watch and deletes this instance's marks (one statement; the caller bounds how long it waits). */
  async close(): Promise<void> {
    const keys = this.#set.close();
    if (keys.length === 0) return;
    await this.#options.query('unwatch', this.#sql.UNMARK_ALL, [keys.map((k) => k.key), keys.map((k) => k.watcher)]).catch(() => {}); // the marks run out by themselves
  }

  #open(key: string): MarkedKey {
    // This entry's name in the watched table: the instance's id and a counter, so a mark never outlives its entry's DELETE.
    const watcher = `${this.#instance}/${this.#next++}`;
    const options = this.#options;
    const sql = this.#sql;
    return {
      key,
      watcher,
      // A NOTIFY of the key (or the LISTEN connection came back): tell the watchers, then look again for the new first expiry.
      listen: (heard) =>
        options.listen(key, () => {
          heard.tell();
          heard.lookAgain();
        }),
      look: async () => {
        const [r] = await options.query('watch', sql.LOOK, [key, watcher, WATCH_DEFAULTS.markMs]);
        const next = typeof r?.next_expiry_ms === 'string' ? Number(r.next_expiry_ms) : undefined;
        return { lastToken: String(r?.last_token), holders: Number(r?.holders), soonestExpiryMs: next };
      },
      unmark: async () => {
        await options.query('unwatch', sql.UNMARK, [key, watcher]);
      },
    };
  }
}

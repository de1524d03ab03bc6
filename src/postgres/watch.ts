import { randomUUID } from 'node:crypto';
import type { WatchKey } from '../core/backend.js';
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

interface Watched {
  readonly key: string;
  /** This entry's name in the watched table: the instance's id and a counter, so a mark never outlives its entry's DELETE. */
  readonly watcher: string;
  readonly listeners: Set<() => void>;
  /** watch() calls that hold this entry (resolved or still subscribing); the entry ends at 0. */
  refs: number;
  /** Resolves once LISTENing and marked. */
  ready: Promise<void>;
  /** The last token and live holder count of the last look (`t:n`). */
  seen: string | undefined;
  timer: ReturnType<typeof setTimeout> | undefined;
  looking: boolean;
  /** A look was asked for while one ran: one more after it, not one per notification. */
  again: boolean;
  unlisten: (() => void) | undefined;
  ended: boolean;
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
  readonly #keys = new Map<string, Watched>();
  readonly #instance = randomUUID();
  #next = 0;
  #closed = false;

  constructor(options: KeyWatchesOptions) {
    this.#options = options;
    this.#sql = watchStatements(options.names);
  }

  readonly watch: WatchKey = async (key, onChange) => {
    let w = this.#keys.get(key);
    if (!w) {
      const entry: Watched = {
        key,
        watcher: `${this.#instance}/${this.#next++}`,
        listeners: new Set(),
        refs: 0,
        ready: Promise.resolve(),
        seen: undefined,
        timer: undefined,
        looking: false,
        again: false,
        unlisten: undefined,
        ended: false,
      };
      entry.ready = this.#start(entry);
      this.#keys.set(key, entry);
      w = entry;
    }
    const watched = w;
    watched.refs++;
    try {
      await watched.ready;
    } catch (error) {
      this.#release(watched);
      throw error;
    }
    // A distinct function per call: the same callback watched twice is two subscriptions.
    const listener = (): void => onChange();
    watched.listeners.add(listener);
    let done = false;
    return () => {
      if (done) return;
      done = true;
      watched.listeners.delete(listener);
      this.#release(watched);
    };
  };

  /** Stops every watch and deletes this instance's marks (one statement; the caller bounds how long it waits). */
  async close(): Promise<void> {
    this.#closed = true;
    const entries = [...this.#keys.values()];
    this.#keys.clear();
    for (const w of entries) this.#end(w);
    if (entries.length === 0) return;
    await this.#options.query('unwatch', this.#sql.UNMARK_ALL, [entries.map((w) => w.key), entries.map((w) => w.watcher)]).catch(() => {}); // the marks run out by themselves
  }

  async #start(w: Watched): Promise<void> {
    try {
      // LISTENing first, then marked: a grant that sees the mark notifies a connection already listening.
      w.unlisten = await this.#options.listen(w.key, () => this.#notified(w));
      if (w.ended) {
        w.unlisten();
        return;
      }
      await this.#look(w);
    } catch (error) {
      this.#end(w);
      if (this.#keys.get(w.key) === w) this.#keys.delete(w.key);
      throw error;
    }
  }

  /** Renews the mark (when due) and compares the key's state with the last look's; arms the next look. */
  async #look(w: Watched): Promise<void> {
    const [r] = await this.#options.query('watch', this.#sql.LOOK, [w.key, w.watcher, WATCH_DEFAULTS.markMs]);
    if (w.ended) return;
    const seen = `${r?.last_token}:${r?.holders}`;
    const changed = w.seen !== undefined && w.seen !== seen;
    w.seen = seen;
    const next = typeof r?.next_expiry_ms === 'string' ? Number(r.next_expiry_ms) : undefined;
    this.#arm(w, next === undefined ? WATCH_DEFAULTS.refreshMs : Math.min(WATCH_DEFAULTS.refreshMs, next + 1));
    if (changed) this.#fire(w);
  }

  /** One look at a time per key; a look asked for meanwhile runs once after it. */
  #lookSoon(w: Watched): void {
    if (w.ended) return;
    if (w.looking) {
      w.again = true;
      return;
    }
    w.looking = true;
    this.#look(w)
      .catch(() => {
        if (!w.ended) this.#arm(w, WATCH_DEFAULTS.retryMs);
      })
      .finally(() => {
        w.looking = false;
        if (w.again) {
          w.again = false;
          this.#lookSoon(w);
        }
      });
  }

  #arm(w: Watched, ms: number): void {
    clearTimeout(w.timer);
    w.timer = setTimeout(() => {
      w.timer = undefined;
      this.#lookSoon(w);
    }, ms);
    w.timer.unref?.();
  }

  /**
   * A NOTIFY of the key (or the LISTEN connection came back): tell the watchers, then look again
   * for the new first expiry. The look that follows takes its state as the new baseline without
   * telling again: the change it would see is the one just told.
   */
  #notified(w: Watched): void {
    if (w.ended) return;
    this.#fire(w);
    w.seen = undefined;
    this.#lookSoon(w);
  }

  #fire(w: Watched): void {
    for (const fn of [...w.listeners]) {
      try {
        fn();
      } catch {
        // a watcher's callback failing is its own business: the others are still told
      }
    }
  }

  #release(w: Watched): void {
    if (--w.refs > 0) return;
    this.#end(w);
    if (this.#keys.get(w.key) !== w) return;
    this.#keys.delete(w.key);
    if (this.#closed) return;
    // Once it has started: a DELETE that ran before the mark's INSERT would leave the mark behind.
    void w.ready.then(() => this.#options.query('unwatch', this.#sql.UNMARK, [w.key, w.watcher])).catch(() => {}); // the mark runs out by itself
  }

  #end(w: Watched): void {
    w.ended = true;
    clearTimeout(w.timer);
    w.timer = undefined;
    w.unlisten?.();
    w.unlisten = undefined;
  }
}

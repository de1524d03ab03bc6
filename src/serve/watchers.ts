/**
 * The dashboard's Watcher (src/dashboard/watch.ts: `inspect` reads, woken at once by the backend's
 * change notifications of the keys shown) shared by everything of one lock server that observes:
 * `GET /v1/events` and the dashboard at `/`. One Watcher per prefix asked for, started when its
 * first listener comes and stopped when its last one goes, so a server nobody watches reads
 * nothing, and a hundred streams of one prefix cost one read per tick, not a hundred.
 */
import type { FastifyInstance } from 'fastify';
import { BackendUnavailableError, ClosedError } from '../core/errors.js';
import { Watcher, type WatchListener } from '../dashboard/watch.js';
import type { ServeContext } from './context.js';

/**
 * Between two reads of one prefix. A grant on a key that is not listed yet (a free key has no
 * change notifications to follow) is seen at the next read; the keys listed, and grants made
 * through this server, wake a read at once. The dashboard's own default.
 */
export const WATCH_POLL_MS = 250;

/** One listener's hold on a prefix's Watcher: its latest state, and the way out. */
export interface WatchSubscription {
  readonly watcher: Watcher;
  /** Stops listening; the Watcher stops with its last listener. Idempotent. */
  close(): void;
}

interface Entry {
  readonly watcher: Watcher;
  readonly listeners: Set<WatchListener>;
  /** The first read: a listener is told nothing before it, so each change it is told is one it could not have seen. */
  readonly ready: Promise<void>;
}

export class SharedWatchers {
  readonly #ctx: ServeContext;
  readonly #byPrefix = new Map<string, Entry>();
  #closed = false;
  /** A grant made through this server reads the prefixes that hold its key at once (it may be a key nobody listed yet). */
  readonly #onAcquired = (e: { key: string }): void => {
    for (const [prefix, entry] of this.#byPrefix) if (e.key.startsWith(prefix)) void entry.watcher.poke();
  };

  constructor(ctx: ServeContext) {
    this.#ctx = ctx;
    ctx.events.on('acquired', this.#onAcquired);
  }

  /** Prefixes with a running Watcher now (what the server reads each tick). */
  get prefixes(): readonly string[] {
    return [...this.#byPrefix.keys()];
  }

  /**
   * Listens to the keys under `prefix`: resolves once the Watcher has read them (its snapshot is
   * then current), rejects with BackendUnavailableError when that first read failed.
   */
  async subscribe(prefix: string, listener: WatchListener): Promise<WatchSubscription> {
    if (this.#closed) throw new ClosedError('lock server');
    let entry = this.#byPrefix.get(prefix);
    if (!entry) entry = this.#start(prefix);
    entry.listeners.add(listener);
    const off = entry.watcher.on(listener);
    const current = entry;
    let open = true;
    const close = (): void => {
      if (!open) return;
      open = false;
      off();
      current.listeners.delete(listener);
      if (current.listeners.size === 0 && this.#byPrefix.get(prefix) === current) {
        this.#byPrefix.delete(prefix);
        current.watcher.stop();
      }
    };
    try {
      await current.ready;
    } catch (error) {
      close();
      throw error;
    }
    return { watcher: current.watcher, close };
  }

  /** Stops every Watcher (the server is closing). */
  close(): void {
    this.#closed = true;
    this.#ctx.events.off('acquired', this.#onAcquired);
    for (const entry of this.#byPrefix.values()) entry.watcher.stop();
    this.#byPrefix.clear();
  }

  #start(prefix: string): Entry {
    const { locks } = this.#ctx;
    const watcher = new Watcher({
      inspect: (p) => locks.inspect(p),
      watch: (key, onChange) => locks.watch(key, onChange),
      prefix,
      pollMs: WATCH_POLL_MS,
    });
    const ready = this.#firstRead(prefix, watcher);
    // A failed first read is reported to each subscriber; no unhandled rejection if all went away first.
    ready.catch(() => {});
    const entry: Entry = { watcher, listeners: new Set(), ready };
    this.#byPrefix.set(prefix, entry);
    return entry;
  }

  /** Starts the Watcher; rejects (and drops it) when its first read failed. */
  async #firstRead(prefix: string, watcher: Watcher): Promise<void> {
    let failure: string | undefined;
    const off = watcher.on((update) => {
      failure = update.error;
    });
    try {
      await watcher.start();
    } finally {
      off();
    }
    if (failure === undefined) return;
    // The Watcher keeps a failed first read as "no snapshot yet"; nobody may listen to it.
    if (this.#byPrefix.get(prefix)?.watcher === watcher) this.#byPrefix.delete(prefix);
    watcher.stop();
    throw new BackendUnavailableError(this.#ctx.backend.name, `cannot list the keys under ${JSON.stringify(prefix)}: ${failure}`);
  }
}

const byContext = new WeakMap<ServeContext, SharedWatchers>();

/** The Watchers of one server, made by its first route module that observes; stopped when the app closes. */
export function sharedWatchers(app: FastifyInstance, ctx: ServeContext): SharedWatchers {
  let watchers = byContext.get(ctx);
  if (!watchers) {
    const made = new SharedWatchers(ctx);
    app.addHook('onClose', async () => made.close());
    byContext.set(ctx, made);
    watchers = made;
  }
  return watchers;
}

/**
 * The prefixes to watch for a caller's listing prefixes (auth.ts `listingPrefixes`): those not inside
 * another of the list, so that a key is told once even when a caller's prefixes overlap (`a/` and `a/b/`).
 */
export function outermost(prefixes: readonly string[]): string[] {
  const unique = [...new Set(prefixes)];
  return unique.filter((p) => !unique.some((q) => q !== p && p.startsWith(q)));
}

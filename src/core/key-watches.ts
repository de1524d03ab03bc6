import type { WatchKey } from './backend.js';

/**
 * What a backend reads of a watched key: the last token and the number of live holders. Every
 * grant raises the one, every release or expiry without a grant lowers the other, so the pair
 * changes whenever the holders do.
 */
export interface KeyState {
  readonly lastToken: string;
  readonly holders: number;
  /** Ms until the soonest live holder expires (no notification tells of an expiry); undefined: no holder. */
  readonly soonestExpiryMs: number | undefined;
}

/** What the backend's notifications of one key may ask of its watchers. */
export interface KeyHeard {
  /** Tells the key's local watchers now. */
  tell(): void;
  /**
   * Looks at the key again soon (one look at a time per key; one asked for meanwhile runs once after
   * it), taking what it sees as the new baseline without telling: the change it would see is the one
   * just told.
   */
  lookAgain(): void;
}

/** A backend's side of one watched key: one per key and instance, shared by its local watchers. */
export interface WatchedKey {
  /** Starts hearing of the key's changes; resolves once active, with the function that stops. */
  listen(heard: KeyHeard): Promise<() => void>;
  /** Marks the key watched (or renews the mark) and reads its state; called after `listen` resolved, then on every refresh. */
  look(): Promise<KeyState>;
  /** The key's last local watcher stopped (called once the start has settled, never after close): the mark can go. */
  unmark?(): Promise<void>;
}

export interface KeyWatchSetOptions<K extends WatchedKey> {
  /** The backend's side of a key that one watcher of this instance began to watch. */
  open(key: string): K;
  /** A key's state is looked at again at most this long after the last look (sooner at its soonest holder's expiry). */
  readonly refreshMs: number;
  /** A look that failed (the server unreachable) is tried again this soon. */
  readonly retryMs: number;
}

interface Entry<K> {
  readonly key: string;
  readonly backend: K;
  readonly listeners: Set<() => void>;
  /** watch() calls that hold this entry (resolved or still subscribing); the entry ends at 0. */
  refs: number;
  /** Resolves once listening and marked. */
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
 * `Backend.watch` for a backend that hears of a key's changes by notifications and makes up for
 * the ones it cannot hear (an expiry, a message lost while reconnecting) by looking at the key's
 * state: the local watchers of one key share one entry (one subscription, one mark), and the key is
 * looked at every `refreshMs` or at its soonest holder's expiry; the watchers are told when the
 * look's (last token, live holders) differs from the previous one's.
 *
 * `onChange` may fire more than once per change and spuriously; a callback that throws does not
 * keep the others from being told, and never throws into the caller.
 */
export class KeyWatchSet<K extends WatchedKey> {
  readonly #options: KeyWatchSetOptions<K>;
  readonly #keys = new Map<string, Entry<K>>();
  #closed = false;

  constructor(options: KeyWatchSetOptions<K>) {
    this.#options = options;
  }

  get closed(): boolean {
    return this.#closed;
  }

  readonly watch: WatchKey = async (key, onChange) => {
    let w = this.#keys.get(key);
    if (!w) {
      const entry: Entry<K> = {
        key,
        backend: this.#options.open(key),
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

  /** Stops every watch (timers, subscriptions); returns the backend's side of the keys it watched, for their marks to go at once. */
  close(): K[] {
    this.#closed = true;
    const entries = [...this.#keys.values()];
    this.#keys.clear();
    for (const w of entries) this.#end(w);
    return entries.map((w) => w.backend);
  }

  async #start(w: Entry<K>): Promise<void> {
    try {
      // Listening first, then marked: a change after the mark is told to a listener already there.
      w.unlisten = await w.backend.listen({
        tell: () => {
          if (!w.ended) this.#fire(w);
        },
        lookAgain: () => {
          w.seen = undefined;
          this.#lookSoon(w);
        },
      });
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

  /** Renews the mark and compares the key's state with the last look's; arms the next look. */
  async #look(w: Entry<K>): Promise<void> {
    const state = await w.backend.look();
    if (w.ended) return;
    const seen = `${state.lastToken}:${state.holders}`;
    const changed = w.seen !== undefined && w.seen !== seen;
    w.seen = seen;
    const { refreshMs } = this.#options;
    this.#arm(w, state.soonestExpiryMs === undefined ? refreshMs : Math.min(refreshMs, state.soonestExpiryMs + 1));
    if (changed) this.#fire(w);
  }

  /** One look at a time per key; a look asked for meanwhile runs once after it. */
  #lookSoon(w: Entry<K>): void {
    if (w.ended) return;
    if (w.looking) {
      w.again = true;
      return;
    }
    w.looking = true;
    this.#look(w)
      .catch(() => {
        if (!w.ended) this.#arm(w, this.#options.retryMs);
      })
      .finally(() => {
        w.looking = false;
        if (w.again) {
          w.again = false;
          this.#lookSoon(w);
        }
      });
  }

  #arm(w: Entry<K>, ms: number): void {
    clearTimeout(w.timer);
    w.timer = setTimeout(() => {
      w.timer = undefined;
      this.#lookSoon(w);
    }, ms);
    w.timer.unref?.();
  }

  #fire(w: Entry<K>): void {
    for (const fn of [...w.listeners]) {
      try {
        fn();
      } catch {
        // a watcher's callback failing is its own business: the others are still told
      }
    }
  }

  #release(w: Entry<K>): void {
    if (--w.refs > 0) return;
    this.#end(w);
    if (this.#keys.get(w.key) !== w) return;
    this.#keys.delete(w.key);
    const unmark = w.backend.unmark?.bind(w.backend);
    if (this.#closed || !unmark) return;
    // Once it has started: an unmark that ran before the mark would leave the mark behind.
    void w.ready.then(unmark).catch(() => {}); // the mark runs out by itself
  }

  #end(w: Entry<K>): void {
    w.ended = true;
    clearTimeout(w.timer);
    w.timer = undefined;
    w.unlisten?.();
    w.unlisten = undefined;
  }
}

import type { KeyState } from '../core/backend.js';

/** A holder as the page shows it: tokens as decimal strings (JSON has no bigint). */
export interface HolderView {
  readonly mode: 'exclusive' | 'shared';
  readonly token: string;
  readonly holder: string;
  /** By the coordinator's clock, at `Snapshot.at`. */
  readonly expiresInMs: number;
}

export interface KeyView {
  readonly key: string;
  readonly lastToken: string;
  readonly holders: readonly HolderView[];
  readonly waiters: number;
  readonly lockDelayRemainingMs: number;
  /** A semaphore's limit while it has permit holders. */
  readonly limit?: number;
}

export interface Snapshot {
  /** Wall-clock ms of the read (for the page's display only; expiry comes from the coordinator). */
  readonly at: number;
  readonly prefix: string;
  readonly keys: readonly KeyView[];
}

/**
 * One change between two reads: a holder appeared (`granted`; `taken-over` when it replaced one
 * that expired without a release: the zombie case), or went (`released` before its expiry,
 * `expired` at or after it).
 */
export interface Change {
  readonly at: number;
  readonly kind: 'granted' | 'taken-over' | 'released' | 'expired';
  readonly key: string;
  readonly mode: 'exclusive' | 'shared';
  readonly token: string;
  readonly holder: string;
  /** For `taken-over`: the holder whose lease ran out. */
  readonly previous?: { readonly token: string; readonly holder: string };
}

/** A holder that vanished within this long of its expected expiry counts as expired (read timing, timer ticks). */
const EXPIRY_SLACK_MS = 250;

export function toView(states: readonly KeyState[]): KeyView[] {
  return states.map((s) => ({
    key: s.key,
    lastToken: s.lastToken.toString(),
    holders: s.holders.map((h) => ({ mode: h.mode, token: h.token.toString(), holder: h.holder, expiresInMs: Math.max(0, Math.round(h.expiresInMs)) })),
    waiters: s.waiters,
    lockDelayRemainingMs: Math.round(s.lockDelayRemainingMs),
    ...(s.limit !== undefined && { limit: s.limit }),
  }));
}

/**
 * The changes from one read to the next, `elapsedMs` apart. A read sees states, not events: two
 * grants and a release between reads show as one grant. A new holder that replaces one that
 * expired is a take-over — in the same read, or in a later one when the expiry and the grant fell in
 * two reads (reads are frequent where the backend sends change notifications): `expiredBefore`
 * carries, per key, the last holder that expired with nothing in between, from one call to the
 * next (updated here). Pure but for that map, for the tests.
 */
export function diff(
  previous: readonly KeyView[],
  next: readonly KeyView[],
  elapsedMs: number,
  at: number,
  expiredBefore: Map<string, { token: string; holder: string }> = new Map(),
): Change[] {
  const before = new Map(previous.map((k) => [k.key, k]));
  const after = new Map(next.map((k) => [k.key, k]));
  const changes: Change[] = [];
  for (const key of new Set([...before.keys(), ...after.keys()])) {
    const was = before.get(key)?.holders ?? [];
    const is = after.get(key)?.holders ?? [];
    const now = new Set(is.map((h) => h.token));
    const then = new Set(was.map((h) => h.token));
    const expired: { token: string; holder: string }[] = [];
    const earlier = expiredBefore.get(key);
    if (earlier) expired.push(earlier);
    for (const h of was) {
      if (now.has(h.token)) continue;
      const ranOut = h.expiresInMs <= elapsedMs + EXPIRY_SLACK_MS;
      if (ranOut) expired.push(h);
      else expired.length = 0; // a release in between: what follows is no take-over
      changes.push({ at, kind: ranOut ? 'expired' : 'released', key, mode: h.mode, token: h.token, holder: h.holder });
    }
    for (const h of is) {
      if (then.has(h.token)) continue;
      const replaced = expired.pop();
      expired.length = 0;
      changes.push(
        replaced
          ? { at, kind: 'taken-over', key, mode: h.mode, token: h.token, holder: h.holder, previous: { token: replaced.token, holder: replaced.holder } }
          : { at, kind: 'granted', key, mode: h.mode, token: h.token, holder: h.holder },
      );
    }
    const last = expired.at(-1);
    if (last) expiredBefore.set(key, { token: last.token, holder: last.holder });
    else expiredBefore.delete(key);
  }
  return changes;
}

export interface WatcherOptions {
  /** Reads the coordinator (`locks.inspect`). */
  readonly inspect: (prefix: string) => Promise<KeyState[]>;
  /**
   * The backend's change notifications of one key (`locks.watch`), where it has them: every key
   * shown is watched, and a notification reads at once instead of at the next poll.
   */
  readonly watch?: (key: string, onChange: () => void) => Promise<(() => void) | undefined>;
  readonly prefix: string;
  /** Between reads. @default 250 */
  readonly pollMs?: number;
  /** Changes kept for pages that connect later. @default 200 */
  readonly historySize?: number;
}

export type WatchListener = (update: { snapshot: Snapshot; changes: readonly Change[]; error?: string }) => void;

/**
 * Reads the coordinator every `pollMs` and tells listeners the new snapshot and what changed. A
 * failed read is reported (`error`) and retried at the next tick; the last good snapshot stays.
 * `poke()` reads at once (a backend's change notification, say). Reads never overlap.
 */
export class Watcher {
  readonly #o: Required<Omit<WatcherOptions, 'watch'>> & Pick<WatcherOptions, 'watch'>;
  /** Keys watched now (their stop functions), following the keys of the latest snapshot. */
  readonly #watched = new Map<string, Promise<(() => void) | undefined>>();
  readonly #listeners = new Set<WatchListener>();
  readonly #history: Change[] = [];
  /** The last holder of a key that expired, until the key's next change (see diff). */
  readonly #lastExpired = new Map<string, { token: string; holder: string }>();
  #snapshot: Snapshot;
  #readAt = 0;
  #timer: ReturnType<typeof setTimeout> | undefined;
  #reading: Promise<void> | undefined;
  #again = false;
  #stopped = true;

  constructor(options: WatcherOptions) {
    this.#o = { pollMs: 250, historySize: 200, ...options };
    this.#snapshot = { at: Date.now(), prefix: options.prefix, keys: [] };
  }

  get snapshot(): Snapshot {
    return this.#snapshot;
  }

  get history(): readonly Change[] {
    return this.#history;
  }

  on(listener: WatchListener): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  /** Starts reading; resolves after the first read (which sets the first snapshot without changes). */
  async start(): Promise<void> {
    if (!this.#stopped) return;
    this.#stopped = false;
    await this.poke();
  }

  stop(): void {
    this.#stopped = true;
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = undefined;
    for (const stopping of this.#watched.values()) void stopping.then((off) => off?.()).catch(() => {});
    this.#watched.clear();
  }

  /** Watches the keys shown, and stops watching the ones gone (best effort: polling still runs). */
  #follow(keys: readonly KeyView[]): void {
    const watch = this.#o.watch;
    if (!watch || this.#stopped) return;
    const shown = new Set(keys.map((k) => k.key));
    for (const [key, stopping] of this.#watched) {
      if (shown.has(key)) continue;
      this.#watched.delete(key);
      void stopping.then((off) => off?.()).catch(() => {});
    }
    for (const key of shown) {
      if (this.#watched.has(key)) continue;
      this.#watched.set(
        key,
        watch(key, () => void this.poke()).catch(() => undefined),
      );
    }
  }

  /** Reads now (or right after the read in flight). */
  poke(): Promise<void> {
    if (this.#reading) {
      this.#again = true;
      return this.#reading;
    }
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#reading = this.#read().finally(() => {
      this.#reading = undefined;
      if (this.#stopped) return;
      if (this.#again) {
        this.#again = false;
        void this.poke();
      } else {
        this.#timer = setTimeout(() => void this.poke(), this.#o.pollMs);
        this.#timer.unref?.();
      }
    });
    return this.#reading;
  }

  async #read(): Promise<void> {
    const startedAt = performance.now();
    let states: KeyState[];
    try {
      states = await this.#o.inspect(this.#o.prefix);
    } catch (error) {
      this.#emit({ snapshot: this.#snapshot, changes: [], error: error instanceof Error ? error.message : String(error) });
      return;
    }
    const at = Date.now();
    const keys = toView(states);
    const first = this.#readAt === 0;
    const changes = first ? [] : diff(this.#snapshot.keys, keys, startedAt - this.#readAt, at, this.#lastExpired);
    this.#readAt = startedAt;
    this.#snapshot = { at, prefix: this.#o.prefix, keys };
    this.#follow(keys);
    this.#history.push(...changes);
    if (this.#history.length > this.#o.historySize) this.#history.splice(0, this.#history.length - this.#o.historySize);
    this.#emit({ snapshot: this.#snapshot, changes });
  }

  #emit(update: Parameters<WatchListener>[0]): void {
    for (const listener of this.#listeners) {
      try {
        listener(update);
      } catch {
        // a broken page connection must not stop the others
      }
    }
  }
}

/**
 * Wake-ups for waiters: a waiter blocked by requests ahead follows every change under its lock (see
 * `Follow`) on a watch its client keeps on that lock (`LockWatches`); one blocked by an expired
 * holder's lock-delay markers, or a caller without a place in the queue, watches deletions of those
 * keys.
 *
 * No lost wake-ups, no sync delay. A watch that starts at a past revision is "unsynced" in etcd:
 * its events arrive from a background loop that runs every 100 ms, which would add up to 100 ms
 * to a hand-off (etcd's own `concurrency.Mutex` pays that). So the watch starts at the current
 * revision (delivered at once), and the gap between the waiter's read and the watch's creation is
 * closed by reading the watched keys once the watch is active: a key already gone (or replaced)
 * wakes the waiter right away.
 */
import type { IEvent, IKeyValue, IWatchResponse, Watcher } from 'etcd3';
import type { HandOff } from '../core/backend.js';
import { rangeEnd } from './keys.js';
import { deadline, op, readKvs, type EtcdClient } from './rpc.js';

/** What to watch: deletions of single keys, or (with `prefix`) of every key under a prefix. */
export interface WatchTarget {
  readonly keys: readonly string[];
  /** The create revision each key had when the waiter read it (same order as `keys`); a different one counts as deleted. */
  readonly revisions?: readonly string[];
  readonly prefix?: string;
  /** The revision of the read that chose the keys: changes after it must wake the waiter. Unknown: nothing to catch up. */
  readonly afterRevision?: bigint;
  /** Instead of deletions of `keys`: every change under a prefix, without a gap, applied to the waiter's view. */
  readonly follow?: Follow;
}

/**
 * A waiter blocked by requests ahead follows every change under its lock after the revision of
 * the view it read (etcd sends a watch's events in order, each revision whole), so its view stays
 * exact and it can tell it holds the key without reading again. The watch is trusted only while
 * its stream has never broken; after a break the waiter is told to ask.
 */
export interface Follow {
  /** The waiter's own entry: a new target for the same entry keeps a watch that is still following. */
  readonly id: string;
  readonly prefix: string;
  readonly from: bigint;
  /** Applies events after the view (one watch response's): the grant now held, a plain wake-up (ask again), or nothing yet. */
  apply(events: readonly IEvent[]): HandOff | 'wake' | undefined;
  /** Starts the view again from every key under `prefix` at a later revision (the shared watch's view); the same outcomes as `apply`. */
  restart(kvs: readonly IKeyValue[]): HandOff | 'wake' | undefined;
}

/** How long a watch may take to be created before we stop waiting for it (it still works if it arrives later). */
const CREATE_TIMEOUT_MS = 2_000;
/** Idle lock watches (no follower) a backend keeps open at most; past it, the one idle longest goes. */
const MAX_IDLE_WATCHES = 256;

/**
 * One watch per lock and client, shared by every waiter of that client that follows the lock (see
 * `Follow`), kept open for `lingerMs` after the last one leaves. A client that waits on the same lock
 * again — a worker in a loop, the usual case under contention — finds the watch running and its
 * view of the lock exact: it joins with no new watch and no read, so a contended acquire + release
 * costs etcd the two transactions and nothing else.
 *
 * The view is the lock's keys at the revision of the last event (or of the first read); events come
 * whole and in order. A waiter whose own view is older than the shared one starts from the shared
 * one; one whose view is newer keeps its own and is fed only the events after it (every event after
 * the watch's start is delivered, so none is missed). A broken stream ends the watch and tells every
 * follower to ask; the next wait opens a new one.
 */
export class LockWatches {
  readonly #watches = new Map<string, LockWatch>();
  /** Idle watches, oldest first (a Map keeps insertion order). */
  readonly #idle = new Map<LockWatch, NodeJS.Timeout>();
  #closed = false;

  constructor(
    private readonly client: EtcdClient,
    private readonly timeoutMs: number,
    private readonly lingerMs: number,
  ) {}

  /**
   * Follows `follow` on its lock's watch. `settle` is called at most once, with the hand-off or a
   * plain wake-up; `ready` resolves once the watch is active and the follower's view is exact.
   */
  attach(follow: Follow, settle: (outcome: HandOff | 'wake') => void): { ready: Promise<void>; detach: () => void } {
    if (this.#closed) return { ready: Promise.resolve(), detach: () => {} };
    let watch = this.#watches.get(follow.prefix);
    if (!watch) {
      watch = new LockWatch(
        this.client,
        follow.prefix,
        this.timeoutMs,
        (w) => this.#ended(w),
        (w) => this.#idled(w),
      );
      this.#watches.set(follow.prefix, watch);
    }
    const timer = this.#idle.get(watch);
    if (timer) {
      clearTimeout(timer);
      this.#idle.delete(watch);
    }
    return watch.add(follow, settle);
  }

  close(): void {
    this.#closed = true;
    for (const timer of this.#idle.values()) clearTimeout(timer);
    this.#idle.clear();
    for (const w of [...this.#watches.values()]) w.end(false);
    this.#watches.clear();
  }

  #ended(w: LockWatch): void {
    if (this.#watches.get(w.prefix) === w) this.#watches.delete(w.prefix);
    const timer = this.#idle.get(w);
    if (timer) clearTimeout(timer);
    this.#idle.delete(w);
  }

  #idled(w: LockWatch): void {
    if (this.#closed || this.lingerMs <= 0) return w.end(false);
    const timer = setTimeout(() => w.end(false), this.lingerMs);
    timer.unref();
    this.#idle.set(w, timer);
    if (this.#idle.size > MAX_IDLE_WATCHES) this.#idle.keys().next().value?.end(false);
  }
}

interface Follower {
  readonly follow: Follow;
  readonly settle: (outcome: HandOff | 'wake') => void;
  /** Events at or below this revision are in the follower's view already. */
  after: bigint;
  joined: boolean;
}

class LockWatch {
  readonly #kvs = new Map<string, IKeyValue>();
  /** The view is exact at this revision; undefined until the watch is active and the lock was read. */
  #revision: bigint | undefined;
  readonly #followers = new Set<Follower>();
  readonly #watcher: Watcher;
  readonly #ready: Promise<void>;
  #ended = false;
  #early: IEvent[] = [];

  constructor(
    client: EtcdClient,
    readonly prefix: string,
    timeoutMs: number,
    private readonly onEnd: (w: LockWatch) => void,
    private readonly onIdle: (w: LockWatch) => void,
  ) {
    // From the current revision (a watch from a past one is "unsynced", see the top of this file).
    const w = client.watch().prefix(prefix).watcher();
    this.#watcher = w;
    w.on('data', (res: IWatchResponse) => {
      if (this.#ended || res.events.length === 0) return;
      if (this.#revision === undefined) this.#early.push(...res.events);
      else this.#apply(res.events);
    });
    const lost = (): void => this.end(true);
    w.on('disconnected', lost);
    w.on('error', lost);
    this.#ready = (async () => {
      const created = await connected(w);
      if (this.#ended) return;
      if (created === undefined) return lost(); // not confirmed in time: let the waiters look
      try {
        const r = await client.kv.range({ key: Buffer.from(prefix), range_end: rangeEnd(Buffer.from(prefix)) }, deadline(timeoutMs));
        if (this.#ended) return;
        for (const kv of r.kvs) this.#kvs.set(kv.key.toString('utf8'), kv);
        this.#revision = BigInt(r.header.revision);
      } catch {
        return lost();
      }
      for (const f of [...this.#followers]) this.#join(f);
      const early = this.#early.splice(0);
      if (early.length > 0) this.#apply(early);
    })();
  }

  add(follow: Follow, settle: (outcome: HandOff | 'wake') => void): { ready: Promise<void>; detach: () => void } {
    const f: Follower = { follow, settle, after: follow.from, joined: false };
    this.#followers.add(f);
    if (this.#revision !== undefined) this.#join(f);
    return { ready: this.#ready, detach: () => this.#remove(f) };
  }

  /** Ends the watch; with `wake`, every follower is told to ask (the stream broke: events may be missed). */
  end(wake: boolean): void {
    if (this.#ended) return;
    this.#ended = true;
    void this.#watcher.cancel().catch(() => {});
    this.onEnd(this);
    const followers = [...this.#followers];
    this.#followers.clear();
    if (wake) for (const f of followers) f.settle('wake');
  }

  /** A follower whose view is older than ours starts from ours; one whose view is newer is fed what comes after it. */
  #join(f: Follower): void {
    if (f.joined || this.#ended) return;
    f.joined = true;
    if (this.#revision! >= f.follow.from) {
      f.after = this.#revision!;
      this.#outcome(f, f.follow.restart([...this.#kvs.values()]));
    }
  }

  #apply(events: readonly IEvent[]): void {
    const base = this.#revision!;
    const fresh = events.filter((ev) => BigInt(ev.kv.mod_revision) > base);
    if (fresh.length === 0) return;
    for (const ev of fresh) {
      const key = ev.kv.key.toString('utf8');
      if (ev.type === 'Delete') this.#kvs.delete(key);
      else this.#kvs.set(key, ev.kv);
      const rev = BigInt(ev.kv.mod_revision);
      if (rev > this.#revision!) this.#revision = rev;
    }
    for (const f of [...this.#followers]) {
      if (!f.joined) continue;
      const mine = fresh.filter((ev) => BigInt(ev.kv.mod_revision) > f.after);
      if (mine.length === 0) continue;
      f.after = this.#revision!;
      this.#outcome(f, f.follow.apply(mine));
      if (this.#ended) return;
    }
  }

  #outcome(f: Follower, outcome: HandOff | 'wake' | undefined): void {
    if (outcome === undefined || !this.#followers.has(f)) return;
    this.#remove(f);
    f.settle(outcome);
  }

  #remove(f: Follower): void {
    if (!this.#followers.delete(f) || this.#ended) return;
    if (this.#followers.size === 0) this.onIdle(this);
  }
}

/** A key watch whose stream broke follows again on a new one after this pause, doubled up to KEY_WATCH_RETRY_MAX_MS while it keeps failing. */
const KEY_WATCH_RETRY_MS = 100;
const KEY_WATCH_RETRY_MAX_MS = 2_000;
let keyWatchIds = 0;

/**
 * An observer's watch of one lock (`Backend.watch`): a follower of the lock's shared watch (see
 * `LockWatches`; a client that also waits on the lock shares it) that never settles, and calls
 * `onChange` after every batch of changes under the lock — a place taken or given up, a grant,
 * a release, an expiry (etcd deletes an expired lease's keys), a lock-delay marker's end. A broken
 * stream ends the shared watch: the observer is told (a change may have been missed), follows
 * again on a new watch after a short pause, and is told once more when that one is active.
 */
export class KeyWatch {
  #detach: (() => void) | undefined;
  #timer: NodeJS.Timeout | undefined;
  #retryMs = KEY_WATCH_RETRY_MS;
  #closed = false;

  constructor(
    private readonly shared: LockWatches,
    private readonly prefix: string,
    private readonly onChange: () => void,
  ) {}

  /** Follows the lock; resolves once the watch is active (or has failed: it is then tried again). */
  async start(again = false): Promise<void> {
    if (this.#closed) return;
    const follow: Follow = {
      id: `watch:${++keyWatchIds}`,
      prefix: this.prefix,
      from: 0n,
      apply: () => {
        this.#fire();
        return undefined;
      },
      // Joined (the watch is active): after a break, what happened meanwhile is told now.
      restart: () => {
        this.#retryMs = KEY_WATCH_RETRY_MS;
        if (again) this.#fire();
        return undefined;
      },
    };
    const { ready, detach } = this.shared.attach(follow, () => this.#broken());
    this.#detach = detach;
    await ready;
  }

  close(): void {
    this.#closed = true;
    if (this.#timer) clearTimeout(this.#timer);
    this.#detach?.();
    this.#detach = undefined;
  }

  #broken(): void {
    this.#detach = undefined;
    if (this.#closed) return;
    this.#fire();
    this.#timer = setTimeout(() => void this.start(true), this.#retryMs);
    this.#timer.unref();
    this.#retryMs = Math.min(this.#retryMs * 2, KEY_WATCH_RETRY_MAX_MS);
  }

  #fire(): void {
    if (this.#closed) return;
    try {
      this.onChange();
    } catch {
      // the observer's own error is not the watch's
    }
  }
}

/**
 * One waiter's watches. `target` moves them to new keys (closing the old watches); a deletion of a
 * watched key, or any watch error, calls `onChange`, after which the waiter asks again.
 */
export class Wake {
  #watchers: Watcher[] = [];
  #signature = '';
  /** The current watch follows its target (see Follow) and has neither broken nor ended. */
  #following = false;
  #generation = 0;
  #closed = false;
  /** Leaves the shared lock watch this waiter follows on (see LockWatches). */
  #detach: (() => void) | undefined;

  constructor(
    private readonly client: EtcdClient,
    private readonly onChange: (handOff?: HandOff) => void,
    private readonly timeoutMs: number,
    /** Where a follow target follows: the lock's watch, shared with this client's other waits on it. */
    private readonly shared: LockWatches,
  ) {}

  /** Watches `target` instead of what was watched before; resolves once the watches are active and the gap is checked. */
  async target(target: WatchTarget): Promise<void> {
    if (this.#closed) return;
    const follow = target.follow;
    const signature = follow
      ? JSON.stringify(['follow', follow.prefix, follow.id])
      : JSON.stringify([target.prefix ?? null, ...target.keys, ...(target.revisions ?? [])]);
    if (signature === this.#signature && (!follow || this.#following)) return;
    this.#signature = signature;
    this.#following = follow !== undefined;
    const generation = ++this.#generation;
    this.#cancel(this.#watchers);
    this.#watchers = [];
    this.#detach?.();
    this.#detach = undefined;
    const fire = (handOff?: HandOff): void => {
      if (!this.#closed && generation === this.#generation) this.onChange(handOff);
    };
    if (follow) {
      const { ready, detach } = this.shared.attach(follow, (outcome) => {
        if (generation === this.#generation) this.#following = false;
        if (outcome === 'wake') fire();
        else fire(outcome);
      });
      this.#detach = detach;
      await ready;
      return;
    }
    const watchers: Watcher[] = [];
    const builders = target.prefix !== undefined ? [this.client.watch().prefix(target.prefix)] : target.keys.map((k) => this.client.watch().key(k));
    for (const builder of builders) {
      // Only deletions (release, expiry, a waiter leaving) wake us. etcd3 1.1's `only('delete')` sets
      // the NOPUT filter as it should (its `ignore` is an alias of `only`, so `ignore('put')` would drop deletes).
      const w = builder.only('delete').watcher();
      w.on('delete', () => fire());
      w.on('error', () => fire()); // a canceled watch: ask again rather than wait blind
      watchers.push(w);
    }
    this.#watchers = watchers;
    const created = await Promise.all(watchers.map((w) => connected(w)));
    if (this.#closed || generation !== this.#generation) {
      this.#cancel(watchers);
      return;
    }
    // Close the gap between the waiter's read and the watches (a watch covers what comes after the
    // revision it reports, or a little more: never less).
    const after = target.afterRevision;
    if (after === undefined) return;
    if (created.some((rev) => rev === undefined)) return fire(); // not confirmed in time: let the waiter look
    if (created.every((rev) => rev! <= after)) return; // nothing was written in between
    if (target.prefix !== undefined) return fire();
    try {
      const r = await this.client.kv.txn({ compare: [], success: target.keys.map((k) => op.get(k)), failure: [] }, deadline(this.timeoutMs));
      const found = new Map(readKvs(r).map((kv) => [kv.key.toString('utf8'), String(kv.create_revision)]));
      const gone = target.keys.some((k, i) => !found.has(k) || (target.revisions?.[i] !== undefined && found.get(k) !== target.revisions[i]));
      if (gone) fire();
    } catch {
      fire();
    }
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#cancel(this.#watchers);
    this.#watchers = [];
    this.#detach?.();
    this.#detach = undefined;
  }

  #cancel(watchers: Watcher[]): void {
    for (const w of watchers) void w.cancel().catch(() => {});
  }
}

/** Resolves with the revision at which the watch was created, or undefined if it did not confirm in time or failed. */
function connected(w: Watcher): Promise<bigint | undefined> {
  return new Promise<bigint | undefined>((resolve) => {
    const timer = setTimeout(() => done(undefined), CREATE_TIMEOUT_MS);
    timer.unref();
    function onConnected(res: IWatchResponse): void {
      done(BigInt(res.header.revision));
    }
    function onError(): void {
      done(undefined);
    }
    function done(rev: bigint | undefined): void {
      clearTimeout(timer);
      w.off('connected', onConnected);
      w.off('error', onError);
      resolve(rev);
    }
    w.once('connected', onConnected);
    w.once('error', onError);
  });
}

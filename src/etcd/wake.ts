/**
 * Wake-ups for waiters: a waiter blocked by requests ahead follows every change under its lock (see
 * `Follow`); one blocked by an expired holder's lock-delay markers, or a caller without a place in
 * the queue, watches deletions of those keys.
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
  /** Starts the view again from a read of every key under `prefix`; the same outcomes as `apply`. */
  restart(kvs: readonly IKeyValue[]): HandOff | 'wake' | undefined;
}

/** How long a watch may take to be created before we stop waiting for it (it still works if it arrives later). */
const CREATE_TIMEOUT_MS = 2_000;

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

  constructor(
    private readonly client: EtcdClient,
    private readonly onChange: (handOff?: HandOff) => void,
    private readonly timeoutMs: number,
  ) {}

  /** Watches `target` instead of what was watched before; resolves once the watches are active and the gap is checked. */
  async target(target: WatchTarget): Promise<void> {
    if (this.#closed) return;
    const follow = target.follow;
    const signature = follow ? JSON.stringify(['follow', follow.prefix, follow.id]) : JSON.stringify([target.prefix ?? null, ...target.keys, ...(target.revisions ?? [])]);
    if (signature === this.#signature && (!follow || this.#following)) return;
    this.#signature = signature;
    this.#following = follow !== undefined;
    const generation = ++this.#generation;
    this.#cancel(this.#watchers);
    const fire = (handOff?: HandOff): void => {
      if (!this.#closed && generation === this.#generation) this.onChange(handOff);
    };
    if (follow) {
      await this.#follow(follow, generation, fire);
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

  /**
   * Follows every change under the lock after the waiter's view. The watch starts at the current
   * revision (a watch from a past revision is "unsynced": its events would come from etcd's 100 ms
   * catch-up loop, which would delay the hand-off). If anything was written between the view and
   * the watch, the lock is read again at a revision the watch covers and the view starts from that
   * read; events up to the view's revision are skipped. Trusted only while the stream never broke.
   */
  async #follow(follow: Follow, generation: number, fire: (handOff?: HandOff) => void): Promise<void> {
    const w = this.client.watch().prefix(follow.prefix).watcher();
    let broken = false;
    let base: bigint | undefined; // events at or below it are in the view already; undefined: not ready yet
    const early: IEvent[] = [];
    const end = (): void => {
      broken = true;
      if (generation === this.#generation) this.#following = false;
    };
    const settle = (outcome: HandOff | 'wake' | undefined): void => {
      if (outcome === undefined || broken) return;
      end();
      if (outcome === 'wake') fire();
      else fire(outcome);
    };
    const handle = (events: readonly IEvent[]): void => {
      const fresh = events.filter((ev) => BigInt(ev.kv.mod_revision) > base!);
      if (fresh.length > 0) settle(follow.apply(fresh));
    };
    w.on('data', (res: IWatchResponse) => {
      if (broken || res.events.length === 0) return;
      if (base === undefined) early.push(...res.events);
      else handle(res.events);
    });
    const lost = (): void => {
      if (broken) return;
      end();
      fire();
    };
    w.on('disconnected', lost);
    w.on('error', lost);
    this.#watchers = [w];
    const created = await connected(w);
    if (this.#closed || generation !== this.#generation) {
      this.#cancel([w]);
      return;
    }
    if (broken) return;
    if (created === undefined) return lost(); // not confirmed in time: let the waiter look
    if (created > follow.from) {
      try {
        const r = await this.client.kv.range({ key: Buffer.from(follow.prefix), range_end: rangeEnd(Buffer.from(follow.prefix)) }, deadline(this.timeoutMs));
        if (broken) return;
        base = BigInt(r.header.revision);
        settle(follow.restart(r.kvs));
      } catch {
        return lost();
      }
    } else {
      base = follow.from;
    }
    if (early.length > 0) handle(early.splice(0));
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#cancel(this.#watchers);
    this.#watchers = [];
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

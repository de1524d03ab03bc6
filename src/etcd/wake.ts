/**
 * Wake-ups for waiters: etcd watches on exactly the keys a waiter waits for (its predecessor in the
 * queue, or the lock-delay markers that block it).
 *
 * No lost wake-ups, no sync delay. A watch that starts at a past revision is "unsynced" in etcd:
 * its events arrive from a background loop that runs every 100 ms, which would add up to 100 ms
 * to a hand-off (etcd's own `concurrency.Mutex` pays that). So the watch starts at the current
 * revision (delivered at once), and the gap between the waiter's read and the watch's creation is
 * closed by reading the watched keys once the watch is active: a key already gone (or replaced)
 * wakes the waiter right away.
 */
import type { IWatchResponse, Watcher } from 'etcd3';
import { deadline, op, readKvs, type EtcdClient } from './rpc.js';

/** What to watch: deletions of single keys, or (with `prefix`) of every key under a prefix. */
export interface WatchTarget {
  readonly keys: readonly string[];
  /** The create revision each key had when the waiter read it (same order as `keys`); a different one counts as deleted. */
  readonly revisions?: readonly string[];
  readonly prefix?: string;
  /** The revision of the read that chose the keys: changes after it must wake the waiter. Unknown: nothing to catch up. */
  readonly afterRevision?: bigint;
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
  #generation = 0;
  #closed = false;

  constructor(
    private readonly client: EtcdClient,
    private readonly onChange: () => void,
    private readonly timeoutMs: number,
  ) {}

  /** Watches `target` instead of what was watched before; resolves once the watches are active and the gap is checked. */
  async target(target: WatchTarget): Promise<void> {
    if (this.#closed) return;
    const signature = JSON.stringify([target.prefix ?? null, ...target.keys, ...(target.revisions ?? [])]);
    if (signature === this.#signature) return;
    this.#signature = signature;
    const generation = ++this.#generation;
    this.#cancel(this.#watchers);
    const fire = (): void => {
      if (!this.#closed && generation === this.#generation) this.onChange();
    };
    const watchers: Watcher[] = [];
    const builders = target.prefix !== undefined ? [this.client.watch().prefix(target.prefix)] : target.keys.map((k) => this.client.watch().key(k));
    for (const builder of builders) {
      // Only deletions (release, expiry, a waiter leaving) wake us. etcd3 1.1's `only('delete')` sets
      // the NOPUT filter as it should (its `ignore` is an alias of `only`, so `ignore('put')` would drop deletes).
      const w = builder.only('delete').watcher();
      w.on('delete', fire);
      w.on('error', fire); // a canceled watch: ask again rather than wait blind
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

/**
 * Wake-ups for waiters: etcd watches on exactly the keys a waiter waits for (its predecessor in the
 * queue, or the lock-delay markers that block it), started just after the revision at which the
 * waiter saw them, so a deletion between that read and the watch is replayed, never lost.
 */
import type { Watcher } from 'etcd3';
import type { EtcdClient } from './rpc.js';

/** What to watch: deletions of single keys, or (with `prefix`) of every key under a prefix. */
export interface WatchTarget {
  readonly keys: readonly string[];
  readonly prefix?: string;
  /** Watch from the revision after this one (the revision of the read that chose the keys); from now when absent. */
  readonly afterRevision?: bigint;
}

/** How long a watch may take to be created before we stop waiting for it (it is still used if it arrives). */
const CREATE_TIMEOUT_MS = 2_000;

/**
 * One waiter's watches. `target` moves them to new keys (closing the old watches); any deletion
 * of a watched key, and any watch error, calls `onChange`, after which the waiter asks again.
 */
export class Wake {
  #watchers: Watcher[] = [];
  #signature = '';
  #generation = 0;
  #closed = false;

  constructor(
    private readonly client: EtcdClient,
    private readonly onChange: () => void,
  ) {}

  /** Watches `target` instead of what was watched before; resolves once the watches are active (or failed, which wakes the waiter). */
  async target(target: WatchTarget): Promise<void> {
    if (this.#closed) return;
    const signature = JSON.stringify([target.prefix ?? null, ...target.keys]);
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
      if (target.afterRevision !== undefined) builder.startRevision((target.afterRevision + 1n).toString());
      const w = builder.only('delete').watcher();
      w.on('delete', fire);
      w.on('error', fire); // compacted history, a canceled watch: ask again rather than wait blind
      watchers.push(w);
    }
    this.#watchers = watchers;
    await Promise.all(watchers.map((w) => connected(w)));
    if (this.#closed || generation !== this.#generation) this.#cancel(watchers);
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

function connected(w: Watcher): Promise<void> {
  return new Promise<void>((resolve) => {
    const timer = setTimeout(done, CREATE_TIMEOUT_MS);
    timer.unref();
    function done(): void {
      clearTimeout(timer);
      w.off('connected', done);
      w.off('error', done);
      resolve();
    }
    w.once('connected', done);
    w.once('error', done);
  });
}

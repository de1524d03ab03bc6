import { InvalidArgumentError } from './errors.js';
import type { Lease } from './lease.js';
import { checkKnownOptions, checkObject, checkSignal, checkTtl, describe } from './validate.js';

/** The current leader as any client sees it (`Election.leader()`, `observe()`). */
export interface Leader {
  /** What the leader published with `campaign({ value })` (its grant's label): an address, a name. */
  readonly value: string;
  /** The leader's term: its lease's fencing token, larger than every earlier term of the key. */
  readonly token: bigint;
  /** Until the coordinator would consider the term over unless renewed, by its clock. */
  readonly expiresInMs: number;
}

export interface ElectionOptions {
  /** The leadership lease's ttl: how long a crashed leader keeps the term. @default the client's default ttl */
  ttlMs?: number;
}

/** What an election needs from its client (a `Locks`). */
export interface ElectionClient {
  acquire(key: string, options: Record<string, unknown>): Promise<Lease>;
  inspect(prefix?: string): Promise<readonly { key: string; holders: readonly { mode: string; token: bigint; holder: string; expiresInMs: number }[] }[]>;
  watch(key: string, onChange: () => void): Promise<(() => void) | undefined>;
}

/** Re-read this often while observing a backend that sends change notifications (in case one is lost). */
const OBSERVE_FALLBACK_MS = 2_000;
/** Re-read this often while observing a backend that sends none. */
const OBSERVE_POLL_MS = 250;

/**
 * Leader election on one key: leadership is an exclusive lease, its token the term (I10). The
 * loop (`lead`), the record (the lease and its label) and the term (the token) are apart, as
 * client-go keeps `RunOrDie` apart from its lock record.
 *
 * What it guarantees: no two terms are valid at once, as no two leases of a key are (the leader's
 * `lease.signal` aborts before another client can be elected, I6); a deposed leader that writes
 * late through a fence with its term is refused (I3). What it does not: a leader that is frozen
 * cannot stop its own in-flight work — pass the term (`lease.token` / `lease.sequencer`) to what
 * the leader writes.
 */
export class Election {
  readonly key: string;
  readonly #client: ElectionClient;
  readonly #ttlMs: number | undefined;

  constructor(client: ElectionClient, key: string, options?: ElectionOptions) {
    const o = checkObject(options, 'options');
    checkKnownOptions(o, ['ttlMs'], 'options');
    this.#client = client;
    this.key = key;
    this.#ttlMs = o.ttlMs === undefined ? undefined : checkTtl(o.ttlMs, 'options.ttlMs');
  }

  /**
   * Waits (without limit, unless `signal` aborts) until this client leads, and resolves with the
   * leadership: a Lease renewed in the background whose token is the term. `value` is published as
   * the grant's label (`leader().value`). `lease.release()` resigns: the next campaigner is elected
   * at once.
   */
  campaign(options?: { value?: string; signal?: AbortSignal }): Promise<Lease> {
    const o = checkObject(options, 'options');
    checkKnownOptions(o, ['value', 'signal'], 'options');
    return this.#client.acquire(this.key, {
      mode: 'exclusive',
      waitMs: Number.POSITIVE_INFINITY,
      ...(this.#ttlMs !== undefined && { ttlMs: this.#ttlMs }),
      ...(o.value !== undefined && { label: o.value }),
      ...(o.signal !== undefined && { signal: o.signal }),
    });
  }

  /** The current leader, or null: for any client, campaigning or not. */
  async leader(): Promise<Leader | null> {
    const states = await this.#client.inspect(this.key);
    const state = states.find((s) => s.key === this.key);
    const h = state?.holders.find((x) => x.mode === 'exclusive');
    return h ? { value: h.holder, token: h.token, expiresInMs: h.expiresInMs } : null;
  }

  /**
   * The leader (or null) now, then each time it changes, in order, until `signal` aborts. Changes
   * are learnt from the backend's change notifications where it has them (re-read every 2 s in
   * case one is lost), else by reading every 250 ms. A change between two reads that ends where it
   * started is not seen (a read sees states, not events); terms are never reported out of order.
   */
  async *observe(options?: { signal?: AbortSignal }): AsyncGenerator<Leader | null, void, undefined> {
    const o = checkObject(options, 'options');
    checkKnownOptions(o, ['signal'], 'options');
    const signal = o.signal === undefined ? undefined : checkSignal(o.signal, 'options.signal');
    let dirty = false;
    let wake: (() => void) | undefined;
    const kick = (): void => {
      dirty = true;
      wake?.();
    };
    const stop = await this.#client.watch(this.key, kick);
    const interval = stop ? OBSERVE_FALLBACK_MS : OBSERVE_POLL_MS;
    let last: bigint | null | undefined;
    try {
      while (!signal?.aborted) {
        dirty = false;
        const leader = await this.leader();
        const term = leader ? leader.token : null;
        // A read can only move forward: an older term than one already reported is a stale read.
        if (term !== last && !(term !== null && typeof last === 'bigint' && term < last)) {
          last = term;
          yield leader;
        }
        if (dirty || signal?.aborted) continue;
        await new Promise<void>((resolve) => {
          const done = (): void => {
            clearTimeout(timer);
            signal?.removeEventListener('abort', done);
            wake = undefined;
            resolve();
          };
          const timer = setTimeout(done, interval);
          signal?.addEventListener('abort', done, { once: true });
          wake = done;
        });
      }
    } finally {
      stop?.();
    }
  }

  /**
   * The leader's loop (client-go's RunOrDie, Curator's autoRequeue): campaigns, runs `fn(lease)`
   * for the term — `lease.signal` aborts when the term is lost; `fn` should stop then — resigns
   * when `fn` returns, and campaigns again, until `signal` aborts (resolves) or `fn` throws while
   * the term was still held (resigns, then rejects with that error). A term lost while `fn` ran is
   * not an error: the loop campaigns again.
   */
  async lead(fn: (lease: Lease) => unknown, options?: { value?: string; signal?: AbortSignal }): Promise<void> {
    if (typeof fn !== 'function') throw new InvalidArgumentError('fn', `expected a function, got ${describe(fn)}`);
    const o = checkObject(options, 'options');
    checkKnownOptions(o, ['value', 'signal'], 'options');
    const signal = o.signal as AbortSignal | undefined;
    while (!signal?.aborted) {
      let lease: Lease;
      try {
        lease = await this.campaign(o as { value?: string; signal?: AbortSignal });
      } catch (error) {
        if (signal?.aborted) return;
        throw error;
      }
      try {
        await fn(lease);
      } catch (error) {
        const lost = lease.signal.aborted;
        await lease.release().catch(() => {});
        if (!lost) throw error;
        continue;
      }
      await lease.release().catch(() => {});
    }
  }
}

/**
 * The names a request's keys carry (`<tag>.<n>`) in place of its owner id, and their reuse.
 *
 * Owners are new for every acquire call, and naming keys after them would leave etcd one more key
 * under the lock for every request ever made: etcd keeps a deleted key in its index until the next
 * compaction, and every transaction that ranges over the lock (the guards of a grant, a waiter's
 * read) walks all of them. Measured without compaction, one lock slowed from 900 to 265
 * acquire+release pairs/s after 23,000 grants. With names reused, the keys under a lock stay as many
 * as the requests of each client that were ever in flight at once. A name is used again only once
 * the transaction that deleted both its keys has answered, and never after a call under it may have
 * written without our knowing (a timeout, a lost answer) or after a grant may have expired with a
 * lock-delay marker still running: such names are retired, and the next request gets a new one.
 */
import { randomBytes } from 'node:crypto';
import type { LockMode } from '../core/validate.js';
import { encodePart } from './keys.js';

/** Names given back by confirmed deletions, kept for reuse (across all lock keys; the oldest lock's go first past this). */
const MAX_FREE_NAMES = 1_024;
/** How often acquire sweeps the names of requests that ended without telling the backend (a lease lost, not released). */
const NAME_SWEEP_MS = 1_000;

/** One owner's name: one per owner for as long as the backend may still act on that owner's keys. */
export interface RequestName {
  readonly key: string;
  readonly name: string;
  /** The owner's request is a semaphore permit (its entry under `q/p/`): renew and release, told only the mode, find it by this. */
  readonly permit: boolean;
  /** The session of the owner's latest call: the name is retired when that session ends. */
  session: string | undefined;
  /** For a request on a lease of its own: past this (monotonic ms) the lease is certainly gone and the name is retired. */
  ownUntil: number | undefined;
  /** A call of this owner failed with an unknown outcome: something under the name may yet be written. Never reused. */
  tainted: boolean;
  /**
   * The caller gave up (cancelWait) while a call of its was still running: what that call writes
   * (a place, a grant) is nobody's, and is deleted again when it ends.
   */
  cancelled?: boolean;
}

export class RequestNames {
  /** This backend object's part of request names: random, so no two clients' names meet under a lock. */
  readonly #tag = randomBytes(6).toString('hex');
  #seq = 0;
  readonly #names = new Map<string, RequestName>();
  /** Lock key → names whose keys are known deleted there, ready for the next request on that lock. */
  readonly #free = new Map<string, string[]>();
  #freeCount = 0;
  #sweptAt = 0;
  #closed = false;

  /** The owner's name, if it has one. */
  get(owner: string): RequestName | undefined {
    return this.#names.get(owner);
  }

  /**
   * The name of a request's keys: the owner's name if it has one on this lock, else a name given
   * back on this lock (its keys known deleted), else a new one.
   */
  for(req: {
    readonly key: string;
    readonly owner: string;
    readonly mode: LockMode;
    readonly limit?: number | undefined;
    readonly session?: string | undefined;
  }): RequestName {
    const existing = this.#names.get(req.owner);
    if (existing && existing.key === req.key) return existing;
    if (existing) this.done(req.owner, false);
    const free = this.#free.get(req.key);
    let name = free?.pop();
    if (name !== undefined) {
      this.#freeCount--;
      if (free!.length === 0) this.#free.delete(req.key);
    } else name = `${this.#tag}.${(++this.#seq).toString(36)}`;
    const permit = req.mode === 'shared' && req.limit !== undefined;
    const nm: RequestName = { key: req.key, name, permit, session: req.session, ownUntil: undefined, tainted: false };
    this.#names.set(req.owner, nm);
    return nm;
  }

  /** The name an owner's keys carry; for an owner this backend does not know, one under which nothing exists. */
  of(key: string, owner: string): string {
    const nm = this.#names.get(owner);
    return nm && nm.key === key ? nm.name : `${this.#tag}-${encodePart(owner)}`;
  }

  /** The owner is done with its name: given back for reuse when its keys are known deleted, else retired. */
  done(owner: string, deleted: boolean): void {
    const nm = this.#names.get(owner);
    if (!nm) return;
    this.#names.delete(owner);
    if (!deleted || nm.tainted || this.#closed) return;
    let free = this.#free.get(nm.key);
    if (free)
      this.#free.delete(nm.key); // re-inserted last: the lock used most recently
    else free = [];
    free.push(nm.name);
    this.#free.set(nm.key, free);
    this.#freeCount++;
    while (this.#freeCount > MAX_FREE_NAMES) {
      const [oldest, names] = this.#free.entries().next().value as [string, string[]];
      this.#free.delete(oldest);
      this.#freeCount -= names.length;
    }
  }

  /** Retires the names bound to a session that ended (its entries went with its lease; lock-delay markers may stay). */
  retireSession(session: string): void {
    for (const [owner, nm] of this.#names) if (nm.session === session) this.done(owner, false);
  }

  /**
   * At most every NAME_SWEEP_MS: retires the names of requests on a lease of their own that is
   * certainly over (lost or left to expire, never released), unless the owner still waits (`waiting`).
   */
  sweep(now: number, waiting: (owner: string) => boolean): void {
    if (now - this.#sweptAt < NAME_SWEEP_MS) return;
    this.#sweptAt = now;
    for (const [owner, nm] of this.#names) {
      if (nm.ownUntil !== undefined && nm.ownUntil < now && !waiting(owner)) this.done(owner, false);
    }
  }

  /** Forgets every name; none is given back for reuse afterwards. */
  close(): void {
    this.#closed = true;
    this.#names.clear();
    this.#free.clear();
    this.#freeCount = 0;
  }
}

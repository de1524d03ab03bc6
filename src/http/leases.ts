import type { LockMode } from '../core/validate.js';

/** A grant the server made to one of this client's owners: what renew and release go through. */
export interface HeldLease {
  /** The server's opaque, secret lease handle (`lhl1.…`). */
  readonly handle: string;
  readonly token: bigint;
  readonly mode: LockMode;
  /** The session the lease lives by, if any (its entry goes with the session). */
  readonly session: string | undefined;
  /** performance.now() after which the server has surely let it expire (Infinity for a session's lease). */
  expiresAt: number;
}

/** After its expiry an entry is kept this much longer (a renewal in flight, clocks that run apart), then dropped. */
const EXPIRED_GRACE_MS = 60_000;

/** The table is swept of expired entries once per this many insertions: the cost stays constant per grant. */
const SWEEP_EVERY = 256;

/**
 * The lease handles of this client, by (key, owner). Core names a grant by key, owner and token;
 * the server by its handle; this table joins the two. An entry goes when its lease is released,
 * renewal says it is lost, its session ends, or (for a lease that simply ran out: core sends nothing
 * then) some time after its expiry, so the table holds about the leases alive, never more.
 */
export class LeaseTable {
  readonly #byOwner = new Map<string, HeldLease>();
  readonly #bySession = new Map<string, Set<string>>();
  #inserted = 0;

  get size(): number {
    return this.#byOwner.size;
  }

  /** The entry of (key, owner), if it holds `token` (any token when undefined). */
  get(key: string, owner: string, token?: bigint): HeldLease | undefined {
    const held = this.#byOwner.get(id(key, owner));
    return held && (token === undefined || held.token === token) ? held : undefined;
  }

  set(key: string, owner: string, lease: HeldLease): void {
    const k = id(key, owner);
    this.#unlink(k);
    this.#byOwner.set(k, lease);
    if (lease.session !== undefined) {
      let set = this.#bySession.get(lease.session);
      if (!set) this.#bySession.set(lease.session, (set = new Set()));
      set.add(k);
    }
    if (++this.#inserted % SWEEP_EVERY === 0) this.#sweep(performance.now());
  }

  /** Drops (key, owner)'s entry if it is still `lease` (a newer grant of the same owner stays). */
  drop(key: string, owner: string, lease: HeldLease): void {
    const k = id(key, owner);
    if (this.#byOwner.get(k) === lease) this.#unlink(k);
  }

  /** Drops every lease of a session (ended or lost): returns them. */
  dropSession(session: string): HeldLease[] {
    const keys = this.#bySession.get(session);
    if (!keys) return [];
    const dropped: HeldLease[] = [];
    for (const k of [...keys]) {
      const lease = this.#byOwner.get(k);
      if (lease) dropped.push(lease);
      this.#unlink(k);
    }
    this.#bySession.delete(session);
    return dropped;
  }

  /** The leases of a session, without dropping them. */
  ofSession(session: string): { key: string; owner: string; lease: HeldLease }[] {
    const keys = this.#bySession.get(session);
    if (!keys) return [];
    return [...keys].flatMap((k) => {
      const lease = this.#byOwner.get(k);
      return lease ? [{ ...split(k), lease }] : [];
    });
  }

  clear(): void {
    this.#byOwner.clear();
    this.#bySession.clear();
  }

  #unlink(k: string): void {
    const lease = this.#byOwner.get(k);
    if (!lease) return;
    this.#byOwner.delete(k);
    if (lease.session === undefined) return;
    const set = this.#bySession.get(lease.session);
    set?.delete(k);
    if (set?.size === 0) this.#bySession.delete(lease.session);
  }

  #sweep(now: number): void {
    for (const [k, lease] of this.#byOwner) if (lease.expiresAt + EXPIRED_GRACE_MS < now) this.#unlink(k);
  }
}

/** One string for (key, owner) that no other pair makes: the owner's length first. */
function id(key: string, owner: string): string {
  return `${owner.length}:${owner}${key}`;
}

function split(k: string): { key: string; owner: string } {
  const colon = k.indexOf(':');
  const n = Number(k.slice(0, colon));
  return { owner: k.slice(colon + 1, colon + 1 + n), key: k.slice(colon + 1 + n) };
}

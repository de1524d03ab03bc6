/**
 * Client sessions on etcd leases (etcd's `concurrency.Session`): one lease per session carries
 * every lock of that client, renewed by one LeaseKeepAlive round whatever the number of locks.
 * Core drives the keep-alives (`keepAlive` is one round trip) instead of etcd3's automatic loop, so
 * a keep-alive that fails or finds the lease gone reaches core's loss detection at once (I6) and
 * validity is counted from the request (I5).
 *
 * Lock-delay (I8) of a session's locks hangs on a second lease per delay (`delayLease`), granted
 * for the session's ttl + the delay + 1 s and refreshed in the same keep-alive stream right before
 * the session's lease, so a marker outlives the session's entries by at least its delay.
 */
import { EtcdLeaseInvalidError } from './driver.js';
import type { SessionSupport } from '../core/backend.js';
import { deadline, isLeaseNotFound, keepAliveOnce, mapError, revoke, type EtcdClient } from './rpc.js';

/** Extra second on lock-delay leases: covers the gap between refreshing a delay lease and its lock's lease. */
export const DELAY_MARGIN_S = 1;
/** A session not kept alive for this long (or three of its ttls, if longer) was given up by core, and is forgotten here. */
const FORGET_AFTER_MS = 30_000;

interface SessionRecord {
  /** The session's effective ttl; 0 until known (a session opened by another backend object). */
  ttlMs: number;
  /** lockDelayMs → the lease of lock-delay markers of this session's locks. */
  readonly delays: Map<number, Promise<string>>;
  /** Last open, keep-alive or acquire (monotonic ms): a session core stopped using (lost by validity) is forgotten. */
  usedAt: number;
}

export interface SessionTableOptions {
  readonly client: EtcdClient;
  /** Deadline of each etcd request. */
  readonly timeoutMs: number;
  /** Called when a session is known to have ended (its lease gone, closed or forgotten). */
  readonly onEnd: (session: string) => void;
}

/** The sessions this backend object knows of; `open`, `keepAlive` and `close` serve the backend's `sessions`. */
export class SessionTable implements SessionSupport {
  readonly #table = new Map<string, SessionRecord>();
  readonly #client: EtcdClient;
  readonly #timeoutMs: number;
  readonly #onEnd: (session: string) => void;

  constructor(options: SessionTableOptions) {
    this.#client = options.client;
    this.#timeoutMs = options.timeoutMs;
    this.#onEnd = options.onEnd;
  }

  /** The session's effective ttl, when known here. */
  ttlMs(id: string): number | undefined {
    return this.#table.get(id)?.ttlMs || undefined;
  }

  async open(ttlMs: number): Promise<{ id: string; ttlMs: number }> {
    try {
      const r = await this.#client.leaseClient.leaseGrant({ TTL: Math.ceil(ttlMs / 1000) }, deadline(this.#timeoutMs));
      const id = String(r.ID);
      const effective = Number(r.TTL) * 1000; // etcd raises a ttl below its minimum
      this.#table.set(id, { ttlMs: effective, delays: new Map(), usedAt: performance.now() });
      return { id, ttlMs: effective };
    } catch (error) {
      throw mapError('open session', error);
    }
  }

  /**
   * One LeaseKeepAlive stream: the session's lock-delay leases first, then the session's lease, so
   * a delay lease is never refreshed earlier than its session (its marker outlives the session's
   * entries by at least lockDelayMs). False when the session's lease is gone, or when a delay lease
   * is (revoked by someone: the lock-delay of this session's locks could no longer be kept).
   */
  async keepAlive(id: string): Promise<boolean> {
    const s = this.#table.get(id);
    if (s) s.usedAt = performance.now();
    try {
      const delayIds = s ? await settledLeases(s) : [];
      const ttls = await keepAliveOnce(this.#client, [...delayIds, id], this.#timeoutMs);
      if ((ttls.get(id) ?? 0) <= 0 || delayIds.some((d) => (ttls.get(d) ?? 0) <= 0)) {
        // Gone: its delay leases are left to expire (that is the lock-delay of an expiry).
        this.#table.delete(id);
        this.#onEnd(id);
        return false;
      }
      return true;
    } catch (error) {
      if (isLeaseNotFound(error)) {
        this.#onEnd(id);
        return false;
      }
      throw mapError('session keep-alive', error);
    }
  }

  /** Revokes the session's lease and its lock-delay leases: its locks are freed at once, without lock-delay (closed on purpose). */
  async close(id: string): Promise<void> {
    const s = this.#table.get(id);
    this.#table.delete(id);
    this.#onEnd(id);
    const delays = s ? await settledLeases(s) : [];
    try {
      await Promise.all([id, ...delays].map((lease) => revoke(this.#client, lease, this.#timeoutMs)));
    } catch (error) {
      throw mapError('close session', error);
    }
  }

  /** The lease of lock-delay markers of `session`'s locks with `lockDelayMs`: ttl = session ttl + delay + 1 s. */
  delayLease(session: string, lockDelayMs: number): Promise<string> {
    let s = this.#table.get(session);
    if (!s) this.#table.set(session, (s = { ttlMs: 0, delays: new Map(), usedAt: performance.now() }));
    s.usedAt = performance.now();
    const record = s;
    let lease = record.delays.get(lockDelayMs);
    if (!lease) {
      lease = (async () => {
        if (record.ttlMs <= 0) {
          const info = await this.#client.leaseClient.leaseTimeToLive({ ID: session }, deadline(this.#timeoutMs));
          if (!(Number(info.TTL) > 0)) throw new EtcdLeaseInvalidError(session); // the session is gone
          record.ttlMs = Number(info.grantedTTL) * 1000;
        }
        const sessionTtlS = record.ttlMs / 1000;
        const r = await this.#client.leaseClient.leaseGrant({ TTL: sessionTtlS + Math.ceil(lockDelayMs / 1000) + DELAY_MARGIN_S }, deadline(this.#timeoutMs));
        return String(r.ID);
      })();
      record.delays.set(lockDelayMs, lease);
      lease.catch(() => {
        if (record.delays.get(lockDelayMs) === lease) record.delays.delete(lockDelayMs);
      });
    }
    return lease;
  }

  /** Forgets sessions not kept alive for several ttls: core gave them up (their delay leases expire on their own, as they should). */
  forgetStale(now: number): void {
    for (const [id, s] of this.#table) {
      if (now - s.usedAt > Math.max(3 * s.ttlMs, FORGET_AFTER_MS)) {
        this.#table.delete(id);
        this.#onEnd(id);
      }
    }
  }
}

/** The session's lock-delay leases that were granted (one that failed is left out). */
async function settledLeases(s: SessionRecord): Promise<string[]> {
  return (await Promise.allSettled(s.delays.values())).flatMap((r) => (r.status === 'fulfilled' ? [r.value] : []));
}

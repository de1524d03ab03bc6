import { randomUUID } from 'node:crypto';
import type { SessionSupport } from '../core/backend.js';
import { answerError } from './errors.js';
import type { LeaseTable } from './leases.js';
import { type Transport, unavailable } from './transport.js';

/** A session this client keeps itself because the server's backend has none (see {@link HttpSessions}). */
const LOCAL_PREFIX = 'local:';

/** What the sessions need of the backend's lease calls, for a session kept on this side. */
export interface LeaseCalls {
  /** Renews one lease by its handle for `ttlMs`: true when renewed, false when the server says it is lost. */
  renewHandle(handle: string, ttlMs: number): Promise<boolean>;
  /** Releases one lease by its handle (best effort is the caller's to decide). */
  releaseHandle(handle: string): Promise<void>;
}

/**
 * Sessions over the service: `POST /v1/sessions`, `…/keepalive`, `DELETE …`; one keep-alive renews
 * every lease of the session, whatever the number of leases (core's SessionPool keeps one per ttl).
 *
 * A server whose backend has no sessions (Redlock; memory without them) answers 501. The client
 * then keeps its sessions itself: a "local" session is a list of leases acquired on their own, and
 * its keep-alive renews each of them, one request per lease. If any of them is lost, the keep-alive
 * answers false, so core marks every lease of the session lost (conservative, as a real session's
 * end is), and the others are released.
 */
export class HttpSessions implements SessionSupport {
  readonly #transport: Transport;
  readonly #leases: LeaseTable;
  readonly #calls: LeaseCalls;
  /** False once the server said it has no sessions (501): from then on they are kept here. */
  #serverSessions = true;
  /** The sessions kept here that are open: a keep-alive of one that was closed answers false. */
  readonly #local = new Set<string>();

  constructor(transport: Transport, leases: LeaseTable, calls: LeaseCalls) {
    this.#transport = transport;
    this.#leases = leases;
    this.#calls = calls;
  }

  /** True for a session this client keeps itself: acquires send no session then. */
  static isLocal(id: string): boolean {
    return id.startsWith(LOCAL_PREFIX);
  }

  async open(ttlMs: number): Promise<{ id: string; ttlMs: number }> {
    if (this.#serverSessions) {
      const answer = await this.#transport.send({ method: 'POST', path: '/v1/sessions', body: { ttlMs }, what: 'session open' });
      if (answer.status === 201 || answer.status === 200) {
        const b = answer.body as { session?: unknown; ttlMs?: unknown } | undefined;
        if (typeof b?.session !== 'string' || b.session.length === 0 || !Number.isSafeInteger(b.ttlMs))
          throw unavailable('session open: the answer has no session handle and ttlMs');
        return { id: b.session, ttlMs: b.ttlMs as number };
      }
      if (answer.status !== 501) throw answerError(answer, 'session open', this.#transport.where);
      this.#serverSessions = false;
    }
    const id = `${LOCAL_PREFIX}${randomUUID()}`;
    this.#local.add(id);
    return { id, ttlMs };
  }

  async keepAlive(id: string, ttlMs: number): Promise<boolean> {
    if (HttpSessions.isLocal(id)) return this.#keepLocal(id, ttlMs);
    const answer = await this.#transport.send({
      method: 'POST',
      path: `/v1/sessions/${encodeURIComponent(id)}/keepalive`,
      body: { ttlMs },
      what: 'session keep-alive',
    });
    if (answer.status === 200) return true;
    if (answer.status === 404) {
      // Gone at the server (expired, closed, unknown after a restart): its leases went with it.
      this.#leases.dropSession(id);
      return false;
    }
    throw answerError(answer, 'session keep-alive', this.#transport.where);
  }

  async close(id: string): Promise<void> {
    if (HttpSessions.isLocal(id)) {
      this.#local.delete(id);
      const leases = this.#leases.dropSession(id);
      await Promise.all(leases.map((l) => this.#calls.releaseHandle(l.handle)));
      return;
    }
    const answer = await this.#transport.send({ method: 'DELETE', path: `/v1/sessions/${encodeURIComponent(id)}`, what: 'session close' });
    // 204, or 404: nothing left to end either way.
    if (answer.status !== 204 && answer.status !== 200 && answer.status !== 404) throw answerError(answer, 'session close', this.#transport.where);
    this.#leases.dropSession(id);
  }

  /** A session kept here: renew each of its leases; one lost loses the session (and the rest are given back). */
  async #keepLocal(id: string, ttlMs: number): Promise<boolean> {
    if (!this.#local.has(id)) return false; // closed: its leases were given back
    const entries = this.#leases.ofSession(id);
    const renewed = await Promise.all(entries.map((e) => this.#calls.renewHandle(e.lease.handle, ttlMs)));
    const now = performance.now();
    if (renewed.every(Boolean)) {
      for (const e of entries) e.lease.expiresAt = now + ttlMs;
      return true;
    }
    this.#local.delete(id);
    const rest = this.#leases.dropSession(id);
    await Promise.allSettled(rest.map((l) => this.#calls.releaseHandle(l.handle)));
    return false;
  }
}

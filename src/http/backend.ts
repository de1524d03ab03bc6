/**
 * httpBackend: the client of the lock service (`leasehold serve`, docs/http-api.md). Each Backend
 * call is one request; what the service needs that core does not keep (the lease handles) is kept
 * here by (key, owner), in a table that holds about the leases alive (leases.ts).
 */
import { createHash } from 'node:crypto';
import type { AcquireRequest, AcquireResult, Backend, HolderState, KeyState, ReleaseRequest, RenewRequest, RenewResult, WatchKey } from '../core/backend.js';
import { InvalidArgumentError } from '../core/errors.js';
import { KeyWatchSet, type WatchedKey } from '../core/key-watches.js';
import type { LockMode } from '../core/validate.js';
import { answerError, errorBody } from './errors.js';
import { KeyEvents } from './events.js';
import { LeaseTable } from './leases.js';
import { HTTP_DEFAULTS, type HttpBackendOptions, resolveHttpOptions } from './options.js';
import { HttpSessions } from './sessions.js';
import { type Answer, BACKEND_NAME, Transport, unavailable } from './transport.js';

/** The owner ids core makes are 32 hex characters, sent as they are; any other string is sent hashed (the header takes 1–255 visible ASCII). */
const IDEMPOTENCY_KEY = /^[\x21-\x7e]{1,255}$/;

/**
 * A backend that is a client of `leasehold serve`: leases, tokens and fences shared with programs in
 * any language, through a stateless server over any leasehold backend.
 *
 * - Acquire sends the lease's secret owner id as the `Idempotency-Key`: the server derives its own
 *   owner from it, so a retried acquire (an answer lost or late) gets the same grant back (I5).
 * - Waiting is the server's long poll (`waitMs`, FIFO with its backend's queue, woken by its change
 *   notifications): core sends what is left of the wait (at most 25 s a request) and asks again at
 *   once, so there is no polling loop here. Aborting the wait aborts the request; the server then
 *   leaves the queue.
 * - Sessions are the server's (one keep-alive per client, not per lease); over a server whose
 *   backend has none, this client keeps them itself (sessions.ts).
 * - `watch` follows the server's event stream of the key, checked against `inspect` now and then.
 * - Errors: busy (409) and lost (410) are answers; a refused input (400) is an
 *   `InvalidArgumentError` naming the field; 401/403 are `InvalidArgumentError`s on `token`/`key`;
 *   an unreachable, slow or failing server is a `BackendUnavailableError('http', …)` (errors.ts).
 */
export function httpBackend(options: HttpBackendOptions): Backend {
  return new HttpBackend(resolveHttpOptions(options)).backend();
}

class HttpBackend {
  readonly #transport: Transport;
  readonly #leases = new LeaseTable();
  readonly #sessions: HttpSessions;
  readonly #events: KeyEvents;
  readonly #watches: KeyWatchSet<WatchedKey>;
  /** The acquire in flight of each (key, owner), settled or not: the next one of the pair waits for it. */
  readonly #asking = new Map<string, Promise<unknown>>();

  constructor(options: ReturnType<typeof resolveHttpOptions>) {
    this.#transport = new Transport(options);
    this.#sessions = new HttpSessions(this.#transport, this.#leases, {
      renewHandle: async (handle, ttlMs) => (await this.#renewHandle(handle, ttlMs)) !== undefined,
      releaseHandle: (handle) => this.#releaseHandle(handle),
    });
    this.#events = new KeyEvents(this.#transport);
    this.#watches = new KeyWatchSet({
      open: (key) => this.#watched(key),
      refreshMs: HTTP_DEFAULTS.watchRefreshMs,
      retryMs: HTTP_DEFAULTS.reconnectMs,
    });
  }

  backend(): Backend {
    const watch: WatchKey = (key, onChange) => this.#watches.watch(key, onChange);
    return {
      name: BACKEND_NAME,
      // fair: the server queues a long-polling waiter in its backend's queue: FIFO where that backend is
      // fair (GET /v1/health says whether it is; over Redlock it is not, whatever is declared here).
      capabilities: Object.freeze({ fair: true, minTtlMs: 0, maxWaitMs: HTTP_DEFAULTS.longPollMs }),
      acquire: (req) => this.#acquire(req),
      renew: (req) => this.#renew(req),
      release: (req) => this.#release(req),
      inspect: (prefix) => this.#inspect(prefix),
      close: async () => this.#close(),
      sessions: this.#sessions,
      watch,
    };
  }

  /**
   * One owner's acquires of a key go one after the other, never overlapping: two at once would be
   * one owner waiting twice at the server, where the first to end could cancel the shared queue
   * place or give back the grant the other is answered with (docs/http-api.md, Idempotency-Key).
   * Core asks again with the same owner after its own deadline passed while the request still ran:
   * that retry is sent once the first has its answer (each request is bounded by `timeoutMs` past
   * its wait), not beside it. A late answer of the first still reaches core, which gives it back.
   */
  #acquire(req: AcquireRequest): Promise<AcquireResult> {
    const id = `${req.owner.length}:${req.owner}${req.key}`;
    const before = this.#asking.get(id);
    const call = before ? before.then(() => this.#ask(req)) : this.#ask(req);
    const settled = call.then(
      () => {},
      () => {},
    );
    this.#asking.set(id, settled);
    void settled.then(() => {
      if (this.#asking.get(id) === settled) this.#asking.delete(id);
    });
    return call;
  }

  async #ask(req: AcquireRequest): Promise<AcquireResult> {
    const session = req.session !== undefined && !HttpSessions.isLocal(req.session) ? req.session : undefined;
    const waitMs = req.waitMs !== undefined && req.waitMs > 0 ? Math.min(Math.floor(req.waitMs), 60_000) : 0;
    const body = {
      ttlMs: req.ttlMs,
      mode: req.mode,
      lockDelayMs: req.lockDelayMs,
      label: req.holder,
      ...(req.limit !== undefined && { limit: req.limit }),
      ...(session !== undefined && { session }),
      ...(waitMs > 0 && { waitMs }),
    };
    let answer: Answer;
    try {
      answer = await this.#transport.send({
        method: 'POST',
        path: `/v1/locks/${keySegment(req.key)}/acquire`,
        body,
        headers: { 'idempotency-key': idempotencyKey(req.owner) },
        what: 'acquire',
        holdMs: waitMs,
        ...(waitMs > 0 && req.signal && { signal: req.signal }),
      });
    } catch (error) {
      if (waitMs > 0 && req.signal?.aborted && !this.#transport.closing.aborted) void this.#reclaim(req).catch(() => {});
      throw error;
    }
    if (answer.status === 200) return this.#granted(req, answer, session);
    const e = errorBody(answer);
    if (answer.status === 409) return { granted: false, ...(e.holder !== undefined && { holder: e.holder }) };
    // An acquire naming a session: the only 404 is that session being gone (a restart, an expiry).
    if (answer.status === 404 && session !== undefined && (e.field === undefined || e.field === 'session')) {
      this.#leases.dropSession(session);
      return { granted: false, sessionLost: true };
    }
    throw answerError(answer, 'acquire', this.#transport.where);
  }

  #granted(req: AcquireRequest, answer: Answer, session: string | undefined): AcquireResult {
    const b = answer.body as { lease?: unknown; token?: unknown; ttlMs?: unknown; mode?: unknown; sequencer?: unknown } | undefined;
    const token = parseToken(b?.token);
    if (typeof b?.lease !== 'string' || b.lease.length === 0 || token === undefined || !Number.isSafeInteger(b.ttlMs)) {
      throw unavailable('acquire: the grant has no lease handle, token or ttlMs');
    }
    const ttlMs = b.ttlMs as number;
    // A lease of a session lives by it; one of a local session (kept here) is renewed on its own by the session's keep-alive.
    const sessionOf = session ?? req.session;
    this.#leases.set(req.key, req.owner, {
      handle: b.lease,
      token,
      mode: b.mode === 'shared' || b.mode === 'exclusive' ? b.mode : req.mode,
      session: sessionOf,
      expiresAt: session !== undefined ? Number.POSITIVE_INFINITY : performance.now() + ttlMs,
    });
    // The server's sequencer (signed, `lh1s.`, by a service with --sequencer-key): core uses it if it names this grant.
    return { granted: true, token, ttlMs, ...(typeof b.sequencer === 'string' && b.sequencer.length > 0 && { sequencer: b.sequencer }) };
  }

  async #renew(req: RenewRequest): Promise<RenewResult> {
    const held = this.#leases.get(req.key, req.owner, req.token);
    if (!held) return { renewed: false }; // not ours, or not this grant: the server would say the same (I4)
    const ttlMs = await this.#renewHandle(held.handle, req.ttlMs);
    if (ttlMs === undefined) {
      this.#leases.drop(req.key, req.owner, held);
      return { renewed: false };
    }
    if (held.expiresAt !== Number.POSITIVE_INFINITY) held.expiresAt = performance.now() + ttlMs;
    return { renewed: true, ttlMs };
  }

  /** Renews by handle: the ttl applied, or undefined when the server says the lease is lost (410). */
  async #renewHandle(handle: string, ttlMs: number): Promise<number | undefined> {
    const answer = await this.#transport.send({ method: 'POST', path: `/v1/leases/${encodeURIComponent(handle)}/renew`, body: { ttlMs }, what: 'renew' });
    if (answer.status === 410) return undefined;
    if (answer.status !== 200) throw answerError(answer, 'renew', this.#transport.where);
    const applied = (answer.body as { ttlMs?: unknown } | undefined)?.ttlMs;
    return Number.isSafeInteger(applied) ? (applied as number) : ttlMs;
  }

  async #release(req: ReleaseRequest): Promise<void> {
    const held = this.#leases.get(req.key, req.owner, req.token);
    if (!held) return; // unknown owner or another grant: a no-op, as at any coordinator (I4)
    await this.#releaseHandle(held.handle);
    this.#leases.drop(req.key, req.owner, held);
  }

  async #releaseHandle(handle: string): Promise<void> {
    const answer = await this.#transport.send({ method: 'DELETE', path: `/v1/leases/${encodeURIComponent(handle)}`, what: 'release' });
    if (answer.status !== 204 && answer.status !== 200) throw answerError(answer, 'release', this.#transport.where);
  }

  /**
   * A long poll its caller cut while the server held it: the server leaves the queue when the
   * request goes, but a grant made at that very instant may be ours with its answer never read.
   * Ask once more with the same owner and no wait (an owner that holds the key gets its grant back)
   * and give back whatever that returns. Core has given up on this owner by then (it never asks
   * with it again), so nothing of its own is released.
   */
  async #reclaim(cut: AcquireRequest): Promise<void> {
    const { waitMs: _wait, signal: _signal, session: _session, ...again } = cut;
    const result = await this.#acquire(again);
    if (result.granted) await this.#release({ key: cut.key, owner: cut.owner, token: result.token, mode: cut.mode });
  }

  async #inspect(prefix: string): Promise<KeyState[]> {
    const query = prefix === '' ? '' : `?prefix=${encodeURIComponent(prefix)}`;
    const answer = await this.#transport.send({ method: 'GET', path: `/v1/locks${query}`, what: 'inspect' });
    if (answer.status !== 200) throw answerError(answer, 'inspect', this.#transport.where, 'prefix');
    const locks = (answer.body as { locks?: unknown } | undefined)?.locks;
    if (!Array.isArray(locks)) throw unavailable('inspect: the answer has no locks list');
    return locks.map(keyState);
  }

  /** A watched key: its events (the stream) and its state (inspect), for core's KeyWatchSet. */
  #watched(key: string): WatchedKey {
    return {
      listen: (heard) =>
        this.#events.listen(key, () => {
          heard.tell();
          heard.lookAgain();
        }),
      look: async () => {
        const state = (await this.#inspect(key)).find((s) => s.key === key);
        const soonest = state?.holders.reduce((m, h) => Math.min(m, h.expiresInMs), Number.POSITIVE_INFINITY);
        return {
          lastToken: String(state?.lastToken ?? 0n),
          holders: state?.holders.length ?? 0,
          soonestExpiryMs: soonest === undefined || soonest === Number.POSITIVE_INFINITY ? undefined : soonest,
        };
      },
    };
  }

  #close(): void {
    this.#watches.close();
    this.#transport.close();
    this.#leases.clear();
  }
}

/** A key as one path segment: every reserved character escaped (`/` too); a key that cannot be UTF-8 (a lone surrogate) is refused. */
function keySegment(key: string): string {
  try {
    return encodeURIComponent(key);
  } catch {
    throw new InvalidArgumentError('key', 'contains a lone UTF-16 surrogate, which cannot be sent as UTF-8');
  }
}

function idempotencyKey(owner: string): string {
  return IDEMPOTENCY_KEY.test(owner) ? owner : createHash('sha256').update(owner, 'utf8').digest('hex');
}

/** A decimal token string (the API never sends tokens as JSON numbers), as a bigint in [1, 2^63). */
function parseToken(value: unknown): bigint | undefined {
  if (typeof value !== 'string' || !/^[1-9][0-9]{0,18}$/.test(value)) return undefined;
  const token = BigInt(value);
  return token < 2n ** 63n ? token : undefined;
}

/** One entry of `GET /v1/locks`, checked: an answer that is not what the API says is a failed call, not bad data passed on. */
function keyState(raw: unknown): KeyState {
  const r = (raw ?? {}) as Record<string, unknown>;
  const lastToken = r.lastToken === '0' ? 0n : parseToken(r.lastToken);
  if (typeof r.key !== 'string' || lastToken === undefined || !Array.isArray(r.holders) || !isCount(r.waiters) || !isCount(r.lockDelayRemainingMs)) {
    throw unavailable('inspect: a lock entry is not { key, lastToken, holders, waiters, lockDelayRemainingMs }');
  }
  return {
    key: r.key,
    lastToken,
    holders: r.holders.map(holderState),
    waiters: r.waiters as number,
    lockDelayRemainingMs: r.lockDelayRemainingMs as number,
    ...(isCount(r.limit) && { limit: r.limit as number }),
  };
}

function holderState(raw: unknown): HolderState {
  const h = (raw ?? {}) as Record<string, unknown>;
  const token = parseToken(h.token);
  if ((h.mode !== 'exclusive' && h.mode !== 'shared') || token === undefined || typeof h.holder !== 'string' || typeof h.expiresInMs !== 'number') {
    throw unavailable('inspect: a holder entry is not { mode, token, holder, expiresInMs }');
  }
  return { mode: h.mode as LockMode, token, holder: h.holder, expiresInMs: h.expiresInMs };
}

function isCount(v: unknown): boolean {
  return typeof v === 'number' && Number.isFinite(v) && v >= 0;
}

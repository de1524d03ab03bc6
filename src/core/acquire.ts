import type { AcquireResult, Backend, HandOff } from './backend.js';
import { fullJitter, pause } from './backoff.js';
import type { Clock } from './clock.js';
import { AcquireTimeoutError, type LeaseholdError } from './errors.js';
import type { AcquireFailure, LockEvents, TypedEmitter } from './events.js';
import { CallTimeoutError, toLeaseholdError, withTimeout } from './call.js';
import type { LeaseImpl } from './lease.js';
import { WAITING, type ResolvedAcquire } from './options.js';
import type { Session, SessionPool } from './sessions.js';

/** How often one acquire opens a new session when the coordinator says it lost ours, before it reports busy. */
const MAX_SESSION_RETRIES = 2;

/** What an acquisition needs from its `Locks`. */
export interface AcquireContext {
  readonly backend: Backend;
  readonly clock: Clock;
  readonly events: TypedEmitter<LockEvents>;
  /** Public label sent with each request. */
  readonly holder: string;
  readonly operationTimeoutMs: number;
  readonly random: () => number;
  /** Aborted by `Locks.close()`. */
  readonly closing: AbortSignal;
  /** The client's sessions, when the backend has them. */
  readonly sessions: SessionPool | undefined;
  /**
   * A session the caller keeps alive itself and names in every request (acquireAs: the lock
   * service's client's session): a hand-off bound to it is taken as it comes. Only without `sessions`.
   */
  readonly boundSession?: string;
  /** Makes the lease of a grant (its keeper, its registration with `Locks`, the `acquired` event). */
  grant(grant: Grant): LeaseImpl;
}

/** A grant, as an acquisition hands it to `AcquireContext.grant`. */
export interface Grant {
  readonly key: string;
  readonly owner: string;
  readonly options: ResolvedAcquire;
  readonly token: bigint;
  /** The ttl the coordinator applied. */
  readonly ttlMs: number;
  /** The sequencer the coordinator issued with the grant (AcquireResult.sequencer), if any. */
  readonly sequencer?: string;
  /** When the request that was granted was sent: validity counts from there (I5). */
  readonly sentAt: number;
  /** When the acquire call began (for `waitedMs`). */
  readonly start: number;
  /** The session the grant is bound to, if any. */
  readonly session: Session | undefined;
}

/**
 * One `acquire` or `tryAcquire` call: asks the backend, waits (wake-up hook, else backoff with
 * jitter) until granted, `waitMs` runs out, the caller's signal aborts or `Locks` closes — and in
 * every case leaves nothing of its own behind at the coordinator.
 *
 * Late answers. A coordinator call is bounded (by `operationTimeoutMs`, and while waiting by what
 * is left of `waitMs`); an answer may still come after that. A queued request may have given the
 * owner a place from the moment it was sent, so the place is cancelled when the call ends without
 * the key, and again after every late answer, whatever it says and in whatever order they come; a
 * late grant is given back. Never while this call's own lease is held (a cancel ends the owner's
 * grant too), and never the grant this call ended with: a retry with the same owner gets an
 * earlier grant back (same token).
 */
export class Acquisition {
  readonly #ctx: AcquireContext;
  readonly #key: string;
  readonly #o: ResolvedAcquire;
  readonly #wait: boolean;
  readonly #signal: AbortSignal;
  readonly #ttlMs: number;
  readonly #start: number;
  readonly #waitMs: number;
  readonly #deadline: number;
  /** Secret owner id of this call's requests (I4). */
  readonly #owner = newOwnerId();
  /** The requests ask for a place in the queue (fair backend, a call that waits). */
  readonly #queue: boolean;
  /** The longest the coordinator may wait for the key per ask (a long-poll backend, a call that waits); 0: it answers at once. */
  readonly #longPollMs: number;
  /** The last ask was a long poll that the coordinator held until (about) its end: ask again at once, no pause. */
  #polled = false;
  readonly #useSession: boolean;

  #attempt = 0;
  #lastBusy: Extract<AcquireResult, { granted: false }> | undefined;
  #lastError: LeaseholdError | undefined;
  #unsubscribe: (() => void) | undefined;
  #subscribed = false;
  /** The wake-up hook fired since the last look. */
  #changed = false;
  #wakeCurrent: (() => void) | undefined;
  /** A busy answer said the owner is queued. */
  #queued = false;
  /** A queued request was sent (its answer may never have come). */
  #queueSent = false;
  /** A hand-off passed to the wake-up hook (see Backend.subscribe), not looked at yet. */
  #handOff: HandOff | undefined;
  /** The highest token this call has seen: a hand-off at or below it is stale. */
  #highest = -1n;
  /** The session of the latest request, held (kept from its idle close) until this call settles. */
  #held: Session | undefined;
  #sessionRetries = 0;
  #settled = false;
  /** The lease this call ended with. */
  #kept: LeaseImpl | undefined;
  /** Grants whose answers came after their call timed out, while this call still ran: given back when it settles. */
  /** Grants answered after their call timed out, each with the session it was asked with (given back in #settle). */
  readonly #late: { token: bigint; session: Session | undefined }[] = [];

  constructor(ctx: AcquireContext, key: string, options: ResolvedAcquire, wait: boolean) {
    this.#ctx = ctx;
    this.#key = key;
    this.#o = options;
    this.#wait = wait;
    const backend = ctx.backend;
    this.#signal = options.signal ? AbortSignal.any([options.signal, ctx.closing]) : ctx.closing;
    this.#ttlMs = Math.max(options.ttlMs, backend.capabilities.minTtlMs);
    this.#start = ctx.clock.now();
    this.#waitMs = wait ? options.waitMs : 0;
    this.#deadline = this.#start + this.#waitMs;
    this.#queue = wait && this.#waitMs > 0 && options.fair && backend.capabilities.fair;
    this.#longPollMs = wait && this.#waitMs > 0 ? (backend.capabilities.maxWaitMs ?? 0) : 0;
    // A lease with a minimum hold outlives its release on its own expiry: it cannot share a session.
    this.#useSession = options.autoRenew && options.minHoldMs === 0 && ctx.sessions !== undefined;
  }

  async run(): Promise<LeaseImpl | null> {
    if (this.#signal.aborted) this.#giveUp(this.#signal.reason);
    try {
      for (;;) {
        if (this.#signal.aborted) this.#giveUp(this.#signal.reason);
        const handed = this.#takeHandOff();
        if (handed) return handed;
        const asked = await this.#ask();
        if (asked === 'again') continue;
        if (asked) return asked;
        if (!this.#wait) {
          if (this.#lastError) this.#giveUp(this.#lastError);
          this.#ctx.events.emit('busy', { key: this.#key, waitedMs: this.#ctx.clock.now() - this.#start });
          return null;
        }
        const remaining = this.#deadline - this.#ctx.clock.now();
        if (remaining <= 0) {
          const lastError = this.#lastError;
          this.#giveUp(
            lastError && !this.#lastBusy
              ? lastError
              : new AcquireTimeoutError(this.#key, this.#ctx.clock.now() - this.#start, this.#lastBusy?.holder, lastError ? { cause: lastError } : undefined),
          );
        }
        // A long poll is the wait: the coordinator held the request and will hold the next one.
        if (this.#polled) continue;
        if (await this.#subscribe(remaining)) continue;
        await this.#pause(remaining);
      }
    } finally {
      this.#settle();
    }
  }

  /** A grant handed to our session through the wake-up hook, taken if it is still good. */
  #takeHandOff(): LeaseImpl | undefined {
    const h = this.#handOff;
    if (!h) return undefined;
    this.#handOff = undefined;
    const held = this.#held;
    // Its validity is the session's: one that ran out (a pause, say) is not taken, whatever the flags say yet.
    // A session the caller keeps alive itself is its business: the grant goes to the caller, who renews it by that session.
    const ours = held ? held.usable && h.session === held.id : this.#ctx.boundSession !== undefined && h.session === this.#ctx.boundSession;
    if (ours && h.token > this.#highest && !this.#ctx.closing.aborted) {
      this.#queued = false;
      return this.#take(h.token, this.#ttlMs, this.#ctx.clock.now(), held);
    }
    // Not one we can take as it is: ask again (an owner that holds is answered with its grant).
    return undefined;
  }

  /** One request. A lease when granted, 'again' to ask again at once, undefined when busy or failed (transiently). */
  async #ask(): Promise<LeaseImpl | 'again' | undefined> {
    const { backend, clock } = this.#ctx;
    const o = this.#o;
    let session: Session | undefined;
    let result: AcquireResult | undefined;
    const sentAt = clock.now();
    let limit = this.#callLimit();
    try {
      if (this.#useSession) {
        const pool = this.#ctx.sessions!;
        // The session is shared and stays open for the next acquire; this call waits for it only as long as its wait lasts.
        session = pool.current(this.#ttlMs) ?? (await withTimeout(pool.get(this.#ttlMs), { clock, ms: limit.ms, what: 'session open', backend: backend.name }));
      }
      if (session !== this.#held) {
        if (this.#held) this.#ctx.sessions!.unhold(this.#held);
        if (session) this.#ctx.sessions!.hold(session);
        this.#held = session;
      }
      const serverWaitMs = this.#serverWait();
      limit = this.#callLimit(serverWaitMs);
      this.#polled = false;
      const call = backend.acquire({
        key: this.#key,
        owner: this.#owner,
        mode: o.mode,
        ttlMs: this.#ttlMs,
        lockDelayMs: o.lockDelayMs,
        holder: o.label ?? this.#ctx.holder,
        queue: this.#queue,
        queueTtlMs: WAITING.queueTtlMs,
        session: session?.id,
        ...(o.limit !== undefined && { limit: o.limit }),
        ...(serverWaitMs > 0 && { waitMs: serverWaitMs, signal: this.#signal }),
      });
      if (this.#queue) this.#queueSent = true;
      result = await withTimeout(call, {
        clock,
        ms: limit.ms,
        what: 'acquire',
        backend: backend.name,
        onLate: (answer) => {
          if (this.#settled) this.#afterSettled(answer, session);
          else if (answer.granted) this.#late.push({ token: answer.token, session });
        },
        onLateError: () => {
          if (this.#settled) this.#afterSettled(undefined, session);
        },
      });
      if (this.#queue) this.#queued = true;
      this.#lastError = undefined;
      // Held about as long as asked (not answered early by a coordinator that waits less): the wait goes on at the coordinator.
      this.#polled = serverWaitMs > 0 && clock.now() - sentAt >= serverWaitMs / 2;
    } catch (error) {
      const err = toLeaseholdError(error, backend.name);
      if (!err.retryable) this.#giveUp(err);
      if (limit.byWait && err instanceof CallTimeoutError) {
        // No answer before the wait ran out: the wait is over, and says so — as a timeout if the key
        // was seen busy or no ask was answered at all, else with the failure the asks before met (a
        // refused connection, say), as when the wait runs out between asks: "still busy" would be a
        // claim no answer made.
        const failed = this.#lastError;
        if (failed && !(failed instanceof CallTimeoutError) && !this.#lastBusy) this.#giveUp(failed);
        this.#giveUp(new AcquireTimeoutError(this.#key, clock.now() - this.#start, this.#lastBusy?.holder, { cause: this.#lastError ?? err }));
      }
      this.#lastError = err;
    }

    if (result?.granted) {
      if (result.token > this.#highest) this.#highest = result.token;
      if (session?.keeper.lost || this.#ctx.closing.aborted) {
        // The session died (or we were closed) while the grant was on the wire: hand it back and try again.
        const release = backend.release({ key: this.#key, owner: this.#owner, token: result.token, mode: o.mode });
        await withTimeout(release, { clock, ms: this.#ctx.operationTimeoutMs, what: 'release', backend: backend.name }).catch(() => {});
        if (this.#ctx.closing.aborted) this.#giveUp(this.#ctx.closing.reason);
        return 'again';
      }
      this.#queued = false;
      return this.#take(result.token, result.ttlMs, sentAt, session, result.sequencer);
    }
    if (result && !result.granted) {
      if (result.sessionLost && session && this.#sessionRetries < MAX_SESSION_RETRIES) {
        // The coordinator lost our session (a restart, say): end it, open a new one and ask again now.
        this.#sessionRetries++;
        session.keeper.lose('session-lost');
        return 'again';
      }
      this.#lastBusy = result;
      if (result.sessionLost && session) session.keeper.lose('session-lost');
    }
    return undefined;
  }

  /**
   * The bound of the next coordinator call: `operationTimeoutMs`, and while waiting what is left of
   * `waitMs`. A call cut short by the wait ends it as a timeout (the caller's time ran out), not as
   * an unavailable coordinator.
   */
  #callLimit(serverWaitMs = 0): { ms: number; byWait: boolean } {
    const opMs = this.#ctx.operationTimeoutMs;
    // A long poll may take its whole wait and then answer: the call gets that long plus the usual bound.
    if (serverWaitMs > 0) return { ms: serverWaitMs + opMs, byWait: false };
    if (!this.#wait || this.#waitMs <= 0) return { ms: opMs, byWait: false };
    const left = Math.max(1, this.#deadline - this.#ctx.clock.now());
    return left < opMs ? { ms: left, byWait: true } : { ms: opMs, byWait: false };
  }

  /**
   * How long the next ask may wait at the coordinator (see `BackendCapabilities.maxWaitMs`): what
   * is left of the wait, at most the backend's limit, in whole ms; 0 when it must answer at once.
   */
  #serverWait(): number {
    if (this.#longPollMs <= 0) return 0;
    const left = Math.floor(Math.min(this.#longPollMs, this.#deadline - this.#ctx.clock.now()));
    return left > 0 ? left : 0;
  }

  /** Subscribes to wake-ups once; true when the key must be checked again at once. */
  async #subscribe(remaining: number): Promise<boolean> {
    const { backend, clock } = this.#ctx;
    if (this.#subscribed || !backend.subscribe || this.#lastError) return false;
    this.#subscribed = true;
    try {
      // Bounded like every coordinator call; a subscription that arrives too late is ended at once.
      this.#unsubscribe = await withTimeout(
        backend.subscribe(
          this.#key,
          (h) => {
            if (h) this.#handOff = h;
            this.#changed = true;
            this.#wakeCurrent?.();
          },
          this.#lastBusy?.cursor,
        ),
        { clock, ms: Math.max(1, Math.min(this.#ctx.operationTimeoutMs, remaining)), what: 'subscribe', backend: backend.name, onLate: (late) => late() },
      );
      // Without a cursor, a release before the subscription was active would be missed: re-check at once.
      return this.#lastBusy?.cursor === undefined;
    } catch {
      this.#unsubscribe = undefined; // no wake-ups: fall back to polling
      return false;
    }
  }

  /** Waits until the next attempt: a wake-up, the fallback poll, or backoff with full jitter. */
  async #pause(remaining: number): Promise<void> {
    let delay: number;
    const random = this.#ctx.random;
    if (this.#lastError) delay = fullJitter(this.#attempt, 20, 1_000, random) + 5;
    else if (this.#unsubscribe) delay = WAITING.fallbackPollMs;
    else delay = WAITING.backoffBaseMs + fullJitter(this.#attempt, WAITING.backoffBaseMs, WAITING.backoffCapMs, random);
    if (this.#lastBusy?.retryInMs !== undefined && !this.#lastError) delay = Math.min(delay, this.#lastBusy.retryInMs + 1);
    if (this.#queued) delay = Math.min(delay, WAITING.queueTtlMs / 3);
    delay = Math.min(delay, remaining);
    this.#attempt++;
    if (this.#changed) {
      this.#changed = false;
      return;
    }
    const p = pause(this.#ctx.clock, delay, this.#signal);
    this.#wakeCurrent = p.wake;
    await p.done;
    this.#wakeCurrent = undefined;
    this.#changed = false;
  }

  #take(token: bigint, ttlMs: number, sentAt: number, session: Session | undefined, sequencer?: string): LeaseImpl {
    const grant: Grant = { key: this.#key, owner: this.#owner, options: this.#o, token, ttlMs, sentAt, start: this.#start, session };
    this.#kept = this.#ctx.grant(sequencer === undefined ? grant : { ...grant, sequencer });
    return this.#kept;
  }

  #giveUp(error: unknown): never {
    const outcome: AcquireFailure =
      error instanceof AcquireTimeoutError ? 'timeout' : this.#signal.aborted && error === this.#signal.reason ? 'aborted' : 'error';
    this.#ctx.events.emit('acquireFailed', { key: this.#key, waitedMs: this.#ctx.clock.now() - this.#start, outcome, error });
    throw error;
  }

  /** The call has settled: give back late grants, stop listening, leave the queue, let the session go. */
  #settle(): void {
    this.#settled = true;
    for (const { token, session } of this.#late) this.#giveBack(token, session);
    this.#unsubscribe?.();
    if ((this.#queued || this.#queueSent) && !this.#kept) this.#cancel();
    if (this.#held) this.#ctx.sessions!.unhold(this.#held);
  }

  #afterSettled(answer: AcquireResult | undefined, session: Session | undefined): void {
    if (answer?.granted) this.#giveBack(answer.token, session);
    if (this.#queue) this.#cancel();
  }

  /**
   * Releases a grant nobody took. One bound to a session lives as long as the session, whose
   * keep-alive would renew it for as long as the client runs: a give-back that fails is handed to
   * the session's pending releases, retried like a lease's failed release (see `SessionPool`).
   * Without a session it expires by its ttl.
   */
  #giveBack(token: bigint, session: Session | undefined): void {
    if (token === this.#kept?.token) return;
    const { backend, clock, operationTimeoutMs } = this.#ctx;
    const request = { key: this.#key, owner: this.#owner, token, mode: this.#o.mode };
    const release = (): Promise<void> => withTimeout(backend.release(request), { clock, ms: operationTimeoutMs, what: 'release', backend: backend.name });
    release().catch((error: unknown) => {
      session?.keeper.releaseFailed(
        {
          key: this.#key,
          token,
          since: clock.now(),
          retry: () =>
            release().catch((e: unknown) => {
              throw toLeaseholdError(e, backend.name);
            }),
        },
        toLeaseholdError(error, backend.name),
      );
    });
  }

  #cancel(): void {
    const backend = this.#ctx.backend;
    if (backend.cancelWait && !this.#kept?.held) void backend.cancelWait({ key: this.#key, owner: this.#owner }).catch(() => {});
  }
}

/** A random UUID without its dashes (122 random bits, from the platform CSPRNG): the secret that proves ownership to the coordinator (I4). */
function newOwnerId(): string {
  return globalThis.crypto.randomUUID().replace(/-/g, '');
}

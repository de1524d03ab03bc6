import type { Clock, TimerHandle } from './clock.js';
import { withTimeout, toLeaseholdError } from './call.js';
import { type LeaseholdError, LeaseLostError, type LossReason } from './errors.js';
import type { LockEvents, TypedEmitter } from './events.js';
import { formatSequencer, parseSequencer } from './token.js';
import type { LockMode } from './validate.js';

/**
 * A granted lease. Temporary possession, not exclusion: it can be lost at any moment (a pause
 * longer than the ttl, a partition), so pass `token` (or `sequencer`) to the protected resource's
 * fence and watch `signal`.
 */
export interface Lease extends AsyncDisposable {
  readonly key: string;
  /** Fencing token: strictly increasing per key across all grants (I1, I2). */
  readonly token: bigint;
  readonly mode: LockMode;
  /**
   * `lh1.<e|s>.<token>.<key>`: key, mode and token in one header-safe string; `parseSequencer`
   * reads it. The coordinator's own when it issued one for this grant: a lock service started with
   * `--sequencer-key` signs it (`lh1s.…`, `verifySequencer` checks it).
   */
  readonly sequencer: string;
  /** The ttl the coordinator applied (a backend with a minimum lease rounds up). */
  readonly ttlMs: number;
  /**
   * Aborted, with a `LeaseLostError` as its reason, when the lease is lost (I6). Not aborted by
   * `release()`. Each read checks local validity first and can abort it there and then: to check it
   * and then listen, read it once (`const signal = lease.signal`), or a freeze between two reads
   * leaves the listener on an aborted signal, never run.
   */
  readonly signal: AbortSignal;
  /** True while neither released nor lost and local validity has not run out. */
  readonly held: boolean;
  /** Milliseconds of local validity left (0 once released or lost). */
  remainingMs(): number;
  /**
   * Renews now (joins a renewal already in flight). Rejects with `LeaseLostError` when the lease is
   * lost or released, `BackendUnavailableError` when the coordinator could not be reached (the
   * lease stays valid until its validity runs out, and background renewal keeps trying).
   */
  renew(): Promise<void>;
  /**
   * Releases the key. Idempotent: after a loss, an expiry or a second call it resolves and does
   * nothing. Rejects with `BackendUnavailableError` (and emits `releaseFailed`) when the coordinator
   * did not take the release; the lease counts as released here all the same. A lease kept alive on
   * its own then expires within its ttl. A lease kept alive by a session would be renewed with the
   * session for as long as the client runs, so its release is retried in the background (see
   * `SessionPool`): `released` follows when a retry gets through, and if none does within the ttl
   * the session is ended (its other leases are signalled lost) rather than keep the key held.
   */
  release(): Promise<void>;
  toJSON(): { key: string; token: string; mode: LockMode; sequencer: string };
}

/** What a keeper needs from `Locks`: the clock, events, and the drift margin. */
export interface LeaseContext {
  readonly clock: Clock;
  readonly events: TypedEmitter<LockEvents>;
  drift(ttlMs: number): number;
  /** Called once when a lease ends (released or lost), so `Locks` can forget it. */
  forget(lease: LeaseImpl): void;
  /** Upper bound of a single coordinator call. */
  readonly operationTimeoutMs: number;
  /** The backend's `name` (for errors), once known. */
  backendName(): string;
}

export type RenewOutcome = { renewed: true; ttlMs: number } | { renewed: false };

/**
 * A release the coordinator did not take (a killed connection, a timeout), handed to the keeper
 * of the lease: a session keeps renewing the holder until the release gets through, so it retries it.
 */
export interface FailedRelease {
  readonly key: string;
  readonly token: bigint;
  /** When `release()` was called (clock time): without a session the key would be free a ttl after it at the latest. */
  readonly since: number;
  /**
   * One more try, bounded like every coordinator call. Resolves once the coordinator took it (the
   * key is free, or was no longer this owner's), emitting `released`; rejects with a LeaseholdError.
   */
  readonly retry: () => Promise<void>;
}

/**
 * Time set aside per lease for signalling its loss (I6). When a keeper's validity runs out, every
 * lease it keeps is marked lost in one pass (each signal that someone listens to is aborted, each
 * `lost` listener runs): with 10,000 leases on one session that pass took 51 ms in plain Node and
 * 96–113 ms inside the test runner on a busy 2-core machine (one abort listener per lease) —
 * longer than the drift margin of a short ttl. So a keeper's local validity ends earlier by this
 * much per lease beyond the first, and the last lease of the pass is still signalled before the
 * coordinator's expiry. At most a quarter of the ttl is set aside (renewal at ttl/3 must still come
 * first); beyond ttl/4 ÷ 30 µs leases on one session (25,000 at a 3 s ttl) the promise rests on
 * the pass being faster than measured.
 */
export const LOSS_BUDGET_MS_PER_LEASE = 0.03;

/** Renewal retries after a transient failure are never closer together than this (or ttl/100). */
const RETRY_FLOOR_MS = 20;

/** A keeper re-arms its validity timer each time this many more leases join it (each adds to the loss budget). */
const REARM_EVERY_LEASES = 256;

/** What a {@link Keeper} starts from. */
export interface KeeperInit {
  readonly ctx: LeaseContext;
  /** One renewal round trip; rejects with a LeaseholdError on transient failure. */
  readonly renewOnce: (ttlMs: number) => Promise<RenewOutcome>;
  /** When the grant (or session) request was sent: validity counts from there (I5). */
  readonly sentAt: number;
  /** The ttl the coordinator applied. */
  readonly ttlMs: number;
  /** Renew in the background at ttl/3; off, the ttl is a hard limit. */
  readonly autoRenew: boolean;
  /** Called when the keeper has no lease left or is lost. */
  readonly onIdle?: (keeper: Keeper) => void;
  /** How a negative renewal answer is reported: a lease that is not held (default), or a session that is gone. */
  readonly goneReason?: LossReason;
  /**
   * A lease of this keeper was released and the release failed. A session passes its retries here
   * (the session would keep the key held); a lease's own keeper has none: it is stopped once the
   * lease is released, and the key expires within its ttl.
   */
  readonly onReleaseFailed?: (release: FailedRelease, error: LeaseholdError) => void;
}

/**
 * Keeps one or more leases alive with one renewal: a single lease (renewed on its own) or a
 * session (every lease of the session is renewed by one keep-alive). It owns the two timers: the
 * next renewal, and the end of local validity (I5, I6).
 */
export class Keeper {
  readonly leases = new Set<LeaseImpl>();
  validUntil: number;
  ttlMs: number;
  lostReason: LossReason | undefined;
  #renewTimer: TimerHandle | undefined;
  #validityTimer: TimerHandle | undefined;
  #inFlight: Promise<void> | undefined;
  #stopped = false;

  private readonly ctx: LeaseContext;
  private readonly renewOnce: (ttlMs: number) => Promise<RenewOutcome>;
  private readonly autoRenew: boolean;
  private readonly onIdle: (keeper: Keeper) => void;
  private readonly goneReason: LossReason;
  private readonly onReleaseFailed: ((release: FailedRelease, error: LeaseholdError) => void) | undefined;

  constructor(init: KeeperInit) {
    this.ctx = init.ctx;
    this.renewOnce = init.renewOnce;
    this.autoRenew = init.autoRenew;
    this.onIdle = init.onIdle ?? (() => {});
    this.goneReason = init.goneReason ?? 'not-held';
    this.onReleaseFailed = init.onReleaseFailed;
    this.ttlMs = init.ttlMs;
    this.validUntil = init.sentAt + init.ttlMs - init.ctx.drift(init.ttlMs);
    this.#armValidity();
    this.#scheduleRenewal(init.ttlMs / 3);
  }

  get lost(): boolean {
    return this.lostReason !== undefined;
  }

  /** When local validity ends: the coordinator's expiry less the drift margin and the loss budget for the leases kept. */
  get validEnd(): number {
    // The first lease's pass is covered by the drift margin's fixed 2 ms.
    if (this.leases.size <= 1) return this.validUntil;
    return this.validUntil - Math.min((this.leases.size - 1) * LOSS_BUDGET_MS_PER_LEASE, this.ttlMs / 4);
  }

  remainingMs(): number {
    return Math.max(0, this.validEnd - this.ctx.clock.now());
  }

  add(lease: LeaseImpl): void {
    this.leases.add(lease);
    // Each lease moves the end of validity a little earlier: re-arm the timer now and then, not per lease.
    if (this.leases.size % REARM_EVERY_LEASES === 0) this.#armValidity();
  }

  remove(lease: LeaseImpl): void {
    this.leases.delete(lease);
    if (this.leases.size === 0) this.onIdle(this);
  }

  /** A lease removed from this keeper could not be released (see {@link KeeperInit.onReleaseFailed}); nothing once lost or stopped. */
  releaseFailed(release: FailedRelease, error: LeaseholdError): void {
    if (this.lostReason || this.#stopped) return;
    this.onReleaseFailed?.(release, error);
  }

  /** Renews now; concurrent callers share one round trip (never overlapping). */
  renew(): Promise<void> {
    if (this.lostReason) return Promise.reject(this.#lossError(this.lostReason));
    this.#inFlight ??= this.#renew().finally(() => {
      this.#inFlight = undefined;
    });
    return this.#inFlight;
  }

  async #renew(): Promise<void> {
    const clock = this.ctx.clock;
    const sentAt = clock.now();
    // After a pause (SIGSTOP, a blocked loop) the renewal timer can run before the validity timer:
    // a lease whose validity already ran out is lost, whatever the coordinator would answer.
    if (sentAt >= this.validEnd) {
      const error = this.#lossError('expired');
      this.lose('expired');
      throw error;
    }
    let outcome: RenewOutcome;
    try {
      const ms = Math.max(1, Math.min(this.ctx.operationTimeoutMs, this.validEnd - sentAt));
      outcome = await withTimeout(this.renewOnce(this.ttlMs), { clock, ms, what: 'renew', backend: this.ctx.backendName() });
    } catch (error) {
      if (this.lostReason || this.#stopped) throw this.lostReason ? this.#lossError(this.lostReason) : toLeaseholdError(error, this.ctx.backendName());
      const err = toLeaseholdError(error, this.ctx.backendName());
      if (!err.retryable) {
        this.lose(this.goneReason, err);
        throw this.#lossError(this.goneReason);
      }
      const remaining = this.remainingMs();
      // One event per failed round trip, however many leases it was renewing (a session keeps many).
      const first = this.#first();
      if (first) this.ctx.events.emit('renewFailed', { key: first.key, token: first.token, leases: this.leases.size, error: err, remainingMs: remaining });
      // Retry at a tenth of the ttl, sooner as validity runs out, but never in a tight loop: a retry
      // closer than RETRY_FLOOR_MS would not reach a coordinator that has not answered for this long.
      const next = Math.min(this.ttlMs / 10, remaining / 3);
      const floor = Math.max(RETRY_FLOOR_MS, this.ttlMs / 100);
      if (remaining > floor) this.#scheduleRenewal(Math.max(floor, next));
      throw err;
    }
    // A late answer cannot revive a lease whose validity already ran out locally.
    if (this.lostReason) throw this.#lossError(this.lostReason);
    if (this.#stopped) return;
    if (!outcome.renewed) {
      this.lose(this.goneReason);
      throw this.#lossError(this.goneReason);
    }
    this.ttlMs = outcome.ttlMs;
    this.validUntil = sentAt + outcome.ttlMs - this.ctx.drift(outcome.ttlMs);
    this.#armValidity();
    this.#scheduleRenewal(outcome.ttlMs / 3);
    const first = this.#first();
    if (first) this.ctx.events.emit('renewed', { key: first.key, token: first.token, leases: this.leases.size, ttlMs: outcome.ttlMs });
  }

  /** The oldest lease kept: the one a session's renewal events name. */
  #first(): LeaseImpl | undefined {
    return this.leases.values().next().value as LeaseImpl | undefined;
  }

  /**
   * Marks every lease of this keeper lost and aborts their signals. Idempotent. Two passes: the
   * first marks every lease lost and makes the errors (no user code runs in it), the second aborts
   * the signals and emits `lost` (listeners run there). So a listener of the first lease already
   * sees every other lease lost. Per lease only what someone can observe is done: a signal nobody
   * has read is born aborted when it is first read, and an error is made only for a read signal or
   * a `lost` listener — without a stack trace: it would only show this timer's frames, and taking
   * one is most of the cost of an error (about 4 µs of the ~6 µs per lease measured with 10,000).
   */
  lose(reason: LossReason, cause?: unknown): void {
    if (this.lostReason || this.#stopped) return;
    this.lostReason = reason;
    this.#clearTimers();
    const leases = [...this.leases];
    this.leases.clear();
    const limit = Error.stackTraceLimit;
    Error.stackTraceLimit = 0;
    try {
      for (const lease of leases) lease.markLost(reason, cause);
    } finally {
      Error.stackTraceLimit = limit;
    }
    for (const lease of leases) lease.announceLoss();
    this.onIdle(this);
  }

  /** Stops the timers without signalling loss (released, or the session was closed on purpose). */
  stop(): void {
    this.#stopped = true;
    this.#clearTimers();
  }

  get stopped(): boolean {
    return this.#stopped;
  }

  #lossError(reason: LossReason): LeaseLostError {
    const first = this.leases.values().next().value as LeaseImpl | undefined;
    return first ? new LeaseLostError(first.key, first.token, reason) : new LeaseLostError('(session)', 0n, reason);
  }

  #scheduleRenewal(ms: number): void {
    if (!this.autoRenew || this.#stopped || this.lostReason) return;
    if (this.#renewTimer) this.ctx.clock.clearTimeout(this.#renewTimer);
    this.#renewTimer = this.ctx.clock.setTimeout(() => {
      this.#renewTimer = undefined;
      // Errors are handled inside #renew (retry scheduled or loss signalled); never let one escape a timer.
      this.renew().catch(() => {});
    }, ms);
  }

  #armValidity(): void {
    if (this.#stopped || this.lostReason) return;
    if (this.#validityTimer) this.ctx.clock.clearTimeout(this.#validityTimer);
    const check = (): void => {
      this.#validityTimer = undefined;
      const left = this.validEnd - this.ctx.clock.now();
      if (left > 0) this.#validityTimer = this.ctx.clock.setTimeout(check, left);
      else this.lose('expired');
    };
    this.#validityTimer = this.ctx.clock.setTimeout(check, Math.max(0, this.validEnd - this.ctx.clock.now()));
  }

  #clearTimers(): void {
    if (this.#renewTimer) this.ctx.clock.clearTimeout(this.#renewTimer);
    if (this.#validityTimer) this.ctx.clock.clearTimeout(this.#validityTimer);
    this.#renewTimer = this.#validityTimer = undefined;
  }
}

/** How a lease was lost; its error is made once, when first needed. */
interface Loss {
  readonly reason: LossReason;
  readonly cause: unknown;
  error?: LeaseLostError;
  announced: boolean;
}

export class LeaseImpl implements Lease {
  readonly key: string;
  readonly token: bigint;
  readonly mode: LockMode;
  /** Formatted (or the coordinator's checked) on first use (a base64url of the key): many leases never hand theirs on. */
  #sequencer: string | undefined;
  /** The sequencer the coordinator issued with the grant, not checked yet. */
  readonly #issued: string | undefined;
  /** Made on first use: most leases end by release and nobody looks at their signal. */
  #controller: AbortController | undefined;
  readonly #ctx: LeaseContext;
  readonly #keeper: Keeper;
  readonly #acquiredAt: number;
  readonly #release: () => Promise<void>;
  #state: 'held' | 'released' | 'lost' = 'held';
  #releasing: Promise<void> | undefined;
  /** Why it was lost; its error is made when first needed (a signal read, a `lost` listener). */
  #loss: Loss | undefined;

  constructor(init: {
    ctx: LeaseContext;
    keeper: Keeper;
    key: string;
    token: bigint;
    mode: LockMode;
    /** The coordinator's sequencer for this grant (see AcquireResult.sequencer), if it sent one. */
    sequencer?: string;
    acquiredAt: number;
    release: () => Promise<void>;
  }) {
    this.key = init.key;
    this.token = init.token;
    this.mode = init.mode;
    this.#issued = init.sequencer;
    this.#ctx = init.ctx;
    this.#keeper = init.keeper;
    this.#acquiredAt = init.acquiredAt;
    this.#release = init.release;
  }

  get ttlMs(): number {
    return this.#keeper.ttlMs;
  }

  get sequencer(): string {
    return (this.#sequencer ??= this.#ownIssued() ?? formatSequencer(this.key, this.mode, this.token));
  }

  /**
   * The coordinator's sequencer if it names this lease's key, mode and token; else undefined (core
   * formats its own). A backend's answer cannot hand this lease another grant's sequencer, which a
   * fence would then accept on its behalf. Its signature is not checked here: only the resource
   * holds the verification key.
   */
  #ownIssued(): string | undefined {
    const issued = this.#issued;
    if (issued === undefined) return undefined;
    try {
      const s = parseSequencer(issued);
      return s.key === this.key && s.mode === this.mode && s.token === this.token ? issued : undefined;
    } catch {
      return undefined;
    }
  }

  get signal(): AbortSignal {
    this.#sync();
    if (!this.#controller) {
      this.#controller = new AbortController();
      // Lost before anyone looked: the signal is born aborted, with the same error the `lost` event carried.
      if (this.#loss) this.#controller.abort(this.#lossError(this.#loss));
    }
    return this.#controller.signal;
  }

  get held(): boolean {
    this.#sync();
    return this.#state === 'held';
  }

  remainingMs(): number {
    this.#sync();
    return this.#state === 'held' ? this.#keeper.remainingMs() : 0;
  }

  /**
   * After a pause (SIGSTOP, a blocked event loop) code can run before the overdue validity timer
   * does. Whoever looks at the lease first makes the loss official, so `held`, `signal`, `renew`,
   * `release` and `withLock` never disagree about a lease whose validity ran out.
   */
  #sync(): void {
    if (this.#state !== 'held') return;
    if (this.#keeper.lostReason) {
      // Its keeper's pass has not reached it yet (read from a listener of an earlier lease).
      this.markLost(this.#keeper.lostReason);
      this.announceLoss();
    } else if (this.#keeper.remainingMs() <= 0) this.#keeper.lose('expired');
  }

  async renew(): Promise<void> {
    this.#sync();
    if (this.#state === 'lost') throw this.signal.reason as LeaseLostError;
    if (this.#state === 'released') throw new LeaseLostError(this.key, this.token, 'released');
    try {
      await this.#keeper.renew();
    } catch (error) {
      // The keeper reports loss of the whole session with the first lease's name; report ours.
      if ((this.#state as string) === 'lost') throw this.signal.reason as LeaseLostError;
      throw error;
    }
  }

  release(): Promise<void> {
    this.#sync(); // a lease that already expired is lost, not released: its signal aborts, `lost` fires
    if (this.#state !== 'held') return this.#releasing ?? Promise.resolve();
    this.#state = 'released';
    this.#keeper.remove(this);
    this.#ctx.forget(this);
    const since = this.#ctx.clock.now();
    const heldMs = since - this.#acquiredAt;
    this.#releasing = this.#release().then(
      () => this.#ctx.events.emit('released', { key: this.key, token: this.token, heldMs }),
      (error: unknown) => {
        const err = toLeaseholdError(error, this.#ctx.backendName());
        // Not forgotten: a session would renew the holder for as long as it lives, so it retries (see FailedRelease).
        this.#keeper.releaseFailed({ key: this.key, token: this.token, since, retry: () => this.#retryRelease() }, err);
        this.#ctx.events.emit('releaseFailed', { key: this.key, token: this.token, error: err });
        throw err;
      },
    );
    // A second call resolves quietly even if the first failed.
    const quiet = this.#releasing.catch(() => {});
    const first = this.#releasing;
    this.#releasing = quiet;
    return first;
  }

  /** A retry of a release that failed: `released` once it gets through (held until then: `heldMs` counts to it). */
  async #retryRelease(): Promise<void> {
    try {
      await this.#release();
    } catch (error) {
      throw toLeaseholdError(error, this.#ctx.backendName());
    }
    this.#ctx.events.emit('released', { key: this.key, token: this.token, heldMs: this.#ctx.clock.now() - this.#acquiredAt });
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.release();
  }

  /**
   * Called by the keeper, first of two steps: marks the lease lost and makes its error if someone
   * will see it (a signal that was read, a `lost` listener). Runs no user code.
   */
  markLost(reason: LossReason, cause?: unknown): void {
    if (this.#state !== 'held') return;
    this.#state = 'lost';
    const loss = (this.#loss = { reason, cause, announced: false });
    this.#ctx.forget(this);
    if (this.#controller || this.#ctx.events.listenerCount('lost') > 0) this.#lossError(loss);
  }

  /** Second step: aborts the signal (if it was read; else it is born aborted when it is) and emits `lost`. Once. */
  announceLoss(): void {
    const loss = this.#loss;
    if (!loss || loss.announced) return;
    loss.announced = true;
    if (this.#controller) this.#controller.abort(this.#lossError(loss));
    if (this.#ctx.events.listenerCount('lost') > 0) {
      this.#ctx.events.emit('lost', {
        key: this.key,
        token: this.token,
        reason: loss.reason,
        error: this.#lossError(loss),
        heldMs: this.#ctx.clock.now() - this.#acquiredAt,
      });
    }
  }

  #lossError(loss: Loss): LeaseLostError {
    return (loss.error ??= new LeaseLostError(this.key, this.token, loss.reason, loss.cause === undefined ? undefined : { cause: loss.cause }));
  }

  toJSON(): { key: string; token: string; mode: LockMode; sequencer: string } {
    return { key: this.key, token: this.token.toString(), mode: this.mode, sequencer: this.sequencer };
  }
}

/**
 * Runs `listener` once when `lease` is lost: at once if it already is, else on the abort. Returns
 * the function that stops watching.
 *
 * It reads `lease.signal` once. Each read makes the loss of a lease whose validity ran out official
 * there and then (see `#sync`), so `if (lease.signal.aborted) … else lease.signal.addEventListener(…)`
 * reads it twice: a freeze between the two reads (SIGSTOP, a blocked loop) has the second read
 * abort the signal and then add the listener to an aborted signal, where it never runs.
 */
export function onLoss(lease: Lease, listener: (reason: LeaseLostError) => void): () => void {
  const signal = lease.signal;
  const run = (): void => listener(signal.reason as LeaseLostError);
  if (signal.aborted) {
    run();
    return () => {};
  }
  signal.addEventListener('abort', run, { once: true });
  return () => signal.removeEventListener('abort', run);
}

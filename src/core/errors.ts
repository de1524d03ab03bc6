/**
 * Every error leasehold throws is one of these classes. Each has a stable `code` (safe to switch
 * on), a `name`, an optional `cause`, and the diagnostics a user needs. `retryable` says whether
 * the same call may succeed if simply tried again later.
 */

export type ErrorCode =
  | 'ACQUIRE_TIMEOUT'
  | 'LEASE_LOST'
  | 'STALE_TOKEN'
  | 'INVALID_ARGUMENT'
  | 'BACKEND_UNAVAILABLE'
  | 'PARTIAL_WRITE'
  | 'CLOSED'
  | 'IDEMPOTENCY_MISMATCH';

export abstract class LeaseholdError extends Error {
  abstract readonly code: ErrorCode;
  /** True when trying the same operation again later may succeed. */
  abstract readonly retryable: boolean;

  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
  }
}

/** `acquire` waited `waitMs` and the key stayed busy. */
export class AcquireTimeoutError extends LeaseholdError {
  override readonly name = 'AcquireTimeoutError';
  readonly code = 'ACQUIRE_TIMEOUT' as const;
  readonly retryable = true;
  readonly key: string;
  /** How long acquire waited, in milliseconds (monotonic clock). */
  readonly waitedMs: number;
  /** The public label of a current holder (never its secret owner id), where the backend knows it. */
  readonly holder: string | undefined;

  constructor(key: string, waitedMs: number, holder?: string, options?: { cause?: unknown }) {
    const who = holder === undefined ? '' : `; held by ${holder}`;
    super(`lock "${key}" still busy after waiting ${Math.round(waitedMs)} ms${who}`, options);
    this.key = key;
    this.waitedMs = waitedMs;
    this.holder = holder;
  }
}

/** Why a lease stopped being valid. */
export type LossReason =
  /** Local validity (acquire time + ttl − drift) ran out before a renewal succeeded. */
  | 'expired'
  /** The coordinator answered that this owner no longer holds the key (expired there, taken over, deleted by an operator). */
  | 'not-held'
  /** The session the lease was attached to is gone. */
  | 'session-lost'
  /** Not a loss: `renew()` was called after `release()`. */
  | 'released';

/** The lease is no longer held; `lease.signal` was aborted with this error as its reason. */
export class LeaseLostError extends LeaseholdError {
  override readonly name = 'LeaseLostError';
  readonly code = 'LEASE_LOST' as const;
  readonly retryable = false;
  readonly key: string;
  readonly token: bigint;
  readonly reason: LossReason;

  constructor(key: string, token: bigint, reason: LossReason, options?: { cause?: unknown }) {
    super(`lease on "${key}" (token ${token}) lost: ${describeLoss(reason)}`, options);
    this.key = key;
    this.token = token;
    this.reason = reason;
  }
}

/** Why a lease was lost, in words (the explanation in a `LeaseLostError`'s message). */
export function describeLoss(reason: LossReason): string {
  switch (reason) {
    case 'expired':
      return 'its validity ran out before a renewal succeeded';
    case 'not-held':
      return 'the coordinator no longer holds it for this owner';
    case 'session-lost':
      return 'its session expired or was revoked';
    case 'released':
      return 'it was released by its holder';
  }
}

/** A fence refused a write: a newer token has already been accepted for this resource. */
export class StaleTokenError extends LeaseholdError {
  override readonly name = 'StaleTokenError';
  readonly code = 'STALE_TOKEN' as const;
  readonly retryable = false;
  readonly resource: string;
  readonly token: bigint;
  readonly highest: bigint;

  constructor(resource: string, token: bigint, highest: bigint) {
    super(`stale token ${token} for "${resource}": token ${highest} was already accepted`);
    this.resource = resource;
    this.token = token;
    this.highest = highest;
  }
}

/** An argument or option is malformed. Nothing was changed. */
export class InvalidArgumentError extends LeaseholdError {
  override readonly name = 'InvalidArgumentError';
  readonly code = 'INVALID_ARGUMENT' as const;
  readonly retryable = false;
  /** The argument or option at fault, e.g. `ttlMs` or `key`. */
  readonly argument: string;

  constructor(argument: string, problem: string, options?: { cause?: unknown }) {
    super(`invalid ${argument}: ${problem}`, options);
    this.argument = argument;
  }
}

/** The coordinator (or the fence's store) could not be reached or failed; `cause` holds the driver's error. */
export class BackendUnavailableError extends LeaseholdError {
  override readonly name = 'BackendUnavailableError';
  readonly code = 'BACKEND_UNAVAILABLE' as const;
  readonly retryable = true;
  readonly backend: string;

  constructor(backend: string, message: string, options?: { cause?: unknown }) {
    super(`${backend}: ${message}`, options);
    this.backend = backend;
  }
}

/**
 * A fenced write was partly applied: the mark was raised to `token` together with part of the
 * mutation, but not all of it, and nothing rolled it back — e.g. a Redis command queued by `mutate`
 * failed when EXEC ran it (Redis has no rollback; the others ran), or `mutate` committed the
 * transaction itself. The mark and what was applied agree (a lower token is refused from now on);
 * what is missing is the rest of the mutation. Not retryable as such: repair or redo the mutation
 * under the same (or a newer) token. `cause` holds the store's error.
 */
export class PartialWriteError extends LeaseholdError {
  override readonly name = 'PartialWriteError';
  readonly code = 'PARTIAL_WRITE' as const;
  readonly retryable = false;
  readonly resource: string;
  /** The token the mark was raised to. */
  readonly token: bigint;

  constructor(resource: string, token: bigint, problem: string, options?: { cause?: unknown }) {
    super(`fenced write to "${resource}" under token ${token} was partly applied (the mark was raised): ${problem}`, options);
    this.resource = resource;
    this.token = token;
  }
}

/**
 * The `Locks` instance or the backend was closed (`close()`): calls after that, and acquires still
 * waiting when it was called, reject with this. Not a bad argument and not retryable: make a new
 * instance. `what` names what was closed (`Locks`, `redis backend`, …).
 */
export class ClosedError extends LeaseholdError {
  override readonly name = 'ClosedError';
  readonly code = 'CLOSED' as const;
  readonly retryable = false;
  readonly what: string;

  constructor(what: string, options?: { cause?: unknown }) {
    super(`this ${what} was closed`, options);
    this.what = what;
  }
}

/**
 * An idempotency key was used again with a different payload (its stable hash differs from the
 * stored one): never a silent replay of another request's result (Stripe answers 422).
 */
export class IdempotencyMismatchError extends LeaseholdError {
  override readonly name = 'IdempotencyMismatchError';
  readonly code = 'IDEMPOTENCY_MISMATCH' as const;
  readonly retryable = false;
  readonly key: string;

  constructor(key: string) {
    super(`idempotency key ${JSON.stringify(key)} was used with a different payload`);
    this.key = key;
  }
}

/**
 * The refusal of a shared request whose limit the key's live holders do not share
 * (`AcquireRequest.limit`), naming both: `held` is the holders' limit (undefined: plain shared
 * holders), `asked` the request's (undefined: a plain shared request). Every backend answers with it.
 */
export function limitConflictMessage(key: string, held: number | undefined, asked: number | undefined): string {
  const what = held === undefined ? 'by shared holders without a limit' : `as a semaphore of ${held} permits`;
  return `key ${JSON.stringify(key)} is held ${what}; this request asks for ${asked === undefined ? 'a shared lock without a limit' : `${asked} permits`}`;
}

/** {@link limitConflictMessage} as the InvalidArgumentError (argument `limit`) a backend rejects with. */
export function limitConflict(key: string, held: number | undefined, asked: number | undefined, options?: { cause?: unknown }): InvalidArgumentError {
  return new InvalidArgumentError('limit', limitConflictMessage(key, held, asked), options);
}

/** Every error code with a one-line description; the README's error table is checked against this. */
export const ERROR_CODES: Readonly<Record<ErrorCode, string>> = Object.freeze({
  ACQUIRE_TIMEOUT: 'acquire waited waitMs and the key stayed busy',
  LEASE_LOST: 'the lease is no longer held; lease.signal was aborted',
  STALE_TOKEN: 'a fence refused a write because a newer token was already accepted',
  INVALID_ARGUMENT: 'an argument or option is malformed; nothing was changed',
  BACKEND_UNAVAILABLE: 'the coordinator or store could not be reached or failed',
  PARTIAL_WRITE: 'a fenced write was partly applied: the mark was raised but not all of the mutation ran (no rollback)',
  CLOSED: 'the Locks instance or backend was closed; calls after close() and waits it interrupted reject with this',
  IDEMPOTENCY_MISMATCH: 'an idempotency key was used again with a different payload; the stored result is not replayed',
});

export function isLeaseholdError(error: unknown): error is LeaseholdError {
  return error instanceof LeaseholdError;
}

import { backendLoader, DEFAULT_URL } from './connect.js';
import type { Backend } from './core/backend.js';
import { Locks, type LocksOptions } from './core/locks.js';
import { checkObject, describe } from './core/validate.js';
import { InvalidArgumentError } from './core/errors.js';

export interface CreateLocksOptions extends Omit<LocksOptions, 'backend'> {
  /** The coordinator. @default the backend named by `url`, else LEASEHOLD_URL (when set and not empty), else SQLite at ./leasehold.db */
  backend?: Backend;
  /** A coordinator URL (`sqlite:PATH`, `memory:`, `postgres://…`, `mysql://…`, `redis://…`, `redlock://h1:p,h2:p,h3:p`, `etcd://h1:p,h2:p`), used when `backend` is not given. */
  url?: string;
}

/**
 * The entry point. With no backend it uses the embedded SQLite store at `./leasehold.db`, or the
 * URL in `LEASEHOLD_URL`. The backend is connected on first use; a malformed URL throws here.
 */
export function createLocks(options?: CreateLocksOptions): Locks {
  const { backend, url, ...rest } = checkObject(options, 'options') as CreateLocksOptions;
  if (backend !== undefined && url !== undefined) throw new InvalidArgumentError('options', 'give either backend or url, not both');
  if (url !== undefined && typeof url !== 'string') throw new InvalidArgumentError('url', `expected a string, got ${describe(url)}`);
  // Only an absent (undefined) backend means the default: `backend: null` is a mistake, refused by Locks.
  const source = backend !== undefined ? backend : backendLoader(url ?? (process.env.LEASEHOLD_URL || DEFAULT_URL));
  return new Locks({ ...rest, backend: source });
}

export { Locks, DEFAULTS, WAITING, type AcquireOptions, type LocksOptions } from './core/locks.js';
export type { Lease } from './core/lease.js';
export { Election, type ElectionOptions, type Leader } from './core/election.js';
export {
  createIdempotency,
  Idempotency,
  IDEMPOTENCY_DEFAULTS,
  payloadHash,
  type IdempotencyOptions,
  type IdempotencyRecord,
  type IdempotencyStore,
  type TransactionalIdempotencyStore,
  type IdempotentResult,
} from './core/idempotency.js';
export {
  LeaseholdError,
  AcquireTimeoutError,
  LeaseLostError,
  StaleTokenError,
  InvalidArgumentError,
  BackendUnavailableError,
  PartialWriteError,
  IdempotencyMismatchError,
  ClosedError,
  ERROR_CODES,
  isLeaseholdError,
  type ErrorCode,
  type LossReason,
} from './core/errors.js';
export { parseSequencer, formatSequencer, toToken, MAX_TOKEN, type Sequencer, type TokenInput } from './core/token.js';
export { signSequencer, verifySequencer, MIN_SEQUENCER_SECRET_BYTES, type SequencerKey, type SequencerKeys } from './core/sequencer-sign.js';
export type { Fence, FenceGuardOptions, FenceWriteOptions } from './core/fence.js';
export type {
  Backend,
  BackendCapabilities,
  AcquireRequest,
  AcquireResult,
  RenewRequest,
  RenewResult,
  ReleaseRequest,
  SessionSupport,
  KeyState,
  HolderState,
  HandOff,
} from './core/backend.js';
export type { LockEvents, LockEventName, AcquireFailure } from './core/events.js';
export { systemClock, manualClock, skewedClock, type Clock, type ManualClock, type TimerHandle } from './core/clock.js';
export { MAX_KEY_BYTES, MIN_TTL_MS, type LockMode } from './core/validate.js';
export {
  memoryBackend,
  memoryFence,
  memoryIdempotencyStore,
  type MemoryBackendOptions,
  type MemoryFenceOptions,
  type MemoryIdempotencyStoreOptions,
} from './memory/index.js';
export { backendFromUrl, DEFAULT_URL } from './connect.js';

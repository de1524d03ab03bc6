import { InvalidArgumentError } from './errors.js';
import {
  checkBoolean,
  checkInteger,
  checkKnownOptions,
  checkMode,
  checkObject,
  checkSignal,
  checkTtl,
  checkWait,
  describe,
  MAX_DURATION_MS,
  type LockMode,
} from './validate.js';

/**
 * Defaults, each with the reason for its value. Frozen: copy them into your own options to change them.
 */
export const DEFAULTS = Object.freeze({
  /** 30 s: a crashed holder blocks the key this long; long enough that a GC pause or a slow renewal does not lose the lease. */
  ttlMs: 30_000,
  /** 10 s: long enough to ride out a normal hand-off, short enough that a stuck caller hears about it. */
  waitMs: 10_000,
  /** 0: resources that check tokens need no lock-delay (I8); raise it for ones that cannot. */
  lockDelayMs: 0,
  mode: 'exclusive' as LockMode,
  /** On: renew at ttl/3 until released or lost. Off: the ttl is a hard limit. */
  autoRenew: true,
  /** On: waiters are served in arrival order where the backend can queue them (no barging, no starvation). */
  fair: true,
  /** 1 %, plus 2 ms: the margin by which the client ends validity before the coordinator can (node-redlock's driftFactor). */
  driftFactor: 0.01,
  /** 5 s: the longest a single coordinator call may take before it counts as unavailable. */
  operationTimeoutMs: 5_000,
  /** 0: a release frees the key at once; raise it for run-once jobs (ShedLock's lockAtLeastFor). */
  minHoldMs: 0,
});

/** The largest semaphore: 10,000 permits (each permit is a holder record at the coordinator). */
export const MAX_LIMIT = 10_000;

/**
 * Waiting constants. A backend with a wake-up hook is still polled every FALLBACK_POLL_MS in case a
 * notification is lost; one without polls with full-jitter backoff between BACKOFF_BASE_MS and
 * BACKOFF_CAP_MS (and never later than the moment the holder's ttl would run out).
 */
export const WAITING = Object.freeze({
  fallbackPollMs: 500,
  /** A queued waiter that stops asking is dropped after this long, so a crashed waiter cannot block a key. */
  queueTtlMs: 2_000,
  backoffBaseMs: 5,
  backoffCapMs: 200,
});

export interface AcquireOptions {
  /** Lease time-to-live in ms; with autoRenew, the time a crashed holder keeps the key. @default 30000 */
  ttlMs?: number;
  /** How long `acquire` waits for a busy key, in ms; `Infinity` waits forever. Ignored by `tryAcquire`. @default 10000 */
  waitMs?: number;
  /** Many `shared` holders, or one `exclusive`. @default 'exclusive' */
  mode?: LockMode;
  /** After this lease expires without a release, the key stays ungrantable this long (I8). @default 0 */
  lockDelayMs?: number;
  /** Renew in the background at ~ttl/3; `false` makes ttlMs a hard limit. @default true */
  autoRenew?: boolean;
  /** Wait in arrival order (backends with a queue). @default true */
  fair?: boolean;
  /** Aborting it stops the wait; `acquire` then rejects with the signal's reason. */
  signal?: AbortSignal;
  /**
   * A semaphore permit: at most `limit` holders of the key at once (1 … 10,000), each a full Lease
   * with its own token. The key records its limit while held; a request naming another is refused.
   * Alone it asks for a permit (mode 'shared'); with an explicit `mode: 'exclusive'` only 1 is allowed.
   */
  limit?: number;
  /** The public label of this grant, shown by inspect, `ls` and the dashboard; never secret. @default the client's holderName */
  label?: string;
  /**
   * A release earlier than this after the grant keeps the key until then (renewal stops, and it
   * expires), so a second machine whose cron fires a little later skips instead of running the job
   * again (ShedLock's lockAtLeastFor). @default 0
   */
  minHoldMs?: number;
}

export const ACQUIRE_OPTION_NAMES = ['ttlMs', 'waitMs', 'mode', 'lockDelayMs', 'autoRenew', 'fair', 'signal', 'limit', 'label', 'minHoldMs'] as const;
/** Options that belong to one call, not to an instance's defaults. */
const PER_CALL = new Set<string>(['signal', 'limit', 'label']);

/** Every acquire option that has a default, filled in. */
export type AcquireDefaults = Required<Omit<AcquireOptions, 'signal' | 'limit' | 'label'>>;

/** One acquire's options: copied, defaults filled in, each validated (an error names the option). */
export type ResolvedAcquire = AcquireDefaults & { signal: AbortSignal | undefined; limit: number | undefined; label: string | undefined };

/** Validates `options` (a call's, or an instance's `defaults`) over `base`; unknown names are refused. */
export function resolveAcquireOptions(options: unknown, base: AcquireDefaults, argument: 'options' | 'defaults'): ResolvedAcquire {
  const o = checkObject(options, argument);
  checkKnownOptions(o, argument === 'defaults' ? ACQUIRE_OPTION_NAMES.filter((n) => !PER_CALL.has(n)) : ACQUIRE_OPTION_NAMES, argument);
  const resolved = resolveAcquire(o, base, argument) as ResolvedAcquire;
  resolved.signal = o.signal === undefined ? undefined : checkSignal(o.signal, `${argument}.signal`);
  resolved.label = o.label === undefined ? undefined : checkLabel(o.label, `${argument}.label`);
  resolved.limit = undefined;
  if (o.limit !== undefined) {
    const limit = checkInteger(o.limit, `${argument}.limit`, 1, MAX_LIMIT);
    if (o.mode === 'exclusive') {
      // An explicit exclusive lock of 1 is just a lock; of more it is a contradiction.
      if (limit > 1)
        throw new InvalidArgumentError(
          `${argument}.limit`,
          `a limit of ${limit} permits asks for a semaphore, which mode "exclusive" contradicts (leave mode out)`,
        );
    } else {
      resolved.mode = 'shared';
      resolved.limit = limit;
    }
  }
  return resolved;
}

/** A public label: 1–200 printable ASCII characters (it is shown to others and stored with the grant). */
export function checkLabel(value: unknown, name: string): string {
  if (typeof value !== 'string' || value.length === 0 || value.length > 200 || !/^[\x20-\x7e]+$/.test(value)) {
    throw new InvalidArgumentError(name, `expected 1–200 printable ASCII characters, got ${describe(value)}`);
  }
  return value;
}

function resolveAcquire(o: Record<string, unknown>, base: AcquireDefaults, argument: string): AcquireDefaults {
  return {
    ttlMs: o.ttlMs === undefined ? base.ttlMs : checkTtl(o.ttlMs, `${argument}.ttlMs`),
    waitMs: o.waitMs === undefined ? base.waitMs : checkWait(o.waitMs, `${argument}.waitMs`),
    mode: o.mode === undefined ? base.mode : checkMode(o.mode, `${argument}.mode`),
    lockDelayMs: o.lockDelayMs === undefined ? base.lockDelayMs : checkInteger(o.lockDelayMs, `${argument}.lockDelayMs`, 0, MAX_DURATION_MS),
    autoRenew: o.autoRenew === undefined ? base.autoRenew : checkBoolean(o.autoRenew, `${argument}.autoRenew`),
    fair: o.fair === undefined ? base.fair : checkBoolean(o.fair, `${argument}.fair`),
    minHoldMs: o.minHoldMs === undefined ? base.minHoldMs : checkInteger(o.minHoldMs, `${argument}.minHoldMs`, 0, MAX_DURATION_MS),
  };
}

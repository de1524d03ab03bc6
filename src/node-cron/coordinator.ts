import type { Lease } from '../core/lease.js';
import type { Locks } from '../core/locks.js';
import { checkLabel } from '../core/options.js';
import { checkInteger, checkKnownOptions, checkObject, checkTtl, describe, MAX_DURATION_MS } from '../core/validate.js';
import { InvalidArgumentError } from '../core/errors.js';

/**
 * node-cron 4's run coordinator (node-cron ≥ 4.4), written out here so that this entry point needs
 * nothing from node-cron at run time: a task with `distributed: true` and a `name` asks
 * `shouldRun(key, ttlMs)` at each fire time and runs only on `true`; after the run (success or
 * failure) it calls `onComplete(key)`. `key` is `${task name}:${fire time as toISOString()}`, the
 * same on every instance whose clock names the same fire time; `ttlMs` is the task's
 * `distributedLease` (node-cron's default: 30 s). A `shouldRun` that rejects makes node-cron skip
 * that fire time (`execution:skipped`, reason `coordinator-error`); `false` skips it as `not-elected`.
 */
export interface RunCoordinator {
  shouldRun(key: string, ttlMs: number): boolean | Promise<boolean>;
  onComplete?(key: string): void | Promise<void>;
}

/** The part of node-cron's `TaskContext` that names a fire time: the task's name and the fire time. */
export interface CronTaskContext {
  date: Date;
  task?: { name?: string } | undefined;
}

export interface CronCoordinatorOptions {
  /**
   * The slot's lease is held at least this long after its grant, even when the task ends sooner, so
   * an instance whose clock is up to this much late (or whose timer fires late) finds the slot taken
   * instead of running it again. @default the ttl (the task's `distributedLease`, 30 s in node-cron)
   */
  minHoldMs?: number;
  /**
   * Time-to-live of a slot's lease: renewed while the task runs, it is how long the slot stays
   * taken after a crash of the instance running it. @default the `ttlMs` node-cron passes (`distributedLease`)
   */
  ttlMs?: number;
  /** The public label of each grant (shown by `leasehold ls` and the dashboard). @default the Locks' holderName */
  label?: string;
  /** Put before node-cron's key to form the lease's key, so slots are easy to list (`leasehold ls cron:`). @default 'cron:' */
  keyPrefix?: string;
  /**
   * Called when the coordinator could not be asked (the slot is then skipped on this instance: never
   * run without the lease) or a release failed (the slot's key then expires by itself). Never
   * throws into node-cron. @default a process warning (code LEASEHOLD_CRON)
   */
  onError?: (error: unknown, key: string) => void;
}

/** A node-cron `RunCoordinator` whose slots are leasehold leases; see {@link cronCoordinator}. */
export interface CronCoordinator extends RunCoordinator {
  /** Takes the slot's lease without waiting; true only on the instance that got it. Never rejects. */
  shouldRun(key: string, ttlMs: number): Promise<boolean>;
  /** Releases the slot's lease (kept until grant + minHoldMs, then it expires). Never rejects. */
  onComplete(key: string): Promise<void>;
  /**
   * The lease of a slot this instance is running, by node-cron's key or by the task's context
   * (`coordinator.lease(context)` inside the task): its `signal` aborts if the lease is lost, its
   * `token` is the slot's grant (see {@link cronCoordinator} for what it fences). `undefined` outside a coordinated run (`task.execute()`, a slot
   * another instance runs, a background task's child process).
   */
  lease(slot: string | CronTaskContext): Lease | undefined;
}

/** 'cron:': slot keys read `cron:<task name>:<fire time>`. */
const DEFAULT_PREFIX = 'cron:';

/**
 * A node-cron 4 `RunCoordinator` that runs each fire time of a distributed task on one instance:
 * the first instance to take the slot's lease (`locks.tryAcquire`, never waiting) runs it, the
 * others skip. The lease is held at least `minHoldMs` from its grant, so an instance that fires the
 * same slot a little later (a clock a few seconds behind, a late timer) skips too instead of running
 * it again after the first one finished. What it does not do: an instance that asks after both
 * the run ended and `minHoldMs` since the grant passed runs the slot again, and a slot whose
 * instance crashed mid-run is not run by another (its key expires after `ttlMs`).
 *
 * Each fire time is its own key (`cron:<name>:<ISO time>`), so the lease's token counts grants of
 * that slot only: 1, or more if the slot was taken over. It fences a zombie run of the same slot;
 * to fence writes across runs (yesterday's frozen run against today's), take a lease on the
 * resource inside the job and write with that token. And the SQL stores (SQLite, PostgreSQL) keep
 * each key's last token for good (I1): one row per fire time, 86,400 a day for a schedule every second.
 *
 * ```js
 * cron.schedule('0 3 * * *', job, { name: 'nightly', distributed: true, runCoordinator: cronCoordinator(locks) });
 * ```
 */
export function cronCoordinator(locks: Locks, options?: CronCoordinatorOptions): CronCoordinator {
  if (typeof (locks as Partial<Locks> | null)?.tryAcquire !== 'function') {
    throw new InvalidArgumentError('locks', `expected a Locks (createLocks()), got ${describe(locks)}`);
  }
  const o = checkObject(options, 'options');
  checkKnownOptions(o, ['minHoldMs', 'ttlMs', 'label', 'keyPrefix', 'onError'], 'options');
  const minHoldMs = o.minHoldMs === undefined ? undefined : checkInteger(o.minHoldMs, 'options.minHoldMs', 0, MAX_DURATION_MS);
  const ttlMs = o.ttlMs === undefined ? undefined : checkTtl(o.ttlMs, 'options.ttlMs');
  const label = o.label === undefined ? undefined : checkLabel(o.label, 'options.label');
  if (o.keyPrefix !== undefined && typeof o.keyPrefix !== 'string') {
    throw new InvalidArgumentError('options.keyPrefix', `expected a string, got ${describe(o.keyPrefix)}`);
  }
  const prefix = (o.keyPrefix as string | undefined) ?? DEFAULT_PREFIX;
  if (o.onError !== undefined && typeof o.onError !== 'function') {
    throw new InvalidArgumentError('options.onError', `expected a function, got ${describe(o.onError)}`);
  }
  const onError = (o.onError as CronCoordinatorOptions['onError']) ?? warn;
  const report = (error: unknown, key: string): void => {
    try {
      onError(error, key);
    } catch (thrown) {
      warn(thrown, key);
    }
  };

  /** The slots this instance is running, by node-cron's key. */
  const running = new Map<string, Lease>();

  return {
    async shouldRun(key, cronTtlMs) {
      try {
        const ttl = ttlMs ?? cronTtlMs;
        const lease = await locks.tryAcquire(prefix + key, { ttlMs: ttl, minHoldMs: minHoldMs ?? ttl, ...(label === undefined ? {} : { label }) });
        if (lease === null) return false;
        running.set(key, lease);
        return true;
      } catch (error) {
        report(error, key);
        return false;
      }
    },

    async onComplete(key) {
      const lease = running.get(key);
      if (lease === undefined) return;
      running.delete(key);
      try {
        await lease.release();
      } catch (error) {
        report(error, key);
      }
    },

    lease(slot) {
      if (typeof slot === 'string') return running.get(slot);
      const name = slot?.task?.name;
      if (name === undefined || !(slot.date instanceof Date)) return undefined;
      return running.get(`${name}:${slot.date.toISOString()}`);
    },
  };
}

function warn(error: unknown, key: string): void {
  const message = error instanceof Error ? error.message : String(error);
  process.emitWarning(`leasehold/node-cron: slot ${key}: ${message}`, { code: 'LEASEHOLD_CRON' });
}

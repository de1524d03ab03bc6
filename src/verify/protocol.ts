/**
 * What `leasehold verify` and its worker processes (worker.ts) say to each other over IPC, and
 * the history they write together.
 *
 * Every history event carries `t`: milliseconds since the run's origin on CLOCK_MONOTONIC
 * (`process.hrtime.bigint()`, which Linux keeps system-wide, so the harness and every worker
 * read the same clock). It is taken independently of the (possibly skewed) clock the worker's
 * `Locks` runs on, so events of different processes can be ordered. Tokens travel as decimal
 * strings (JSON has no bigint).
 */
import type { NemesisKind } from './schedule.js';
import type { StoreConfig } from './store.js';

/**
 * Test-only switch of the worker processes (the verify tests' I6 mutant; not for use otherwise):
 * with `LEASEHOLD_VERIFY_TEST_MUTANT=overstated-ttl` in verify's environment, each worker's backend
 * reports every grant and renewal with twice the ttl the coordinator applied, so the lease's local
 * validity outlasts the coordinator's expiry (I5 broken). The I6 check must then fail. verify
 * prints a line saying so when it is set.
 */
export const MUTANT_ENV = 'LEASEHOLD_VERIFY_TEST_MUTANT';
export const MUTANTS = Object.freeze(['overstated-ttl'] as const);

/** Passed to each worker as its one command-line argument, JSON-encoded. */
export interface WorkerConfig {
  /** 1-based; the worker is called `w<index>` everywhere. */
  index: number;
  /** The coordinator URL this worker leases from (through its own delaying proxy when delay applies). */
  leaseUrl: string;
  /** The protected resource's store (through the worker's proxy when it is a server and delay applies). */
  store: StoreConfig;
  key: string;
  resource: string;
  ttlMs: number;
  /** Time spent "working" inside the critical section, between the grant and the write. */
  workMs: number;
  /** acquire's waitMs; a timeout is recorded and the worker tries again. */
  waitMs: number;
  /** true: write through the fence. false: the control (read after acquiring, write without a token check). */
  fenced: boolean;
  /** The clock the worker's Locks runs on. */
  clock: { offsetMs: number; rate: number };
  /** Locks' driftFactor (the verifier uses the default; passed so the checker and worker agree). */
  driftFactor: number;
  /** `verify --limit N`: each lease is a permit of a semaphore of N (`acquire(key, { limit })`). Undefined: an exclusive lock. */
  limit?: number | undefined;
  /**
   * The control of `--limit` (`--count-then-acquire`): a broken semaphore, as code that builds its own
   * would: count the key's holders with inspect, and take a plain shared lock when fewer than `limit`.
   */
  countThenAcquire?: boolean | undefined;
}

export type WorkerCommand =
  /** Begin the acquire → work → write → release loop; `originNs` (the harness' `process.hrtime.bigint()`, decimal) is time 0 of the history. */
  | { cmd: 'start'; originNs: string }
  /** Clock nemesis: run the Locks clock at this rate from now on. */
  | { cmd: 'clock'; rate: number }
  /** Finish the operation in progress (a pending acquire is abandoned), release, close, exit. */
  | { cmd: 'stop' };

/** Events written by workers. `w` is the worker's index, `op` the operation id (`w2.17`). */
export type WorkerEvent =
  /** Sent before the run starts, so its `t` is 0. */
  | { type: 'ready'; t: number; w: number; pid: number }
  | { type: 'acquire'; t: number; w: number; op: string }
  | { type: 'granted'; t: number; w: number; op: string; token: string; ttlMs: number }
  | { type: 'acquire-failed'; t: number; w: number; op: string; error: string }
  /**
   * When this lease's local validity runs out, in run time, as computed by the worker from
   * `lease.remainingMs()` and its clock's current rate. Sent at the grant, after each renewal and
   * after each rate change.
   */
  | { type: 'validity'; t: number; w: number; token: string; until: number }
  /** Control only: the counter as read right after acquiring. */
  | { type: 'read'; t: number; w: number; op: string; value: number }
  | { type: 'read-failed'; t: number; w: number; op: string; error: string }
  | { type: 'write'; t: number; w: number; op: string; token: string }
  /** `value` is the counter after the write, when the store tells it (SQL stores; not Redis' MULTI). */
  | { type: 'accepted'; t: number; w: number; op: string; token: string; value?: number }
  | { type: 'refused'; t: number; w: number; op: string; token: string; highest: string }
  /** Anything but a refusal: the write may or may not have happened (indeterminate). */
  | { type: 'write-failed'; t: number; w: number; op: string; token: string; error: string }
  /**
   * `lease.signal` aborted; `t` is when the abort listener ran. `due` is the validity deadline in
   * force then; `running` says whether the worker's event loop ran a timer due after `due` before
   * this signal (if it did, the signal was late while the process ran; if not, the process was
   * not running — frozen or stalled — between its deadline and the signal).
   */
  | { type: 'lost'; t: number; w: number; token: string; reason: string; due: number | null; running: boolean }
  /** Release requested (a lease whose validity ran out was already reported `lost`: core makes the loss official when the lease is looked at). */
  | { type: 'release'; t: number; w: number; op: string; token: string }
  | { type: 'released'; t: number; w: number; op: string; token: string; error?: string }
  /** The worker applied a clock rate (the initial one at start, with its offset). */
  | { type: 'clock'; t: number; w: number; rate: number; offsetMs: number }
  | { type: 'finished'; t: number; w: number }
  | { type: 'failed'; t: number; w: number; error: string };

/** Events written by the harness (the nemesis and the run's frame). */
export type HarnessEvent =
  | { type: 'start'; t: number }
  | { type: 'stop'; t: number }
  /** SIGSTOP sent to a worker (it stops within a moment); `plannedMs` is how long it stays frozen. */
  | { type: 'pause'; t: number; w: number; pid: number; plannedMs: number }
  /** SIGCONT sent. */
  | { type: 'resume'; t: number; w: number; pid: number }
  /** The worker's proxies start holding its client→server bytes. */
  | { type: 'delay'; t: number; w: number; plannedMs: number }
  /** …and deliver them, in order. */
  | { type: 'delay-end'; t: number; w: number; heldBytes: number }
  | { type: 'crash'; t: number; what: string }
  | { type: 'restart'; t: number; what: string; error?: string }
  /** Clock nemesis: rate sent to a worker (it applies it when it next runs: see its `clock` event). */
  | { type: 'clock-set'; t: number; w: number; rate: number; restore?: boolean }
  /** A planned fault that found nobody to hit (no holder within the wait) or could not run. */
  | { type: 'skipped'; t: number; kind: NemesisKind; why: string }
  /** A worker process exited; `code`/`signal` as reported by Node. */
  | { type: 'exit'; t: number; w: number; code: number | null; signal: string | null };

export type HistoryEvent = WorkerEvent | HarnessEvent;

/** An event without its time (the recorder stamps it). */
export type Unstamped<E> = E extends unknown ? Omit<E, 't'> : never;

/** Run time in ms (0.01 ms precision) since `originNs` (the start of the workload), on CLOCK_MONOTONIC. */
export function runTime(originNs: bigint): number {
  return Number((process.hrtime.bigint() - originNs) / 10_000n) / 100;
}

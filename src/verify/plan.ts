/**
 * The options of `leasehold verify` and what they add up to: which coordinator, where the
 * protected resource lives, and every check of an option against the others (before anything is
 * started, so a refused run leaves nothing behind).
 */
import { resolve } from 'node:path';
import { backendLoader, mysqlUrl, redact } from '../connect.js';
import { InvalidArgumentError } from '../core/errors.js';
import { MAX_LIMIT } from '../core/options.js';
import { formatDuration } from '../util/duration.js';
import { VerifyError } from './errors.js';
import { LOCAL_KINDS, type LocalKind } from './local.js';
import { prepareReportDir } from './report.js';
import type { NemesisKind } from './schedule.js';
import { STORE_KINDS, type StoreKind } from './store.js';

export interface VerifyOptions {
  /** The coordinator: a backend URL, or `local:redis|postgres|etcd|redlock|sqlite` for one verify starts (and can crash). */
  url: string;
  /** Where the protected resource lives. @default the coordinator's technology when it has a fence (sqlite, postgres, mysql, redis), else sqlite */
  fence?: StoreKind | undefined;
  /** The resource's server for `fence` postgres, mysql or redis. @default the coordinator's URL when it is of that kind */
  fenceUrl?: string | undefined;
  /** @default 3 */
  workers: number;
  /** @default 30000 */
  durationMs: number;
  /** @default 1000 */
  ttlMs: number;
  /** Time inside the critical section before the write. @default ttl / 5 */
  workMs?: number | undefined;
  /** @default random (printed) */
  seed?: number | undefined;
  /** Requested nemeses. @default all four */
  nemeses: readonly NemesisKind[];
  /** false: the control run (`--no-fence`). @default true */
  fenced: boolean;
  reportDir?: string | undefined;
  /** The workers hold permits of a semaphore of this many instead of an exclusive lock (1 … 10,000, fewer than `workers`). */
  limit?: number | undefined;
  /** The control run of `limit`: a semaphore the workers build themselves, count with inspect then take a shared lock (must fail). */
  countThenAcquire?: boolean | undefined;
}

/** `--workers` when `--limit N` is given without it: 2N + 2 (at most 64), enough contenders that the control fails reliably. */
export function defaultWorkers(limit: number | undefined): number {
  return limit === undefined ? 3 : Math.min(VERIFY_LIMITS.maxWorkers, 2 * limit + 2);
}

/** Limits, each with its reason. */
export const VERIFY_LIMITS = Object.freeze({
  /** Below 100 ms, IPC and process scheduling on a busy machine eat the lease before any fault lands. */
  minTtlMs: 100,
  /** At least one operation per worker and a fault: 1 s. */
  minDurationMs: 1_000,
  maxWorkers: 64,
});

/** What the coordinator URL is. */
export interface CoordinatorKind {
  tech: 'sqlite' | 'postgres' | 'mysql' | 'redis' | 'redlock' | 'etcd';
  local: LocalKind | undefined;
}

function coordinatorKind(url: string): CoordinatorKind {
  const local = /^local:(.*)$/i.exec(url);
  if (local) {
    const kind = local[1]!.toLowerCase() as LocalKind;
    if (!LOCAL_KINDS.includes(kind)) throw usage(`--url local:${local[1]} is not one verify can start; use local:${LOCAL_KINDS.join(', local:')}`);
    return { tech: kind, local: kind };
  }
  if (/^memory:/i.test(url))
    throw usage(
      "--url memory: lives in one process; verify's workers are separate processes (use sqlite:PATH, redis://, postgres://, mysql://, etcd:// or local:KIND)",
    );
  try {
    backendLoader(url);
  } catch (error) {
    if (error instanceof InvalidArgumentError) throw usage(error.message.replace(/^invalid url: /, '--url: '));
    throw error;
  }
  const scheme = /^([a-z]+)/i.exec(url)![1]!.toLowerCase();
  const tech = scheme === 'postgresql' ? 'postgres' : scheme === 'rediss' ? 'redis' : scheme === 'mariadb' ? 'mysql' : scheme;
  return { tech: tech as CoordinatorKind['tech'], local: undefined };
}

/** The URLs `--fence-url` takes for each server store. */
const FENCE_URLS: Readonly<Record<Exclude<StoreKind, 'sqlite'>, { pattern: RegExp; example: string }>> = Object.freeze({
  postgres: { pattern: /^postgres(ql)?:\/\//i, example: 'postgres://' },
  mysql: { pattern: /^(mysql|mariadb):\/\//i, example: 'mysql:// (or mariadb://)' },
  redis: { pattern: /^rediss?:\/\//i, example: 'redis://' },
});

export interface Plan {
  coordinator: CoordinatorKind;
  fence: StoreKind;
  /** How to reach the resource's store: a URL, or 'local' (a local server of its own, or the coordinator's). */
  fenceUrl: string | undefined;
}

export function plan(o: VerifyOptions): Plan {
  if (!Number.isInteger(o.workers) || o.workers < 1 || o.workers > VERIFY_LIMITS.maxWorkers)
    throw usage(`--workers must be an integer from 1 to ${VERIFY_LIMITS.maxWorkers}, got ${o.workers}`);
  if (o.ttlMs < VERIFY_LIMITS.minTtlMs) throw usage(`--ttl must be at least ${formatDuration(VERIFY_LIMITS.minTtlMs)}, got ${formatDuration(o.ttlMs)}`);
  if (o.durationMs < VERIFY_LIMITS.minDurationMs)
    throw usage(`--duration must be at least ${formatDuration(VERIFY_LIMITS.minDurationMs)}, got ${formatDuration(o.durationMs)}`);
  if (o.durationMs < 2 * o.ttlMs) throw usage(`--duration (${formatDuration(o.durationMs)}) must be at least twice --ttl (${formatDuration(o.ttlMs)})`);
  if (o.workMs !== undefined && o.workMs >= o.ttlMs)
    throw usage(`--work (${formatDuration(o.workMs)}) must be shorter than --ttl (${formatDuration(o.ttlMs)})`);
  if (o.limit !== undefined) {
    if (!Number.isInteger(o.limit) || o.limit < 1 || o.limit > MAX_LIMIT) throw usage(`--limit must be an integer from 1 to ${MAX_LIMIT}, got ${o.limit}`);
    if (o.workers <= o.limit)
      throw usage(`--limit ${o.limit} needs more --workers than permits (got ${o.workers}), or no worker ever waits for one and nothing is checked`);
    if (!o.fenced)
      throw usage(
        '--limit and --no-fence do not go together: N permit holders write at once by design, so unfenced writes lose updates whether or not the semaphore works (the control run of --limit is --count-then-acquire)',
      );
  }
  if (o.countThenAcquire && o.limit === undefined) throw usage('--count-then-acquire is the control run of --limit N: give --limit too');
  const coordinator = coordinatorKind(o.url);
  const fence = o.fence ?? ((STORE_KINDS as readonly string[]).includes(coordinator.tech) ? (coordinator.tech as StoreKind) : 'sqlite');
  if (!STORE_KINDS.includes(fence)) throw usage(`--fence must be one of ${STORE_KINDS.join(', ')}, got ${fence}`);
  let fenceUrl = o.fenceUrl;
  if (fence === 'sqlite') {
    if (fenceUrl !== undefined) throw usage('--fence-url is for --fence postgres, mysql or redis; the SQLite resource is a file verify creates');
  } else if (fenceUrl !== undefined) {
    const { pattern, example } = FENCE_URLS[fence];
    if (!pattern.test(fenceUrl)) throw usage(`--fence-url must be a ${example} URL for --fence ${fence}, got ${JSON.stringify(redact(fenceUrl))}`);
    if (fence === 'mysql') {
      try {
        mysqlUrl(fenceUrl);
      } catch (error) {
        if (error instanceof InvalidArgumentError) throw usage(error.message.replace(/^invalid url: /, '--fence-url: '));
        throw error;
      }
    }
  } else if (coordinator.tech === fence) {
    fenceUrl = coordinator.local ? undefined : o.url;
  } else {
    throw usage(`--fence ${fence} needs --fence-url (a ${fence} server for the resource): the coordinator is not ${fence}`);
  }
  // Last: a run refused for another bad argument leaves no directory behind.
  if (o.reportDir !== undefined) {
    try {
      prepareReportDir(resolve(o.reportDir));
    } catch (error) {
      throw usage(`cannot use --report ${o.reportDir}: ${(error as Error).message}`);
    }
  }
  return { coordinator, fence, fenceUrl };
}

function usage(message: string): VerifyError {
  return new VerifyError('usage', message);
}

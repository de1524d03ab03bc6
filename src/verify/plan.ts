/**
 * The options of `leasehold verify` and what they add up to: which coordinator, where the
 * protected resource lives, and every check of an option against the others (before anything is
 * started, so a refused run leaves nothing behind).
 */
import { resolve } from 'node:path';
import { backendLoader, redact } from '../connect.js';
import { InvalidArgumentError } from '../core/errors.js';
import { formatDuration } from '../util/duration.js';
import { VerifyError } from './errors.js';
import { LOCAL_KINDS, type LocalKind } from './local.js';
import { prepareReportDir } from './report.js';
import type { NemesisKind } from './schedule.js';
import { STORE_KINDS, type StoreKind } from './store.js';

export interface VerifyOptions {
  /** The coordinator: a backend URL, or `local:redis|postgres|etcd|redlock|sqlite` for one verify starts (and can crash). */
  url: string;
  /** Where the protected resource lives. @default the coordinator's technology when it has a fence (sqlite, postgres, redis), else sqlite */
  fence?: StoreKind | undefined;
  /** The resource's server for `fence` postgres or redis. @default the coordinator's URL when it is of that kind */
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
  tech: 'sqlite' | 'postgres' | 'redis' | 'redlock' | 'etcd';
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
    throw usage("--url memory: lives in one process; verify's workers are separate processes (use sqlite:PATH, redis://, postgres://, etcd:// or local:KIND)");
  try {
    backendLoader(url);
  } catch (error) {
    if (error instanceof InvalidArgumentError) throw usage(error.message.replace(/^invalid url: /, '--url: '));
    throw error;
  }
  const scheme = /^([a-z]+)/i.exec(url)![1]!.toLowerCase();
  const tech = scheme === 'postgresql' ? 'postgres' : scheme === 'rediss' ? 'redis' : scheme;
  return { tech: tech as CoordinatorKind['tech'], local: undefined };
}

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
  const coordinator = coordinatorKind(o.url);
  const fence = o.fence ?? ((STORE_KINDS as readonly string[]).includes(coordinator.tech) ? (coordinator.tech as StoreKind) : 'sqlite');
  if (!STORE_KINDS.includes(fence)) throw usage(`--fence must be one of ${STORE_KINDS.join(', ')}, got ${fence}`);
  let fenceUrl = o.fenceUrl;
  if (fence === 'sqlite') {
    if (fenceUrl !== undefined) throw usage('--fence-url is for --fence postgres or redis; the SQLite resource is a file verify creates');
  } else if (fenceUrl !== undefined) {
    const ok = fence === 'postgres' ? /^postgres(ql)?:\/\//i.test(fenceUrl) : /^rediss?:\/\//i.test(fenceUrl);
    if (!ok)
      throw usage(
        `--fence-url must be a ${fence === 'postgres' ? 'postgres://' : 'redis://'} URL for --fence ${fence}, got ${JSON.stringify(redact(fenceUrl))}`,
      );
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

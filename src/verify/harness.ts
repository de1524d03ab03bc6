/**
 * `leasehold verify`: a Jepsen-style check of a deployment. N real worker processes (worker.ts)
 * loop acquire → work → write → release on one key and one resource while the nemesis freezes
 * them, delays their requests, crashes the coordinator and skews their clocks on a seeded
 * schedule; the checker then reads the recorded history and the resource's final state.
 *
 * Resolves with the exit code: 0 only when every check passed, 1 otherwise. Rejects with `CliExit`
 * for bad arguments (64), a coordinator or store that cannot be reached or started (69), and
 * internal failures. Everything it starts (workers, servers, proxies, temporary files) is stopped
 * and removed on every way out, including SIGINT/SIGTERM/SIGHUP; only `--report DIR` stays.
 */
import { fork, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chmodSync, existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import type { Writable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { backendLoader, redact } from '../connect.js';
import type { Backend } from '../core/backend.js';
import { DEFAULTS } from '../core/locks.js';
import { BackendUnavailableError, InvalidArgumentError } from '../core/errors.js';
import { formatDuration } from '../cli/duration.js';
import { CliExit, EXIT, signalExitCode, usageError } from '../cli/exit.js';
import { check } from './checker.js';
import { tcpEndpoints, viaPorts } from './endpoints.js';
import { LOCAL_KINDS, LocalServerError, startLocal, type LocalKind, type LocalServer } from './local.js';
import { Nemesis, type Target } from './nemesis.js';
import { MUTANT_ENV, MUTANTS, runTime, type HarnessEvent, type HistoryEvent, type Unstamped, type WorkerCommand, type WorkerConfig, type WorkerEvent } from './protocol.js';
import { DelayProxy } from './proxy.js';
import { randomSeed } from './random.js';
import { formatSummary, prepareReportDir, writeReport } from './report.js';
import { describeSchedule, NEMESES, planSchedule, type NemesisKind } from './schedule.js';
import { openAdminStore, STORE_KINDS, type AdminStore, type FinalState, type StoreConfig, type StoreKind } from './store.js';

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

const WORKER_PATH = fileURLToPath(new URL('./worker.js', import.meta.url));
/** Generous bounds for a loaded 2-core machine; only a broken run waits this long. */
const STARTUP_TIMEOUT_MS = 30_000;
const STOP_TIMEOUT_MS = 20_000;

/** What the coordinator URL is. */
interface CoordinatorKind {
  tech: 'sqlite' | 'postgres' | 'redis' | 'redlock' | 'etcd';
  local: LocalKind | undefined;
}

function coordinatorKind(url: string, usage: string): CoordinatorKind {
  const local = /^local:(.*)$/i.exec(url);
  if (local) {
    const kind = local[1]!.toLowerCase() as LocalKind;
    if (!LOCAL_KINDS.includes(kind)) throw usageError(`--url local:${local[1]} is not one verify can start; use local:${LOCAL_KINDS.join(', local:')}`, usage);
    return { tech: kind, local: kind };
  }
  if (/^memory:/i.test(url)) throw usageError('--url memory: lives in one process; verify\'s workers are separate processes (use sqlite:PATH, redis://, postgres://, etcd:// or local:KIND)', usage);
  try {
    backendLoader(url);
  } catch (error) {
    if (error instanceof InvalidArgumentError) throw usageError(error.message.replace(/^invalid url: /, '--url: '), usage);
    throw error;
  }
  const scheme = /^([a-z]+)/i.exec(url)![1]!.toLowerCase();
  const tech = scheme === 'postgresql' ? 'postgres' : scheme === 'rediss' ? 'redis' : scheme;
  return { tech: tech as CoordinatorKind['tech'], local: undefined };
}

interface Plan {
  coordinator: CoordinatorKind;
  fence: StoreKind;
  /** How to reach the resource's store: a URL, or 'local' (a local server of its own, or the coordinator's). */
  fenceUrl: string | undefined;
}

function plan(o: VerifyOptions, usage: string): Plan {
  if (!Number.isInteger(o.workers) || o.workers < 1 || o.workers > VERIFY_LIMITS.maxWorkers) throw usageError(`--workers must be an integer from 1 to ${VERIFY_LIMITS.maxWorkers}, got ${o.workers}`, usage);
  if (o.ttlMs < VERIFY_LIMITS.minTtlMs) throw usageError(`--ttl must be at least ${formatDuration(VERIFY_LIMITS.minTtlMs)}, got ${formatDuration(o.ttlMs)}`, usage);
  if (o.durationMs < VERIFY_LIMITS.minDurationMs) throw usageError(`--duration must be at least ${formatDuration(VERIFY_LIMITS.minDurationMs)}, got ${formatDuration(o.durationMs)}`, usage);
  if (o.durationMs < 2 * o.ttlMs) throw usageError(`--duration (${formatDuration(o.durationMs)}) must be at least twice --ttl (${formatDuration(o.ttlMs)})`, usage);
  if (o.workMs !== undefined && o.workMs >= o.ttlMs) throw usageError(`--work (${formatDuration(o.workMs)}) must be shorter than --ttl (${formatDuration(o.ttlMs)})`, usage);
  const coordinator = coordinatorKind(o.url, usage);
  const fence = o.fence ?? ((STORE_KINDS as readonly string[]).includes(coordinator.tech) ? (coordinator.tech as StoreKind) : 'sqlite');
  if (!STORE_KINDS.includes(fence)) throw usageError(`--fence must be one of ${STORE_KINDS.join(', ')}, got ${fence}`, usage);
  let fenceUrl = o.fenceUrl;
  if (fence === 'sqlite') {
    if (fenceUrl !== undefined) throw usageError('--fence-url is for --fence postgres or redis; the SQLite resource is a file verify creates', usage);
  } else if (fenceUrl !== undefined) {
    const ok = fence === 'postgres' ? /^postgres(ql)?:\/\//i.test(fenceUrl) : /^rediss?:\/\//i.test(fenceUrl);
    if (!ok) throw usageError(`--fence-url must be a ${fence === 'postgres' ? 'postgres://' : 'redis://'} URL for --fence ${fence}, got ${JSON.stringify(redact(fenceUrl))}`, usage);
  } else if (coordinator.tech === fence) {
    fenceUrl = coordinator.local ? undefined : o.url;
  } else {
    throw usageError(`--fence ${fence} needs --fence-url (a ${fence} server for the resource): the coordinator is not ${fence}`, usage);
  }
  // Last: a run refused for another bad argument leaves no directory behind.
  if (o.reportDir !== undefined) {
    try {
      prepareReportDir(resolve(o.reportDir));
    } catch (error) {
      throw usageError(`cannot use --report ${o.reportDir}: ${(error as Error).message}`, usage);
    }
  }
  return { coordinator, fence, fenceUrl };
}

/** A worker process and its lifecycle. */
class WorkerProcess implements Target {
  readonly index: number;
  readonly role: string;
  readonly #child: ChildProcess;
  #stderr = '';
  exit: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  readonly exited: Promise<void>;

  constructor(config: WorkerConfig, onEvent: (e: WorkerEvent) => void, onExit: (w: WorkerProcess) => void) {
    this.index = config.index;
    this.role = `w${config.index}`;
    this.#child = fork(WORKER_PATH, [JSON.stringify(config)], { stdio: ['ignore', 'ignore', 'pipe', 'ipc'], execArgv: [] });
    this.#child.stderr!.setEncoding('utf8').on('data', (d: string) => {
      this.#stderr = (this.#stderr + d).slice(-2_000);
    });
    this.#child.on('message', (e: WorkerEvent) => onEvent(e));
    this.#child.on('error', () => {});
    this.exited = new Promise((resolve) => {
      this.#child.on('exit', (code, signal) => {
        this.exit = { code, signal };
        onExit(this);
        resolve();
      });
    });
  }

  get pid(): number | undefined {
    return this.#child.pid;
  }

  get running(): boolean {
    return this.#child.exitCode === null && this.#child.signalCode === null;
  }

  get stderr(): string {
    return this.#stderr.trim();
  }

  signal(signal: NodeJS.Signals): void {
    if (this.running) this.#child.kill(signal);
  }

  send(command: WorkerCommand): void {
    if (this.running && this.#child.connected) this.#child.send(command);
  }

  /** SIGCONT first: a frozen process cannot die of SIGKILL until it runs. */
  kill(): void {
    if (!this.running) return;
    this.#child.kill('SIGCONT');
    this.#child.kill('SIGKILL');
  }
}

export async function runVerify(o: VerifyOptions, out: Writable, usage: string): Promise<number> {
  const p = plan(o, usage);
  if (!existsSync(WORKER_PATH)) throw new CliExit(EXIT.SOFTWARE, `verify worker not found at ${WORKER_PATH} (run npm run build)`);
  const seed = o.seed ?? randomSeed();
  const runId = randomBytes(4).toString('hex');
  const key = `leasehold-verify/${runId}/lock`;
  const resource = `leasehold-verify/${runId}/counter`;
  const print = (...lines: string[]): void => {
    for (const l of lines) out.write(`${l}\n`);
  };

  const dir = mkdtempSync(join(tmpdir(), 'leasehold-verify-'));
  /** Time 0 of the history: when the workers are told to start (before that, now() is 0). */
  let origin: bigint | undefined;
  const now = (): number => (origin === undefined ? 0 : runTime(origin));
  const events: HistoryEvent[] = [];
  const workers: WorkerProcess[] = [];
  const servers: LocalServer[] = [];
  const proxies = new Map<number, DelayProxy[]>();
  let admin: AdminStore | undefined;
  let storeIsLocal = false;
  let nemesis: Nemesis | undefined;
  let progress: ReturnType<typeof setInterval> | undefined;
  let cleaned: Promise<void> | undefined;

  const cleanup = (): Promise<void> =>
    (cleaned ??= (async () => {
      if (progress) clearInterval(progress);
      for (const w of workers) w.kill();
      if (admin) {
        // What the run wrote into a user's store is deleted; a store verify started goes with its directory.
        if (!storeIsLocal) await admin.cleanup(resource).catch(() => {});
        await admin.close().catch(() => {});
      }
      // Servers before the nemesis: healing on its way out must not restart a coordinator being stopped.
      await Promise.all(servers.map((s) => s.stop().catch(() => {})));
      await nemesis?.stop().catch(() => {});
      await Promise.all(workers.map((w) => w.exited));
      for (const list of proxies.values()) await Promise.all(list.map((x) => x.close()));
      rmSync(dir, { recursive: true, force: true });
    })());
  // Last resort if verify dies of an internal error before its cleanup: the run directory goes anyway.
  const removeDir = (): void => rmSync(dir, { recursive: true, force: true });
  process.once('exit', removeDir);
  const onSignal = (signal: NodeJS.Signals): void => {
    void cleanup().finally(() => process.exit(signalExitCode(signal)));
  };
  const stopSignals: NodeJS.Signals[] = ['SIGINT', 'SIGTERM', 'SIGHUP'];
  for (const s of stopSignals) process.on(s, onSignal);

  try {
    // The coordinator, and the resource's store.
    let coordinatorUrl = o.url;
    let coordinator: LocalServer | undefined;
    const unavailable = (what: string, error: unknown): CliExit =>
      new CliExit(EXIT.UNAVAILABLE, `${what}: ${error instanceof Error ? error.message : String(error)}`);
    if (p.coordinator.local) {
      if (p.coordinator.local === 'postgres') chmodSync(dir, 0o711); // the postgres OS user must reach its cluster directory
      try {
        coordinator = await startLocal(p.coordinator.local, dir, 'coordinator');
      } catch (error) {
        if (error instanceof LocalServerError) throw unavailable(`cannot start local:${p.coordinator.local}`, error);
        throw error;
      }
      servers.push(coordinator);
      coordinatorUrl = coordinator.url;
    }
    let storeLocation: string;
    storeIsLocal = p.fenceUrl === undefined;
    if (p.fence === 'sqlite') storeLocation = join(dir, 'resource.db');
    else if (p.fenceUrl !== undefined) storeLocation = p.fenceUrl;
    else if (p.fence === 'redis') {
      // Redis without persistence loses everything in a crash: the resource gets a server of its own, which is never crashed.
      try {
        const store = await startLocal('redis', dir, 'resource');
        servers.push(store);
        storeLocation = store.url;
      } catch (error) {
        throw unavailable('cannot start a local redis-server for the resource', error);
      }
    } else storeLocation = coordinator!.url; // local:postgres: the same (durable) cluster
    const storeTimeoutMs = Math.max(10_000, 4 * o.ttlMs);
    const storeConfig: StoreConfig = { kind: p.fence, location: storeLocation, timeoutMs: storeTimeoutMs };

    // Reach the coordinator once: its minimum ttl, and a clear exit 69 when it is down.
    let backend: Backend | undefined;
    let effectiveTtl: number;
    try {
      backend = await backendLoader(coordinatorUrl)();
      await Promise.race([
        backend.inspect(key),
        new Promise((_, reject) => setTimeout(() => reject(new BackendUnavailableError('verify', 'no answer within 10 s')), 10_000).unref()),
      ]);
      effectiveTtl = Math.max(o.ttlMs, backend.capabilities.minTtlMs);
    } catch (error) {
      throw unavailable(`coordinator ${redact(coordinatorUrl)} unavailable`, error);
    } finally {
      await backend?.close().catch(() => {});
    }
    try {
      admin = await openAdminStore(storeConfig);
      await admin.setup(resource);
    } catch (error) {
      throw unavailable(`resource store (${p.fence}${p.fence === 'sqlite' ? '' : ` at ${redact(storeLocation)}`}) unavailable`, error);
    }

    // Which nemeses apply.
    const coordinatorTcp = tcpEndpoints(coordinatorUrl);
    const storeTcp = p.fence === 'sqlite' ? [] : tcpEndpoints(storeLocation);
    const notApplicable = (kind: NemesisKind): string | undefined => {
      if (kind === 'crash' && !coordinator?.crashable) {
        return coordinator ? 'SQLite has no server to crash' : 'verify did not start the coordinator; use --url local:redis, local:postgres, local:etcd or local:redlock';
      }
      if (kind === 'delay' && coordinatorTcp.length + storeTcp.length === 0) {
        return p.coordinator.tech === 'sqlite' && p.fence === 'sqlite'
          ? 'no TCP service: the coordinator and the resource are SQLite files'
          : 'no TCP service: nothing here is reached over TCP (SQLite, a Unix socket, TLS)';
      }
      return undefined;
    };
    const requested = NEMESES.filter((k) => o.nemeses.includes(k));
    const nemeses = requested.map((kind) => ({ kind, notApplicable: notApplicable(kind) }));
    const active = nemeses.filter((n) => !n.notApplicable).map((n) => n.kind);
    const schedule = planSchedule({ seed, durationMs: o.durationMs, ttlMs: effectiveTtl, workers: o.workers, nemeses: active });
    const workMs = o.workMs ?? Math.round(effectiveTtl / 5);

    // One delaying proxy per worker per TCP endpoint.
    if (active.includes('delay')) {
      for (let w = 1; w <= o.workers; w++) {
        const list: DelayProxy[] = [];
        for (const target of [...coordinatorTcp, ...storeTcp]) list.push(await DelayProxy.start(target));
        proxies.set(w, list);
      }
    }
    const urlsFor = (w: number): { lease: string; store: string } => {
      const list = proxies.get(w);
      if (!list) return { lease: coordinatorUrl, store: storeLocation };
      const ports = list.map((x) => x.port);
      return {
        lease: coordinatorTcp.length > 0 ? viaPorts(coordinatorUrl, ports.slice(0, coordinatorTcp.length)) : coordinatorUrl,
        store: storeTcp.length > 0 ? viaPorts(storeLocation, ports.slice(coordinatorTcp.length)) : storeLocation,
      };
    };

    const mutant = process.env[MUTANT_ENV] || undefined;
    const coordinatorText = coordinator ? `${o.url} (${coordinator.name}, started by verify${coordinator.durable ? '' : '; no persistence'})` : redact(coordinatorUrl);
    const storeText = p.fence === 'sqlite' ? 'SQLite file in the run directory' : redact(storeLocation);
    print(
      `leasehold verify: run ${runId}, seed ${seed} (repeat with --seed ${seed})`,
      `  coordinator  ${coordinatorText}`,
      `  resource     ${p.fence}: ${storeText}; ${o.fenced ? `writes through the fence (${p.fence}Fence)` : 'CONTROL RUN (--no-fence): read after acquiring, write without any token check'}`,
      `  workers      ${o.workers} processes, ${formatDuration(o.durationMs)}, ttl ${formatDuration(effectiveTtl)}${effectiveTtl !== o.ttlMs ? ` (the coordinator's minimum; asked ${formatDuration(o.ttlMs)})` : ''}, work ${formatDuration(workMs)} before each write`,
      `  nemesis      ${nemeses.length === 0 ? 'none' : nemeses.map((n) => (n.notApplicable ? `${n.kind} n/a (${n.notApplicable})` : n.kind)).join('; ')}`,
      ...describeSchedule(schedule, active).map((l, i) => `  ${i === 0 ? 'schedule' : '        '}     ${l}`),
      ...(mutant === undefined ? [] : [
        `  ${MUTANT_ENV}=${mutant}: ${(MUTANTS as readonly string[]).includes(mutant) ? 'the workers overstate their leases\' ttl (×2), a test-only mutant: the I6 check must fail' : 'not a known mutant; ignored'}`,
      ]),
    );

    // Workers.
    const record = (e: HistoryEvent): void => {
      events.push(e);
    };
    /** Faults waiting for the next grant; each grant goes to one of them (two faults never pick the same grant). */
    const grantWaiters = new Set<(w: number) => boolean>();
    const failures: string[] = [];
    let stopping = false;
    const onEvent = (e: WorkerEvent): void => {
      record(e);
      if (e.type === 'granted') [...grantWaiters].some((take) => take(e.w));
      if (e.type === 'failed') failures.push(`w${e.w} failed: ${e.error}`);
    };
    const onExit = (w: WorkerProcess): void => {
      const how = w.exit?.signal ?? `code ${w.exit?.code}`;
      record({ type: 'exit', t: now(), w: w.index, code: w.exit?.code ?? null, signal: w.exit?.signal ?? null });
      const said = w.stderr ? `: ${w.stderr.split('\n').at(-1)}` : '';
      if (!stopping) failures.push(`w${w.index} (pid ${w.pid}) exited during the run (${how})${said}`);
      else if (w.exit?.code !== 0 && w.exit?.signal !== 'SIGKILL') failures.push(`w${w.index} (pid ${w.pid}) exited with ${how} while stopping${said}`);
    };
    for (let w = 1; w <= o.workers; w++) {
      const urls = urlsFor(w);
      const config: WorkerConfig = {
        index: w,
        leaseUrl: urls.lease,
        store: { ...storeConfig, location: urls.store },
        key,
        resource,
        ttlMs: o.ttlMs,
        workMs,
        waitMs: Math.max(10_000, 10 * effectiveTtl),
        fenced: o.fenced,
        // Each worker's clock starts at a different, large offset: offsets never matter (only differences are used).
        clock: { offsetMs: (seed % 1_000 + w) * 86_400_000 * (w % 2 === 0 ? 1 : -1), rate: 1 },
        driftFactor: DEFAULTS.driftFactor,
      };
      workers.push(new WorkerProcess(config, onEvent, onExit));
    }
    const readyBy = performance.now() + STARTUP_TIMEOUT_MS;
    while (events.filter((e) => e.type === 'ready').length < o.workers) {
      if (failures.length > 0) throw new CliExit(EXIT.FAILURE, `a worker did not start: ${failures[0]}`);
      if (performance.now() > readyBy) throw new CliExit(EXIT.FAILURE, `workers did not start within ${formatDuration(STARTUP_TIMEOUT_MS)}`);
      await sleep(20);
    }

    // Run.
    const say = (line: string): void => print(`  +${(now() / 1000).toFixed(2).padStart(5)}s  ${line}`);
    const harness = (e: Unstamped<HarnessEvent>): void => record({ ...e, t: now() } as HarnessEvent);
    nemesis = new Nemesis(
      {
        now,
        record: harness,
        say,
        workers,
        proxies,
        coordinator: coordinator?.crashable ? coordinator : undefined,
        ttlMs: effectiveTtl,
        nextGrant: (timeoutMs, exclude, signal) =>
          new Promise((resolve) => {
            const done = (w: number | undefined): void => {
              clearTimeout(timer);
              grantWaiters.delete(wake);
              signal.removeEventListener('abort', abort);
              resolve(w);
            };
            const wake = (w: number): boolean => {
              if (exclude.has(w)) return false;
              done(w);
              return true;
            };
            const abort = (): void => done(undefined);
            const timer = setTimeout(() => done(undefined), timeoutMs);
            grantWaiters.add(wake);
            signal.addEventListener('abort', abort);
          }),
      },
      schedule,
    );
    origin = process.hrtime.bigint();
    harness({ type: 'start' });
    for (const w of workers) w.send({ cmd: 'start', originNs: origin.toString() });
    nemesis.start();
    const every = Math.max(1_000, Math.round(o.durationMs / 15 / 1_000) * 1_000);
    progress = setInterval(() => {
      const count = (type: HistoryEvent['type']): number => events.filter((e) => e.type === type).length;
      print(`  [${(now() / 1000).toFixed(1).padStart(5)}s] operations ${count('acquire')}, accepted ${count('accepted')}, refused ${count('refused')}, failed ${count('write-failed')}, leases lost ${count('lost')}`);
    }, every);
    await sleep(o.durationMs);
    clearInterval(progress);

    // Stop: heal every fault, then let the workers finish their operation and exit.
    await nemesis.stop();
    stopping = true;
    harness({ type: 'stop' });
    for (const w of workers) w.send({ cmd: 'stop' });
    const stopTimeout = Math.max(STOP_TIMEOUT_MS, 2 * storeTimeoutMs);
    await Promise.race([Promise.all(workers.map((w) => w.exited)), sleep(stopTimeout)]);
    for (const w of workers) {
      if (w.running) {
        failures.push(`w${w.index} did not stop within ${formatDuration(stopTimeout)}; killed`);
        w.kill();
      }
    }
    await Promise.all(workers.map((w) => w.exited));
    const endMs = now();

    // Check.
    let final: FinalState;
    try {
      final = await admin.final(resource);
    } catch (error) {
      throw unavailable('cannot read the resource\'s final state', error);
    }
    const { checks, stats, flagged } = check({ events, final, fenced: o.fenced, driftFactor: DEFAULTS.driftFactor, coordinatorDurable: coordinator?.durable ?? true });
    if (stats.accepted === 0) failures.push('no write was accepted: the run proves nothing (is the coordinator reachable? try a longer --duration)');
    print(...formatSummary({ stats, checks, nemeses, runProblems: failures }));
    if (o.reportDir !== undefined) {
      let files: { history: string; timeline: string };
      try {
        files = writeReport({
          dir: resolve(o.reportDir),
          header: {
            version: 1, runId, seed, url: redact(o.url), coordinator: redact(coordinatorUrl), fence: p.fence, fenced: o.fenced,
            workers: o.workers, durationMs: o.durationMs, ttlMs: effectiveTtl, workMs, key, resource, nemeses, schedule,
          },
          events,
          final,
          checks,
          flagged,
          workers: workers.map((w) => w.index),
          title: `leasehold verify — ${o.fenced ? `${p.fence} fence` : 'control run (no fence)'}, ${redact(o.url)}`,
          subtitle: `run ${runId}, seed ${seed}, ${o.workers} workers, ttl ${formatDuration(effectiveTtl)}, work ${formatDuration(workMs)}; verdict ${checks.every((c) => c.verdict === 'pass') && failures.length === 0 ? 'PASS' : 'FAIL'}`,
          endMs,
        });
      } catch (error) {
        // Checked before the run (plan), so only a directory changed or a disk filled meanwhile gets here.
        throw usageError(`cannot use --report ${o.reportDir}: ${(error as Error).message}`, usage);
      }
      print(`report: ${files.timeline}`, `        ${files.history}`);
    }
    const passed = checks.every((c) => c.verdict === 'pass') && failures.length === 0;
    return passed ? EXIT.OK : EXIT.FAILURE;
  } finally {
    for (const s of stopSignals) process.off(s, onSignal);
    await cleanup();
    process.off('exit', removeDir);
  }
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/**
 * `leasehold verify`: a Jepsen-style check of a deployment. N real worker processes (worker.ts)
 * loop acquire → work → write → release on one key and one resource while the nemesis freezes
 * them, delays their requests, crashes the coordinator and skews their clocks on a seeded
 * schedule; the checker then reads the recorded history and the resource's final state. With
 * `limit` the workers hold permits of a semaphore of that many (and with `countThenAcquire`, the
 * control, a semaphore they build from inspect and a shared lock); the checker then counts valid
 * permits instead of pairing take-overs (see checker.ts).
 *
 * Resolves with the verdict ({@link VerifyResult}: `passed` only when every check passed and the
 * run had no problem). Rejects with a {@link VerifyError} saying why there is no verdict: bad
 * options, a coordinator or store that cannot be reached or started, workers that did not start;
 * anything else is a bug. Everything it starts (workers, servers, proxies, temporary files) is
 * stopped and removed on every way out; on SIGINT, SIGTERM or SIGHUP it cleans up and the process
 * ends as if killed by that signal (status 128 + n). Only `--report DIR` stays.
 */
import { randomBytes } from 'node:crypto';
import { chmodSync, existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import type { Writable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { backendLoader, redact } from '../connect.js';
import type { Backend } from '../core/backend.js';
import { DEFAULTS } from '../core/locks.js';
import { BackendUnavailableError } from '../core/errors.js';
import { formatDuration } from '../util/duration.js';
import { ChildWorker, onStopSignals, signalExitCode } from '../util/process.js';
import { sleep } from '../util/sleep.js';
import { check, type CheckResult, type Stats } from './checker.js';
import { tcpEndpoints, viaPorts } from './endpoints.js';
import { VerifyError } from './errors.js';
import { LocalServerError, startLocal, type LocalServer } from './local.js';
import { Nemesis, type Target } from './nemesis.js';
import { plan, type VerifyOptions } from './plan.js';
import {
  MUTANT_ENV,
  MUTANTS,
  runTime,
  type HarnessEvent,
  type HistoryEvent,
  type Unstamped,
  type WorkerCommand,
  type WorkerConfig,
  type WorkerEvent,
} from './protocol.js';
import { DelayProxy } from './proxy.js';
import { randomSeed } from './random.js';
import { formatSummary, writeReport } from './report.js';
import { describeSchedule, NEMESES, planSchedule, type NemesisKind } from './schedule.js';
import { openAdminStore } from './open-store.js';
import type { AdminStore, FinalState, StoreConfig } from './store.js';

const WORKER_PATH = fileURLToPath(new URL('./worker.js', import.meta.url));
/** Generous bounds for a loaded 2-core machine; only a broken run waits this long. */
const STARTUP_TIMEOUT_MS = 30_000;
const STOP_TIMEOUT_MS = 20_000;

/** The verdict of a run (what was printed, as data). */
export interface VerifyResult {
  /** Every check passed and nothing went wrong with the run itself. */
  passed: boolean;
  runId: string;
  /** The seed of the fault schedule (`--seed` repeats the run). */
  seed: number;
  checks: CheckResult[];
  stats: Stats;
  /** What went wrong with the run itself (a worker died, nothing was accepted…); empty when nothing did. */
  problems: string[];
  /** The files written into `reportDir`, when one was given. */
  report: { history: string; timeline: string } | undefined;
}

/** A worker process of the run, numbered from 1. */
interface Worker extends Target {
  readonly process: ChildWorker<WorkerCommand, WorkerEvent>;
}

export async function runVerify(o: VerifyOptions, out: Writable): Promise<VerifyResult> {
  const p = plan(o);
  if (!existsSync(WORKER_PATH)) throw new VerifyError('internal', `verify worker not found at ${WORKER_PATH} (run npm run build)`);
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
  const workers: Worker[] = [];
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
      for (const w of workers) w.process.kill();
      if (admin) {
        // What the run wrote into a user's store is deleted; a store verify started goes with its directory.
        if (!storeIsLocal) await admin.cleanup(resource).catch(() => {});
        await admin.close().catch(() => {});
      }
      // Servers before the nemesis: healing on its way out must not restart a coordinator being stopped.
      await Promise.all(servers.map((s) => s.stop().catch(() => {})));
      await nemesis?.stop().catch(() => {});
      await Promise.all(workers.map((w) => w.process.exited));
      for (const list of proxies.values()) await Promise.all(list.map((x) => x.close()));
      rmSync(dir, { recursive: true, force: true });
    })());
  // Last resort if verify dies of an internal error before its cleanup: the run directory goes anyway.
  const removeDir = (): void => rmSync(dir, { recursive: true, force: true });
  process.once('exit', removeDir);
  const offSignals = onStopSignals((signal) => {
    void cleanup().finally(() => process.exit(signalExitCode(signal)));
  });

  try {
    // The coordinator, and the resource's store.
    let coordinatorUrl = o.url;
    let coordinator: LocalServer | undefined;
    const unavailable = (what: string, error: unknown): VerifyError =>
      new VerifyError('unavailable', `${what}: ${error instanceof Error ? error.message : String(error)}`, { cause: error });
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
        return coordinator
          ? 'SQLite has no server to crash'
          : 'verify did not start the coordinator; use --url local:redis, local:postgres, local:etcd or local:redlock';
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
    const coordinatorText = coordinator
      ? `${o.url} (${coordinator.name}, started by verify${coordinator.durable ? '' : '; no persistence'})`
      : redact(coordinatorUrl);
    const storeText = p.fence === 'sqlite' ? 'SQLite file in the run directory' : redact(storeLocation);
    const leaseText =
      o.limit === undefined
        ? "an exclusive lock (one holder at a time: a leader's term)"
        : o.countThenAcquire
          ? `CONTROL RUN (--count-then-acquire): a semaphore of ${o.limit} built by the workers (count the holders with inspect, then take a plain shared lock if fewer than ${o.limit}): the permits check must fail`
          : `permits of a semaphore of ${o.limit} (acquire with limit ${o.limit})`;
    print(
      `leasehold verify: run ${runId}, seed ${seed} (repeat with --seed ${seed})`,
      `  coordinator  ${coordinatorText}`,
      `  resource     ${p.fence}: ${storeText}; ${o.fenced ? `writes through the fence (${p.fence}Fence)` : 'CONTROL RUN (--no-fence): read after acquiring, write without any token check'}`,
      `  lease        ${leaseText}`,
      `  workers      ${o.workers} processes, ${formatDuration(o.durationMs)}, ttl ${formatDuration(effectiveTtl)}${effectiveTtl !== o.ttlMs ? ` (the coordinator's minimum; asked ${formatDuration(o.ttlMs)})` : ''}, work ${formatDuration(workMs)} before each write`,
      `  nemesis      ${nemeses.length === 0 ? 'none' : nemeses.map((n) => (n.notApplicable ? `${n.kind} n/a (${n.notApplicable})` : n.kind)).join('; ')}`,
      ...describeSchedule(schedule, active).map((l, i) => `  ${i === 0 ? 'schedule' : '        '}     ${l}`),
      ...(mutant === undefined
        ? []
        : [
            `  ${MUTANT_ENV}=${mutant}: ${(MUTANTS as readonly string[]).includes(mutant) ? "the workers overstate their leases' ttl (×2), a test-only mutant: the I6 check must fail" : 'not a known mutant; ignored'}`,
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
    const onExit = (w: Worker): void => {
      const { exit, pid, stderr } = w.process;
      const how = exit?.signal ?? `code ${exit?.code}`;
      record({ type: 'exit', t: now(), w: w.index, code: exit?.code ?? null, signal: exit?.signal ?? null });
      const said = stderr ? `: ${stderr.split('\n').at(-1)}` : '';
      if (!stopping) failures.push(`w${w.index} (pid ${pid}) exited during the run (${how})${said}`);
      else if (exit?.code !== 0 && exit?.signal !== 'SIGKILL') failures.push(`w${w.index} (pid ${pid}) exited with ${how} while stopping${said}`);
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
        limit: o.limit,
        countThenAcquire: o.countThenAcquire === true,
        // Each worker's clock starts at a different, large offset: offsets never matter (only differences are used).
        clock: { offsetMs: ((seed % 1_000) + w) * 86_400_000 * (w % 2 === 0 ? 1 : -1), rate: 1 },
        driftFactor: DEFAULTS.driftFactor,
      };
      const worker: Worker = {
        index: w,
        process: new ChildWorker(WORKER_PATH, {
          name: `worker w${w}`,
          args: [JSON.stringify(config)],
          stdout: 'ignore',
          stderr: 'keep',
          onMessage: onEvent,
          onExit: () => onExit(worker),
        }),
      };
      workers.push(worker);
    }
    const readyBy = performance.now() + STARTUP_TIMEOUT_MS;
    while (events.filter((e) => e.type === 'ready').length < o.workers) {
      if (failures.length > 0) throw new VerifyError('failed', `a worker did not start: ${failures[0]}`);
      if (performance.now() > readyBy) throw new VerifyError('failed', `workers did not start within ${formatDuration(STARTUP_TIMEOUT_MS)}`);
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
    for (const w of workers) w.process.send({ cmd: 'start', originNs: origin.toString() });
    nemesis.start();
    const every = Math.max(1_000, Math.round(o.durationMs / 15 / 1_000) * 1_000);
    progress = setInterval(() => {
      const count = (type: HistoryEvent['type']): number => events.filter((e) => e.type === type).length;
      print(
        `  [${(now() / 1000).toFixed(1).padStart(5)}s] operations ${count('acquire')}, accepted ${count('accepted')}, refused ${count('refused')}, failed ${count('write-failed')}, leases lost ${count('lost')}`,
      );
    }, every);
    await sleep(o.durationMs);
    clearInterval(progress);

    // Stop: heal every fault, then let the workers finish their operation and exit.
    await nemesis.stop();
    stopping = true;
    harness({ type: 'stop' });
    for (const w of workers) w.process.send({ cmd: 'stop' });
    const stopTimeout = Math.max(STOP_TIMEOUT_MS, 2 * storeTimeoutMs);
    await Promise.race([Promise.all(workers.map((w) => w.process.exited)), sleep(stopTimeout)]);
    for (const w of workers) {
      if (w.process.running) {
        failures.push(`w${w.index} did not stop within ${formatDuration(stopTimeout)}; killed`);
        w.process.kill();
      }
    }
    await Promise.all(workers.map((w) => w.process.exited));
    const endMs = now();

    // Check.
    let final: FinalState;
    try {
      final = await admin.final(resource);
    } catch (error) {
      throw unavailable("cannot read the resource's final state", error);
    }
    const { checks, stats, flagged } = check({
      events,
      final,
      fenced: o.fenced,
      driftFactor: DEFAULTS.driftFactor,
      coordinatorDurable: coordinator?.durable ?? true,
      limit: o.limit,
    });
    if (stats.accepted === 0) failures.push('no write was accepted: the run proves nothing (is the coordinator reachable? try a longer --duration)');
    print(...formatSummary({ stats, checks, nemeses, runProblems: failures }));
    let files: { history: string; timeline: string } | undefined;
    if (o.reportDir !== undefined) {
      try {
        files = writeReport({
          dir: resolve(o.reportDir),
          header: {
            version: 1,
            runId,
            seed,
            url: redact(o.url),
            coordinator: redact(coordinatorUrl),
            fence: p.fence,
            fenced: o.fenced,
            limit: o.limit ?? null,
            countThenAcquire: o.countThenAcquire === true,
            workers: o.workers,
            durationMs: o.durationMs,
            ttlMs: effectiveTtl,
            workMs,
            key,
            resource,
            nemeses,
            schedule,
          },
          events,
          final,
          checks,
          flagged,
          workers: workers.map((w) => w.index),
          title: `leasehold verify — ${o.fenced ? `${p.fence} fence` : 'control run (no fence)'}${o.limit === undefined ? '' : o.countThenAcquire ? `, count-then-acquire control of a limit of ${o.limit}` : `, semaphore of ${o.limit}`}, ${redact(o.url)}`,
          subtitle: `run ${runId}, seed ${seed}, ${o.workers} workers, ttl ${formatDuration(effectiveTtl)}, work ${formatDuration(workMs)}; verdict ${checks.every((c) => c.verdict === 'pass') && failures.length === 0 ? 'PASS' : 'FAIL'}`,
          endMs,
        });
      } catch (error) {
        // Checked before the run (plan), so only a directory changed or a disk filled meanwhile gets here.
        throw new VerifyError('usage', `cannot use --report ${o.reportDir}: ${(error as Error).message}`, { cause: error });
      }
      print(`report: ${files.timeline}`, `        ${files.history}`);
    }
    const passed = checks.every((c) => c.verdict === 'pass') && failures.length === 0;
    return { passed, runId, seed, checks, stats, problems: failures, report: files };
  } finally {
    offSignals();
    await cleanup();
    process.off('exit', removeDir);
  }
}

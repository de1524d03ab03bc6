import { existsSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import type { Writable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import Database from 'better-sqlite3';
import type { Locks } from '../core/locks.js';
import { createLocks } from '../index.js';
import { sqliteFence, type SqliteDatabase } from '../sqlite/index.js';
import { backendLoader, redact } from '../connect.js';
import { startDashboard, type RunningDashboard } from '../dashboard/server.js';
import { formatDuration } from '../util/duration.js';
import { ChildWorker, onStopSignals, signalExitCode, waitUntilStopped } from '../util/process.js';
import { sleep } from '../util/sleep.js';
import type { WorkerCommand, WorkerConfig, WorkerEvent, WorkerEventName, WorkerRole } from './demo-protocol.js';
import { CliExit, EXIT, usageError } from './exit.js';

export interface DemoOptions {
  /** Lease ttl of both workers. @default 1000 */
  ttlMs: number;
  /** How long worker A stays frozen between its check and its write; must exceed ttlMs. @default 1200 */
  pauseMs: number;
  /** Keep the lease and data files here (created if missing) instead of a temporary directory that is removed. */
  dir: string | undefined;
  /** The coordinator the workers take their leases from. @default a SQLite file in the demo's directory */
  url?: string | undefined;
  /**
   * Serve the dashboard of the demo's lease store while it runs: the demo waits up to
   * `waitForViewerMs` for a page to connect before it starts, and keeps serving after its verdict
   * until SIGINT or SIGTERM.
   */
  dashboard?: { host: string; port: number; waitForViewerMs: number } | undefined;
}

/** The lease both workers take, and the document (and fence resource) it protects. */
export const DEMO_KEY = 'doc:42:recompute';
export const DEMO_DOC = 'doc:42';
const SEED_BODY = 'draft v0';

/** Shortest ttl the demo accepts: below it, IPC round trips on a busy machine eat the lease before the story starts. */
export const DEMO_MIN_TTL_MS = 100;

/**
 * Test-only switch: with `LEASEHOLD_DEMO_MUTANT=unfenced-a`, worker A writes without the fence in
 * the fenced run. The verdict must then fail (exit 1): it proves the check reads the data and is
 * not hard-coded.
 */
export const DEMO_MUTANT_ENV = 'LEASEHOLD_DEMO_MUTANT';

/** Generous bounds for each step, for a loaded 2-core machine; only a broken run ever waits this long. */
const STARTUP_TIMEOUT_MS = 30_000;
const STEP_TIMEOUT_MS = 15_000;

const WORKER_PATH = fileURLToPath(new URL('./demo-worker.js', import.meta.url));

const SQL = Object.freeze({
  createDocuments: `CREATE TABLE IF NOT EXISTS documents (
    id TEXT PRIMARY KEY NOT NULL, body TEXT NOT NULL, written_by TEXT NOT NULL, token INTEGER NOT NULL)`,
  /** A fresh document for each run, written by nobody's lease (token 0). */
  seedDocument: `INSERT INTO documents (id, body, written_by, token) VALUES (?, ?, 'seed', 0)
    ON CONFLICT (id) DO UPDATE SET body = excluded.body, written_by = 'seed', token = 0`,
  fenceTableExists: `SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'leasehold_fences'`,
  forgetFenceMark: 'DELETE FROM leasehold_fences WHERE resource = ?',
  selectDocument: 'SELECT body, written_by AS writtenBy, token FROM documents WHERE id = ?',
});

interface Run {
  title: string;
  fenced: boolean;
  /** How each worker writes; in the fenced run both go through the fence (B's token must raise the mark). */
  writes: Record<WorkerRole, WorkerConfig['write']>;
}

interface RunResult {
  /** Fenced run: B's result survived. Unfenced run: A's stale result replaced B's (the point of the demonstration). */
  expected: boolean;
  /** When not as expected: why, in one line. */
  why?: string;
}

/**
 * `leasehold demo`: the zombie-worker scenario, with real processes. Worker A takes the lease on
 * `doc:42:recompute`, recomputes `doc:42`, checks that its lease is still valid, and is frozen with
 * SIGSTOP for `pauseMs` right there, between the check and the write. Its lease expires at the
 * coordinator; worker B gets it with a higher token and saves. A is continued and saves its stale
 * result. Run 1 writes with a plain UPDATE: A silently overwrites B. Run 2 writes through
 * `sqliteFence`: A's write is refused with StaleTokenError and B's result stays. Each run prints a
 * timeline; the verdicts read the final document from the data file, not the workers' claims.
 *
 * Resolves with 0 when the fenced run kept B's result. Rejects with `CliExit`: 1 naming why when it
 * did not (the verdict is also printed), when a worker fails or when a step times out; 64 for
 * `pauseMs <= ttlMs`, a ttl under {@link DEMO_MIN_TTL_MS} or an unusable `dir`. Workers are
 * killed on every way out, including SIGINT/SIGTERM/SIGHUP; the temporary directory is removed
 * unless `dir` was given.
 */
export async function runDemo(o: DemoOptions, out: Writable, usage: string): Promise<number> {
  if (o.ttlMs < DEMO_MIN_TTL_MS) throw usageError(`--ttl must be at least ${DEMO_MIN_TTL_MS}ms for the demo, got ${formatDuration(o.ttlMs)}`, usage);
  if (o.pauseMs <= o.ttlMs) {
    throw usageError(
      `--pause (${formatDuration(o.pauseMs)}) must be longer than --ttl (${formatDuration(o.ttlMs)}): the story needs worker A frozen until its lease has expired`,
      usage,
    );
  }
  if (o.url !== undefined && /^memory:/i.test(o.url)) {
    throw usageError(
      "--url memory: lives in one process; the demo's workers are separate processes (use sqlite:PATH, redis://, postgres://, mysql:// or etcd://)",
      usage,
    );
  }
  if (o.url !== undefined) backendLoader(o.url); // a malformed URL is a usage error before anything is created
  if (!existsSync(WORKER_PATH)) throw new CliExit(EXIT.SOFTWARE, `demo worker not found at ${WORKER_PATH} (run npm run build)`);

  const dir = o.dir === undefined ? mkdtempSync(join(tmpdir(), 'leasehold-demo-')) : resolve(o.dir);
  if (o.dir !== undefined) {
    try {
      mkdirSync(dir, { recursive: true });
    } catch (error) {
      throw usageError(`cannot use --dir ${dir}: ${(error as Error).message}`, usage);
    }
  }
  const leaseUrl = o.url ?? `sqlite:${join(dir, 'locks.db')}`;
  const dataDb = join(dir, 'data.db');
  const workers = new Set<Worker>();
  const killAll = (): void => {
    for (const w of workers) w.kill();
  };
  const removeDir = (): void => {
    if (o.dir === undefined) rmSync(dir, { recursive: true, force: true });
  };
  const offSignals = onStopSignals((signal) => {
    killAll();
    removeDir();
    process.exit(signalExitCode(signal));
  });
  process.on('exit', killAll);

  let data: Database.Database | undefined;
  let coordinator: Locks | undefined;
  let dashboard: RunningDashboard | undefined;
  try {
    data = new Database(dataDb, { timeout: 5_000 });
    data.pragma('journal_mode = WAL');
    data.exec(SQL.createDocuments);
    coordinator = createLocks({ url: leaseUrl, holderName: `demo (pid ${process.pid})` });
    const mutant = process.env[DEMO_MUTANT_ENV] === 'unfenced-a';
    const ctx: Context = { o, out, leaseUrl, dataDb, data, coordinator, workers };

    print(out, [
      'leasehold demo: the zombie worker',
      `  Workers A and B are separate processes. Each recomputes document ${DEMO_DOC} while holding the lease ${DEMO_KEY} (ttl ${formatDuration(o.ttlMs)}).`,
      `  Worker A checks that its lease is valid, then is frozen with SIGSTOP for ${formatDuration(o.pauseMs)}, longer than the ttl,`,
      '  between that check and its write (a GC pause, a stalled VM). Meanwhile its lease expires and B takes over.',
      `  lease store: ${redact(leaseUrl)}`,
      `  data:        ${dataDb} (table documents, separate from the lease store)`,
      ...(mutant ? [`  ${DEMO_MUTANT_ENV}=unfenced-a: in run 2, worker A bypasses the fence (the verdict must catch this)`] : []),
    ]);

    if (o.dashboard) {
      dashboard = await startDashboard({
        locks: coordinator,
        host: o.dashboard.host,
        port: o.dashboard.port,
        title: 'leasehold demo — the zombie worker',
        pollMs: 100,
      });
      print(out, [
        `  dashboard: ${dashboard.url} (open it to watch the take-over; the demo starts when a page connects, or in ${formatDuration(o.dashboard.waitForViewerMs)})`,
      ]);
      await dashboard.viewer(o.dashboard.waitForViewerMs);
    }

    const unfenced = await scenario(ctx, {
      title: 'Run 1: without a fence (each worker saves with a plain UPDATE)',
      fenced: false,
      writes: { A: 'plain', B: 'plain' },
    });
    const fenced = await scenario(ctx, {
      title: `Run 2: with a fence (each worker saves with sqliteFence(db).write("${DEMO_DOC}", lease.token, ...))`,
      fenced: true,
      writes: { A: mutant ? 'plain' : 'fence', B: 'fence' },
    });

    print(
      out,
      fenced.expected
        ? [
            '',
            `Result: ${unfenced.expected ? 'without a fence the frozen worker overwrote the newer result; ' : ''}with the fence its stale token was refused and B's result kept.`,
            '  The lease told A that it was lost, but only once A ran again, too late to stop a write already past its check.',
            '  The lease cannot stop a late write, so the resource has to check the token; the fence does that check.',
          ]
        : ['', "Result: FAILED: the fenced run did not keep B's result (see its verdict above)."],
    );
    if (!fenced.expected) throw new CliExit(EXIT.FAILURE, `demo failed: ${fenced.why ?? "the fenced run did not keep B's result"}`);
    if (dashboard) {
      print(out, ['', `The dashboard is still at ${dashboard.url} with the timeline of both runs: Ctrl-C to stop.`]);
      offSignals();
      await new Promise<void>((resolve) => {
        const off = onStopSignals(() => {
          off();
          resolve();
        });
      });
    }
    return EXIT.OK;
  } finally {
    killAll();
    offSignals();
    process.off('exit', killAll);
    await dashboard?.close().catch(() => {});
    await coordinator?.close().catch(() => {});
    data?.close();
    removeDir();
  }
}

interface Context {
  o: DemoOptions;
  out: Writable;
  leaseUrl: string;
  dataDb: string;
  data: Database.Database;
  coordinator: Locks;
  workers: Set<Worker>;
}

/** One run of the scenario: a fresh document, two fresh workers, a timeline and a verdict. */
async function scenario(ctx: Context, run: Run): Promise<RunResult> {
  const { o, out, data } = ctx;
  data.prepare(SQL.seedDocument).run(DEMO_DOC, SEED_BODY);
  if (data.prepare(SQL.fenceTableExists).get()) data.prepare(SQL.forgetFenceMark).run(DEMO_DOC);

  print(out, ['', run.title]);
  const t0 = performance.now();
  const elapsed = (): number => performance.now() - t0;
  const line = (who: string, text: string): void => {
    out.write(`  +${String(Math.round(elapsed())).padStart(6)} ms  ${who.padEnd(5)}  ${text}\n`);
  };
  const tokens: Partial<Record<WorkerRole, string>> = {};
  const narrate = (role: WorkerRole, e: WorkerEvent): void => {
    const text = describeEvent(role, e, tokens);
    if (text) line(role, text);
  };

  const config = (role: WorkerRole): WorkerConfig => ({
    role,
    key: DEMO_KEY,
    ttlMs: o.ttlMs,
    waitMs: Math.min(o.ttlMs + o.pauseMs + 60_000, 2_147_483_647),
    leaseUrl: ctx.leaseUrl,
    dataDb: ctx.dataDb,
    docId: DEMO_DOC,
    write: run.writes[role],
  });
  const a = new Worker('A', config('A'), narrate);
  const b = new Worker('B', config('B'), narrate);
  ctx.workers.add(a).add(b);

  let aOutcome: Extract<WorkerEvent, { ev: 'saved' | 'refused' }>;
  let aLost: Extract<WorkerEvent, { ev: 'lost' }> | undefined;
  let frozenMs: number;
  try {
    const [ra, rb] = await Promise.all([a.expect(['ready'], STARTUP_TIMEOUT_MS, 'start'), b.expect(['ready'], STARTUP_TIMEOUT_MS, 'start')]);
    line('demo', `started worker A (pid ${ra.pid}) and worker B (pid ${rb.pid})`);

    a.send({ cmd: 'acquire' });
    // The coordinator may round the ttl up (etcd's minimum lease): the timeline shows the effective one.
    const { ttlMs } = await a.expect(['acquired'], STEP_TIMEOUT_MS, 'acquire the lease');
    b.send({ cmd: 'take-over' });
    const first = await b.expect(['busy', 'acquired'], STEP_TIMEOUT_MS, 'try the lease');
    if (first.ev === 'acquired') throw new CliExit(EXIT.FAILURE, `worker B got ${DEMO_KEY} while A should still hold it; try a longer --ttl`);

    a.send({ cmd: 'work' });
    const checked = await a.expect(['checked'], STEP_TIMEOUT_MS, 'check its lease before saving');
    if (checked.aborted)
      throw new CliExit(
        EXIT.FAILURE,
        `worker A lost its lease before the pause (the machine is too slow for --ttl ${formatDuration(o.ttlMs)}; try a longer one)`,
      );

    // The GC pause: A is blocked right after its check; freeze it there, then queue its go-ahead,
    // which it reads the moment it runs again.
    a.signal('SIGSTOP');
    await waitUntilStopped(a).catch((error: Error) => {
      throw new CliExit(EXIT.FAILURE, error.message);
    });
    const frozenAt = performance.now();
    line(
      'demo',
      `SIGSTOP A: frozen for ${formatDuration(o.pauseMs)} between its check and its write (ttl ${formatDuration(ttlMs)}${ttlMs === o.ttlMs ? '' : `, the coordinator's rounding of --ttl ${formatDuration(o.ttlMs)}`})`,
    );
    a.go();

    await b.expect(['saved', 'refused'], ttlMs + STEP_TIMEOUT_MS, 'take over the lease and save');
    const left = frozenAt + o.pauseMs - performance.now();
    if (left > 0) await sleep(left);
    else line('demo', `B finished saving after the pause would have ended; A was kept frozen until then`);

    const held = (await ctx.coordinator.inspect(DEMO_KEY)).find((s) => s.key === DEMO_KEY)?.holders ?? [];
    line(
      'coord',
      held.length > 0
        ? `the coordinator's view: ${DEMO_KEY} is held by ${held.map((h) => `${h.holder}, token ${h.token}`).join('; ')}`
        : `the coordinator's view: ${DEMO_KEY} is free`,
    );

    frozenMs = performance.now() - frozenAt;
    a.signal('SIGCONT');
    line('demo', `SIGCONT A after ${formatDuration(frozenMs)}: it carries on from where it was frozen`);

    aOutcome = await a.expect(['saved', 'refused'], STEP_TIMEOUT_MS, 'finish its write');
    aLost = await a.expect(['lost'], Math.max(2 * ttlMs, 2_000), 'notice that its lease is gone').catch(() => undefined);
    if (!aLost) line('A', `lease.signal still not aborted ${formatDuration(Math.max(2 * ttlMs, 2_000))} after SIGCONT: invariant I6 not observed`);

    a.send({ cmd: 'finish' });
    b.send({ cmd: 'finish' });
    await Promise.all([a.expect(['finished'], STEP_TIMEOUT_MS, 'exit'), b.expect(['finished'], STEP_TIMEOUT_MS, 'exit')]);
    await Promise.all([a.stop(STEP_TIMEOUT_MS), b.stop(STEP_TIMEOUT_MS)]);
  } finally {
    a.kill();
    b.kill();
    ctx.workers.delete(a);
    ctx.workers.delete(b);
  }

  // The verdict reads the data itself.
  const final = data.prepare(SQL.selectDocument).safeIntegers(true).get(DEMO_DOC) as { body: string; writtenBy: string; token: bigint };
  const finalToken = final.token.toString();
  const highest = run.fenced ? await sqliteFence(data as unknown as SqliteDatabase).highest(DEMO_DOC) : null;
  print(out, [
    `  final   ${DEMO_DOC} = "${final.body}" (written by ${final.writtenBy} under token ${finalToken})` +
      (highest === null ? '' : `; the fence's highest accepted token: ${highest}`),
  ]);

  const bKept = final.writtenBy === 'B' && finalToken === tokens.B;
  const aWon = final.writtenBy === 'A' && finalToken === tokens.A;
  const stillKnown = aLost ? ` A's lease.signal did abort (${aLost.reason}), but only once it ran again, after its write had already started.` : '';
  if (!run.fenced) {
    print(out, [
      aWon
        ? `  verdict: LOST UPDATE. A's stale result (token ${tokens.A}) silently replaced B's newer one (token ${tokens.B}); nothing refused it.${stillKnown}`
        : `  verdict: no overwrite this time: the document holds ${final.writtenBy}'s result (token ${finalToken}), not A's stale one`,
    ]);
    return aWon ? { expected: true } : { expected: false, why: `the unfenced run ended with ${final.writtenBy}'s result` };
  }
  if (bKept) {
    const refused = aOutcome.ev === 'refused' ? `The fence REFUSED A's stale token ${tokens.A} (${aOutcome.error})` : `A's write did not replace it`;
    print(out, [`  verdict: SAFE. ${refused}; B's result (token ${tokens.B}) stands.${stillKnown}`]);
    return { expected: true };
  }
  const why =
    `the fenced run should keep B's result (token ${tokens.B}), but the document holds ${final.writtenBy}'s (token ${finalToken}): ` +
    (aWon ? `A's stale write (token ${tokens.A}) was accepted instead of refused` : 'an unexpected writer');
  print(out, [`  verdict: FAILED. ${why[0]!.toUpperCase()}${why.slice(1)}.`]);
  return { expected: false, why };
}

/** One timeline line for a worker's report, or undefined for reports that add nothing. */
function describeEvent(role: WorkerRole, e: WorkerEvent, tokens: Partial<Record<WorkerRole, string>>): string | undefined {
  switch (e.ev) {
    case 'ready':
    case 'finished':
      return undefined;
    case 'busy':
      return `tryAcquire(${DEMO_KEY}) -> busy (held by ${e.holder}); waiting for the lease`;
    case 'acquired':
      tokens[role] = e.token;
      return role === 'A'
        ? `acquired ${DEMO_KEY}: token ${e.token}, ttl ${formatDuration(e.ttlMs)} (renewed in the background every ttl/3)`
        : `acquired ${DEMO_KEY}: token ${e.token}. A's lease expired at the coordinator while A was frozen`;
    case 'checked':
      return `read ${DEMO_DOC} ("${e.read.body}"), computed "${e.result}"; checked lease.signal.aborted = ${e.aborted}; about to save`;
    case 'saved': {
      const how = e.via === 'fence' ? `fence.write("${DEMO_DOC}", token ${e.token})` : `UPDATE ${DEMO_DOC} (no token check)`;
      const overwrite = BigInt(e.previous.token) > BigInt(e.token);
      const verdict = overwrite
        ? `OVERWRITE: replaced ${e.previous.writtenBy}'s newer result (token ${e.previous.token}) with a result computed under token ${e.token}`
        : 'ACCEPTED';
      const when = role === 'A' ? `; lease.signal.aborted was ${e.abortedAtWrite} at the write` : '';
      return `${how} = "${e.body}" -> ${verdict}${when}`;
    }
    case 'refused':
      return `fence.write("${DEMO_DOC}", token ${e.token}) -> REFUSED: ${e.error}: ${e.message}`;
    case 'lost':
      return role === 'A'
        ? `lease.signal aborted (${e.reason}): a frozen process learns of the loss as soon as it runs again (I6), here after its write`
        : `lease.signal aborted (${e.reason}): ${e.message}`;
    case 'failed':
      return `FAILED: ${e.message}`;
  }
}

/**
 * A demo worker process and its reports. `expect` waits for the next report of some kinds; a
 * worker that fails, exits or stays silent past the timeout makes it reject with a one-line reason.
 */
class Worker {
  readonly #process: ChildWorker<WorkerCommand, WorkerEvent>;
  readonly #inbox: WorkerEvent[] = [];

  constructor(
    readonly role: WorkerRole,
    config: WorkerConfig,
    onEvent: (role: WorkerRole, e: WorkerEvent) => void,
  ) {
    this.#process = new ChildWorker(WORKER_PATH, {
      name: `worker ${role}`,
      args: [JSON.stringify(config)],
      stdout: 'inherit',
      stderr: 'inherit',
      pipe: true,
      onMessage: (message) => {
        onEvent(role, message);
        this.#inbox.push(message);
      },
    });
  }

  get name(): string {
    return this.#process.name;
  }

  get pid(): number | undefined {
    return this.#process.pid;
  }

  send(command: WorkerCommand): void {
    this.#process.send(command);
  }

  /** Lets worker A, blocked after its check, go on to its write (it reads this once it runs). */
  go(): void {
    this.#process.write('g');
  }

  signal(signal: NodeJS.Signals): void {
    this.#process.signal(signal);
  }

  kill(): void {
    this.#process.kill();
  }

  /** Resolves once the process has exited; kills it if it has not within `timeoutMs`. */
  stop(timeoutMs: number): Promise<void> {
    return this.#process.stop(timeoutMs);
  }

  async expect<K extends WorkerEventName>(kinds: readonly K[], timeoutMs: number, what: string): Promise<Extract<WorkerEvent, { ev: K }>> {
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      const i = this.#inbox.findIndex((e) => (kinds as readonly string[]).includes(e.ev));
      if (i >= 0) return this.#inbox.splice(i, 1)[0] as Extract<WorkerEvent, { ev: K }>;
      const failed = this.#inbox.find((e): e is Extract<WorkerEvent, { ev: 'failed' }> => e.ev === 'failed');
      if (failed) throw new CliExit(EXIT.FAILURE, `${this.name} failed while trying to ${what}: ${failed.message}`);
      const exit = this.#process.exit;
      if (exit) {
        const how = exit.signal ? `was killed by ${exit.signal}` : `exited with code ${exit.code}`;
        throw new CliExit(EXIT.FAILURE, `${this.name} ${how} while trying to ${what}`);
      }
      const left = deadline - performance.now();
      if (left <= 0) throw new CliExit(EXIT.FAILURE, `${this.name} did not ${what} within ${formatDuration(timeoutMs)}`);
      await this.#process.changed(left);
    }
  }
}

function print(out: Writable, lines: readonly string[]): void {
  for (const l of lines) out.write(`${l}\n`);
}

/**
 * The zombie scenario (the README's core claim) with real processes on a mysql:// URL: worker
 * processes (test/fixtures/sql-counter-worker.mjs) take the lease on "counter" from the MySQL
 * backend and increment a counter in the same MariaDB through mysqlFence. One is SIGSTOPped past
 * its ttl while it holds the lease; another takes over and writes; the frozen one, resumed, tries
 * its late write, which the fence refuses (StaleTokenError). The control run writes with a plain
 * transaction instead of the fence and must show the anomaly the fence prevents: the zombie's write
 * committed after the newer holder's, and a lost increment. A last run adds crash restarts of the
 * server (SIGKILL): tokens granted after a restart exceed every token before it (I1).
 *
 * Runs on a MariaDB of its own (./server.ts). The workers import the built package: run
 * `npm run build` first (`npm test` does).
 */
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import mysql from 'mysql2/promise';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { checkCounterHistory, type Committed, type CounterHistory } from '../helpers/counter-checker.js';
import { eventually, uniqueName } from '../helpers/env.js';
import { startMariaDb, type MariaDb } from './server.js';

const FIXTURE = fileURLToPath(new URL('../fixtures/sql-counter-worker.mjs', import.meta.url));
const DIST = fileURLToPath(new URL('../../dist/mysql/index.js', import.meta.url));
const TTL_MS = 1_000;

interface WorkerEvent {
  w: number;
  at: number;
  ev: 'granted' | 'accepted' | 'refused' | 'failed' | 'paused' | 'resumed' | 'acquire-failed' | 'done';
  token?: string;
  id?: string;
  requestedAt?: number;
  highest?: string;
  name?: string;
  code?: string | null;
  message?: string;
}

class Worker {
  readonly events: WorkerEvent[] = [];
  readonly exited: Promise<number | null>;
  readonly stderr: string[] = [];

  constructor(readonly child: ChildProcessWithoutNullStreams) {
    createInterface({ input: child.stdout }).on('line', (line) => {
      try {
        this.events.push(JSON.parse(line) as WorkerEvent);
      } catch {
        this.stderr.push(`stdout: ${line}`);
      }
    });
    child.stderr.on('data', (chunk: Buffer) => this.stderr.push(chunk.toString()));
    this.exited = new Promise((resolve) => child.on('exit', (code) => resolve(code)));
  }

  send(command: 'pause' | 'stop'): void {
    if (this.child.exitCode === null && this.child.stdin.writable) this.child.stdin.write(`${command}\n`);
  }

  last(ev: WorkerEvent['ev']): WorkerEvent | undefined {
    return this.events.findLast((e) => e.ev === ev);
  }

  /** What became of the write with `token`: accepted, refused or failed (undefined while it is pending). */
  outcome(token: bigint): WorkerEvent | undefined {
    return this.events.find((e) => e.token === String(token) && (e.ev === 'accepted' || e.ev === 'refused' || e.ev === 'failed'));
  }
}

let server: MariaDb | undefined;
let admin: mysql.Pool | undefined;
const workers: Worker[] = [];

beforeAll(async () => {
  if (!existsSync(DIST)) throw new Error(`${DIST} is missing: run \`npm run build\` before this test (npm test does)`);
  server = await startMariaDb();
  admin = mysql.createPool({ uri: server.url, connectionLimit: 2 });
}, 120_000);

afterAll(async () => {
  for (const w of workers) {
    if (w.child.exitCode === null) {
      w.child.kill('SIGCONT');
      w.child.kill('SIGKILL');
    }
  }
  await Promise.allSettled(workers.map((w) => w.exited));
  await admin?.end().catch(() => {});
  await server?.destroy();
}, 120_000);

async function prepare(prefix: string): Promise<void> {
  await admin!.query(`CREATE TABLE ${prefix}_counter (id integer PRIMARY KEY, n integer NOT NULL) ENGINE=InnoDB`);
  await admin!.query(`INSERT INTO ${prefix}_counter VALUES (1, 0)`);
  // No unique key on id: a duplicate commit must be visible to the checker. seq is drawn inside
  // the writing transaction; under the fence that is after the mark's row lock: commit order.
  await admin!.query(
    `CREATE TABLE ${prefix}_increments (seq bigint AUTO_INCREMENT PRIMARY KEY, id varchar(64) NOT NULL, token bigint NOT NULL, worker integer NOT NULL) ENGINE=InnoDB`,
  );
}

function spawnWorkers(prefix: string, count: number, fence: 'real' | 'none'): Worker[] {
  const started = Array.from({ length: count }, (_, worker) => {
    const cfg = { url: server!.url, prefix, worker, ttlMs: TTL_MS, fence, holdMs: 5 };
    return new Worker(spawn(process.execPath, [FIXTURE, 'mysql', JSON.stringify(cfg)], { stdio: ['pipe', 'pipe', 'pipe'] }));
  });
  workers.push(...started);
  return started;
}

async function committed(prefix: string): Promise<Committed[]> {
  const [rows] = await admin!.query(`SELECT seq, id, CAST(token AS CHAR) AS token FROM ${prefix}_increments ORDER BY seq`);
  return (rows as { seq: number; id: string; token: string }[]).map((r) => ({ seq: Number(r.seq), id: r.id, token: BigInt(r.token) }));
}

/** Increments committed so far; -1 while the server is restarting. */
async function count(prefix: string): Promise<number> {
  try {
    const [rows] = await admin!.query(`SELECT count(*) AS n FROM ${prefix}_increments`);
    return Number((rows as { n: number }[])[0]!.n);
  } catch {
    return -1;
  }
}

const waitFor = async (what: string, condition: () => boolean | Promise<boolean>, timeoutMs = 60_000): Promise<void> => {
  if (!(await eventually(condition, timeoutMs, 25))) throw new Error(`timed out waiting for ${what}\n${lastWords()}`);
};

/** What the workers said last (events and stderr), for a run that stopped making progress. */
function lastWords(): string {
  return workers
    .filter((w) => w.child.exitCode === null)
    .map((w) => `worker pid ${w.child.pid}: ${JSON.stringify(w.events.slice(-4))} ${w.stderr.join('').slice(-300)}`)
    .join('\n');
}

/** Makes `w` a zombie: it stops itself at its next write; it is resumed once a newer token has been committed. */
async function zombie(prefix: string, w: Worker): Promise<bigint> {
  const pausedBefore = w.events.filter((e) => e.ev === 'paused').length;
  w.send('pause');
  await waitFor('the zombie to stop itself', () => w.events.filter((e) => e.ev === 'paused').length > pausedBefore);
  const token = BigInt(w.last('paused')!.token!);
  await waitFor('a newer holder to write', async () => (await committed(prefix).catch(() => [])).some((c) => c.token > token));
  w.child.kill('SIGCONT');
  return token;
}

async function history(prefix: string, all: Worker[], restarts: CounterHistory['restarts'] = []): Promise<CounterHistory> {
  const rows = await committed(prefix);
  const [counter] = await admin!.query(`SELECT n FROM ${prefix}_counter WHERE id = 1`);
  const events = all.flatMap((w) => w.events);
  const grants = events.filter((e) => e.ev === 'granted').map((e) => ({ worker: e.w, token: BigInt(e.token!), requestedAt: e.requestedAt!, grantedAt: e.at }));
  return {
    committed: rows,
    counter: Number((counter as { n: number }[])[0]!.n),
    acknowledged: events.filter((e) => e.ev === 'accepted').map((e) => ({ id: e.id!, token: BigInt(e.token!) })),
    granted: grants.map((g) => g.token),
    grants,
    restarts,
    oneWritePerGrant: true,
  };
}

async function stopAll(all: Worker[]): Promise<void> {
  for (const w of all) w.send('stop');
  const codes = await Promise.race([Promise.all(all.map((w) => w.exited)), new Promise<null>((resolve) => setTimeout(() => resolve(null), 60_000).unref())]);
  if (codes === null || codes.some((c) => c !== 0)) {
    throw new Error(`workers did not stop cleanly: ${JSON.stringify(codes)}\n${all.map((w) => w.stderr.join('')).join('\n')}`);
  }
}

describe('mysql zombie: worker processes on a mysql:// URL, SIGSTOP past the ttl', () => {
  it('with mysqlFence: the other worker takes over and writes; the zombie’s late write is refused (StaleTokenError); nothing older is committed after something newer', async () => {
    const prefix = uniqueName('zf');
    await prepare(prefix);
    const all = spawnWorkers(prefix, 2, 'real');
    await waitFor('5 increments', async () => (await count(prefix)) >= 5);
    const zombieToken = await zombie(prefix, all[0]!);
    await waitFor('the zombie to try its write', () => all[0]!.outcome(zombieToken) !== undefined);
    const outcome = all[0]!.outcome(zombieToken)!;
    expect(outcome.ev, JSON.stringify(outcome)).toBe('refused');
    expect(outcome.name).toBe('StaleTokenError');
    expect(BigInt(outcome.highest!)).toBeGreaterThan(zombieToken);
    // The other worker held a newer token and wrote while the zombie was frozen.
    const rowsThen = await committed(prefix);
    expect(rowsThen.some((c) => c.token > zombieToken && c.id.startsWith('1-'))).toBe(true);
    const after = await count(prefix);
    await waitFor('a few more increments', async () => (await count(prefix)) >= after + 5);
    await stopAll(all);

    const h = await history(prefix, all);
    expect(checkCounterHistory(h)).toEqual([]);
    expect(h.committed.some((c) => c.token === zombieToken)).toBe(false);
    for (const w of all) expect(w.last('done')).toBeDefined();
  }, 180_000);

  it('control without the fence (a plain transaction): the zombie’s write lands after the newer holder’s, and the checker catches it', async () => {
    const prefix = uniqueName('zn');
    await prepare(prefix);
    const all = spawnWorkers(prefix, 2, 'none');
    await waitFor('5 increments', async () => (await count(prefix)) >= 5);
    const zombieToken = await zombie(prefix, all[0]!);
    await waitFor('the zombie to write', () => all[0]!.outcome(zombieToken) !== undefined);
    expect(all[0]!.outcome(zombieToken)!.ev).toBe('accepted');
    const after = await count(prefix);
    await waitFor('a few more increments', async () => (await count(prefix)) >= after + 3);
    await stopAll(all);

    const h = await history(prefix, all);
    const zombieRow = h.committed.find((c) => c.token === zombieToken)!;
    expect(zombieRow).toBeDefined();
    // The anomaly itself: a newer holder's write committed before the zombie's older one.
    expect(h.committed.some((c) => c.seq < zombieRow.seq && c.token > zombieToken)).toBe(true);
    const violations = checkCounterHistory(h);
    expect(violations.some((v) => v.startsWith('token decreased'))).toBe(true);
    expect(violations.some((v) => v.startsWith('counter is'))).toBe(true); // the zombie's stale read lost an increment
  }, 180_000);

  it('with mysqlFence through crash restarts of the server (SIGKILL) and a zombie: no token regression (I1), no lost increment, the zombie refused', async () => {
    const prefix = uniqueName('zr');
    await prepare(prefix);
    const all = spawnWorkers(prefix, 4, 'real');
    const restarts: { startedAt: number; endedAt: number }[] = [];

    await waitFor('15 increments', async () => (await count(prefix)) >= 15);
    const zombieToken = await zombie(prefix, all[0]!);
    await waitFor('the zombie to try its write', () => all[0]!.outcome(zombieToken) !== undefined);
    expect(all[0]!.outcome(zombieToken)!.ev).toBe('refused');

    for (const mode of ['crash', 'crash', 'clean'] as const) {
      const before = await count(prefix);
      await waitFor('progress before the restart', async () => (await count(prefix)) >= before + 10);
      const startedAt = Date.now();
      await server!.restart(mode);
      restarts.push({ startedAt, endedAt: Date.now() });
      expect(await eventually(async () => (await count(prefix)) >= 0, 30_000, 100)).toBe(true);
      const resumedAt = await count(prefix);
      await waitFor(`progress after the ${mode} restart`, async () => (await count(prefix)) >= resumedAt + 10);
    }

    await stopAll(all);
    const h = await history(prefix, all, restarts);
    expect(checkCounterHistory(h)).toEqual([]);
    expect(h.committed.length).toBeGreaterThanOrEqual(50);
    for (const r of restarts) expect(h.grants!.some((g) => g.requestedAt > r.endedAt)).toBe(true);
    for (const w of all) expect(w.last('done')).toBeDefined();
  }, 300_000);
});

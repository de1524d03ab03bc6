/**
 * Failover with real servers: worker processes increment a counter in PostgreSQL through the
 * PostgreSQL fence, with the same PostgreSQL as the coordinator, while the server is restarted
 * (fast, then immediate = crash recovery) and one worker turns zombie (SIGSTOP past its ttl, then
 * writes). The checker (./checker.ts) must find nothing; the same run with a fence that ignores
 * tokens must be caught.
 *
 * Runs on a cluster of its own (./cluster.ts): the shared server is never restarted. The workers
 * import the built package: run `npm run build` first (`npm test` does).
 */
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { eventually } from '../helpers/env.js';
import { check, type History } from './checker.js';
import { startCluster, type Cluster } from './cluster.js';

const FIXTURE = fileURLToPath(new URL('../fixtures/sql-counter-worker.mjs', import.meta.url));
const DIST = fileURLToPath(new URL('../../dist/postgres/index.js', import.meta.url));
const TTL_MS = 1_000;

interface WorkerEvent {
  w: number;
  at: number;
  ev: 'granted' | 'accepted' | 'refused' | 'failed' | 'paused' | 'resumed' | 'acquire-failed' | 'done';
  token?: string;
  id?: string;
  requestedAt?: number;
  highest?: string;
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
}

let cluster: Cluster | undefined;
let admin: pg.Pool | undefined;
const workers: Worker[] = [];

beforeAll(async () => {
  if (!existsSync(DIST)) throw new Error(`${DIST} is missing: run \`npm run build\` before this test (npm test does)`);
  cluster = await startCluster();
  admin = new pg.Pool({ connectionString: cluster.url, max: 2 });
  admin.on('error', () => {});
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
  await cluster?.destroy();
}, 120_000);

async function prepare(schema: string): Promise<void> {
  await admin!.query(`CREATE SCHEMA ${schema}`);
  await admin!.query(`CREATE TABLE ${schema}.counter (id integer PRIMARY KEY, n integer NOT NULL)`);
  await admin!.query(`INSERT INTO ${schema}.counter VALUES (1, 0)`);
  // no unique constraint on id: a duplicate commit must be visible to the checker
  await admin!.query(
    `CREATE TABLE ${schema}.increments (seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, id text NOT NULL, token bigint NOT NULL, worker integer NOT NULL)`,
  );
}

function spawnWorkers(schema: string, count: number, fence: 'real' | 'none'): Worker[] {
  const started = Array.from({ length: count }, (_, worker) => {
    const cfg = { url: cluster!.url, schema, worker, ttlMs: TTL_MS, fence, holdMs: 5 };
    return new Worker(spawn(process.execPath, [FIXTURE, 'postgres', JSON.stringify(cfg)], { stdio: ['pipe', 'pipe', 'pipe'] }));
  });
  workers.push(...started);
  return started;
}

/** Rows committed so far (retried: the server may be restarting). */
async function committed(schema: string): Promise<{ seq: number; id: string; token: bigint }[]> {
  const { rows } = await admin!.query(`SELECT seq::int AS seq, id, token::text AS token FROM ${schema}.increments ORDER BY seq`);
  return rows.map((r) => ({ seq: r.seq as number, id: r.id as string, token: BigInt(r.token as string) }));
}

async function count(schema: string): Promise<number> {
  try {
    const { rows } = await admin!.query(`SELECT count(*)::int AS n FROM ${schema}.increments`);
    return rows[0]!.n as number;
  } catch {
    return -1;
  }
}

const waitFor = async (what: string, condition: () => boolean | Promise<boolean>, timeoutMs = 60_000): Promise<void> => {
  if (!(await eventually(condition, timeoutMs, 25))) throw new Error(`timed out waiting for ${what}`);
};

/** Makes worker 0 a zombie: it stops itself at its next write; it is resumed once a newer token has been committed. */
async function zombie(schema: string, w: Worker): Promise<bigint> {
  const pausedBefore = w.events.filter((e) => e.ev === 'paused').length;
  w.send('pause');
  await waitFor('the zombie to stop itself', () => w.events.filter((e) => e.ev === 'paused').length > pausedBefore);
  const token = BigInt(w.last('paused')!.token!);
  await waitFor('a newer holder to write', async () => (await committed(schema).catch(() => [])).some((c) => c.token > token));
  w.child.kill('SIGCONT');
  return token;
}

async function history(schema: string, all: Worker[], restarts: History['restarts']): Promise<History> {
  const rows = await committed(schema);
  const { rows: counter } = await admin!.query(`SELECT n FROM ${schema}.counter WHERE id = 1`);
  const events = all.flatMap((w) => w.events);
  return {
    committed: rows,
    counter: counter[0]!.n as number,
    acknowledged: events.filter((e) => e.ev === 'accepted').map((e) => ({ id: e.id!, token: BigInt(e.token!) })),
    grants: events.filter((e) => e.ev === 'granted').map((e) => ({ worker: e.w, token: BigInt(e.token!), requestedAt: e.requestedAt!, grantedAt: e.at })),
    restarts,
  };
}

async function stopAll(all: Worker[]): Promise<void> {
  for (const w of all) w.send('stop');
  const codes = await Promise.race([Promise.all(all.map((w) => w.exited)), new Promise<null>((resolve) => setTimeout(() => resolve(null), 60_000).unref())]);
  if (codes === null || codes.some((c) => c !== 0)) {
    throw new Error(`workers did not stop cleanly: ${JSON.stringify(codes)}\n${all.map((w) => w.stderr.join('')).join('\n')}`);
  }
}

describe('postgres failover: restarts and a zombie, PostgreSQL as coordinator and fence', () => {
  it('no token regression, no lost increment, the zombie is refused', async () => {
    const schema = 'counter_run';
    await prepare(schema);
    const all = spawnWorkers(schema, 4, 'real');
    const restarts: { startedAt: number; endedAt: number }[] = [];

    await waitFor('20 increments', async () => (await count(schema)) >= 20);
    const zombieToken = await zombie(schema, all[0]!);
    await waitFor('the zombie to try its write', () =>
      all[0]!.events.some((e) => (e.ev === 'refused' || e.ev === 'accepted' || e.ev === 'failed') && e.token === String(zombieToken)),
    );
    const outcome = all[0]!.events.find((e) => e.token === String(zombieToken) && e.ev !== 'granted' && e.ev !== 'paused' && e.ev !== 'resumed');
    expect(outcome?.ev).toBe('refused');

    for (const mode of ['fast', 'immediate'] as const) {
      const before = await count(schema);
      await waitFor('progress before the restart', async () => (await count(schema)) >= before + 15);
      const startedAt = Date.now();
      await cluster!.restart(mode);
      restarts.push({ startedAt, endedAt: Date.now() });
      const afterRestart = await eventually(async () => (await count(schema)) >= 0, 30_000, 100);
      expect(afterRestart).toBe(true);
      const resumedAt = await count(schema);
      await waitFor(`progress after the ${mode} restart`, async () => (await count(schema)) >= resumedAt + 15);
    }

    await stopAll(all);
    const h = await history(schema, all, restarts);
    expect(check(h)).toEqual([]);
    // the run exercised what it claims to
    expect(h.committed.length).toBeGreaterThanOrEqual(70);
    expect(new Set(h.committed.map((c) => c.id.split('-')[0])).size).toBe(4);
    for (const r of restarts) expect(h.grants.some((g) => g.requestedAt > r.endedAt)).toBe(true);
    // no client-side failure ended a worker: every worker is done
    for (const w of all) expect(w.last('done')).toBeDefined();
  }, 240_000);

  it('the checker catches a fence that ignores tokens (mutant)', async () => {
    const schema = 'mutant_run';
    await prepare(schema);
    const all = spawnWorkers(schema, 3, 'none');
    await waitFor('10 increments', async () => (await count(schema)) >= 10);
    const zombieToken = await zombie(schema, all[0]!);
    await waitFor('the zombie to write', () => all[0]!.events.some((e) => e.ev === 'accepted' && e.token === String(zombieToken)));
    const after = await count(schema);
    await waitFor('a few more increments', async () => (await count(schema)) >= after + 5);
    await stopAll(all);
    const violations = check(await history(schema, all, []));
    expect(violations.some((v) => v.startsWith('token decreased'))).toBe(true);
    expect(violations.some((v) => v.startsWith('counter is'))).toBe(true);
  }, 240_000);
});

/**
 * Several real processes share one SQLite lock file (all starting at once on a fresh file, so the
 * tables are created concurrently) and increment a counter through the SQLite fence. The lease
 * serialises those writers, so a second run races processes through the fence with no lease at
 * all: there the fence alone keeps I3, and a control fence that ignores tokens must be caught.
 */
import { execFile, spawn } from 'node:child_process';
import { join } from 'node:path';
import { promisify } from 'node:util';
import Database from 'better-sqlite3';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { checkCounterHistory } from '../helpers/counter-checker.js';
import { tempDir } from '../helpers/env.js';

const run = promisify(execFile);
const worker = new URL('../fixtures/sqlite-counter-worker.mjs', import.meta.url).pathname;

describe('processes contending on SQLite', () => {
  const dir = tempDir();
  const lockPath = join(dir.path, 'locks.db');
  const dataPath = join(dir.path, 'data.db');

  beforeAll(() => {
    const db = new Database(dataPath);
    db.pragma('journal_mode = WAL');
    db.exec('CREATE TABLE counter (id INTEGER PRIMARY KEY, n INTEGER NOT NULL); INSERT INTO counter VALUES (1, 0);');
    db.exec('CREATE TABLE log (seq INTEGER PRIMARY KEY AUTOINCREMENT, token INTEGER NOT NULL, worker INTEGER NOT NULL);');
    db.close();
  });
  afterAll(() => dir.cleanup());

  const spawnWorkers = (count: number, iterations: number) =>
    Promise.all(
      Array.from({ length: count }, (_, i) => run(process.execPath, [worker, lockPath, dataPath, String(iterations), String(i)], { timeout: 120_000 })),
    );

  it('nothing is lost and accepted tokens never decrease', async () => {
    const results = await spawnWorkers(4, 25);
    const perWorker = results.map((r) => JSON.parse(r.stdout.trim()) as { id: number; tokens: string[] });
    expect(perWorker.map((w) => w.tokens.length)).toEqual([25, 25, 25, 25]);
    const db = new Database(dataPath, { readonly: true });
    const { n } = db.prepare('SELECT n FROM counter WHERE id = 1').get() as { n: number };
    const log = (db.prepare('SELECT token, worker FROM log ORDER BY seq').all() as { token: number; worker: number }[]).map((r) => r.token);
    db.close();
    expect(n).toBe(100);
    expect(log).toHaveLength(100);
    for (let i = 1; i < log.length; i++) expect(log[i]!).toBeGreaterThan(log[i - 1]!);
    expect(new Set(perWorker.flatMap((w) => w.tokens)).size).toBe(100); // I2 across processes
  });

  it('I1 across process restarts: a later process gets higher tokens from the same file', async () => {
    const before = (await spawnWorkers(1, 1))[0]!;
    const after = (await spawnWorkers(1, 1))[0]!;
    const t1 = BigInt((JSON.parse(before.stdout) as { tokens: string[] }).tokens[0]!);
    const t2 = BigInt((JSON.parse(after.stdout) as { tokens: string[] }).tokens[0]!);
    expect(t1).toBeGreaterThan(100n);
    expect(t2).toBeGreaterThan(t1);
  });
});

interface RacedWrite {
  writeId: string;
  resource: string;
  token: string;
  accepted: boolean;
  highest?: string;
}

/**
 * The check of a fence run without a lease, per resource: accepted tokens never decrease in commit
 * order, nothing is lost (checkCounterHistory), a refused write left no trace, the data holds
 * exactly the accepted writes, a refusal names a higher accepted token, and the final mark is the
 * highest accepted token.
 */
function checkRace(writes: RacedWrite[], dataPath: string, fenced: boolean): string[] {
  const db = new Database(dataPath, { readonly: true });
  try {
    // The real fence keeps its marks in leasehold_fences (its storage layout, read on purpose); the control keeps none.
    const hasMarks = db.prepare("SELECT 1 FROM sqlite_master WHERE name = 'leasehold_fences'").get() !== undefined;
    if (fenced && !hasMarks) return ['the fence left no leasehold_fences table to read its marks from'];
    const violations: string[] = [];
    for (const resource of new Set(writes.map((w) => w.resource))) {
      const mine = writes.filter((w) => w.resource === resource);
      const accepted = mine.filter((w) => w.accepted);
      const log = db.prepare('SELECT seq, write_id AS id, token FROM log WHERE resource = ? ORDER BY seq').safeIntegers(true).all(resource) as {
        seq: bigint;
        id: string;
        token: bigint;
      }[];
      const counter = (db.prepare('SELECT n FROM counters WHERE resource = ?').get(resource) as { n: number } | undefined)?.n ?? 0;
      violations.push(
        ...checkCounterHistory({
          committed: log.map((r) => ({ seq: Number(r.seq), id: r.id, token: r.token })),
          counter,
          acknowledged: accepted.map((w) => ({ id: w.writeId, token: BigInt(w.token) })),
          granted: mine.map((w) => BigInt(w.token)),
          oneWritePerGrant: true,
        }).map((v) => `${resource}: ${v}`),
      );
      const logged = new Set(log.map((r) => r.id));
      const acceptedIds = new Set(accepted.map((w) => w.writeId));
      const acceptedTokens = new Set(accepted.map((w) => w.token));
      for (const w of mine) {
        if (!w.accepted && logged.has(w.writeId)) violations.push(`${resource}: refused write ${w.writeId} (token ${w.token}) changed the data`);
        if (!w.accepted && !(BigInt(w.highest!) > BigInt(w.token) && acceptedTokens.has(w.highest!))) {
          violations.push(`${resource}: write ${w.writeId} (token ${w.token}) refused in favour of ${w.highest}, which is not a higher accepted token`);
        }
      }
      for (const id of logged) if (!acceptedIds.has(id)) violations.push(`${resource}: the data holds write ${id}, which no one was told was accepted`);
      if (hasMarks) {
        const mark = (db.prepare('SELECT token FROM leasehold_fences WHERE resource = ?').safeIntegers(true).get(resource) as { token: bigint } | undefined)
          ?.token;
        const max = accepted.reduce((m, w) => (BigInt(w.token) > m ? BigInt(w.token) : m), 0n);
        if ((mark ?? 0n) !== max) violations.push(`${resource}: the mark is ${mark} but the highest accepted token is ${max}`);
      }
    }
    return violations;
  } finally {
    db.close();
  }
}

describe('processes racing through the SQLite fence without a lease', () => {
  const dir = tempDir();
  afterAll(() => dir.cleanup());
  const racer = new URL('../fixtures/sqlite-fence-racer.mjs', import.meta.url).pathname;
  const WORKERS = 4;
  const PER_RESOURCE = 12;
  const RESOURCES = ['doc:a', 'doc:b'];

  const shuffle = <T>(xs: T[]): T[] => {
    for (let i = xs.length - 1; i > 0; i--) {
      const j = Math.floor(Math.random() * (i + 1));
      [xs[i], xs[j]] = [xs[j]!, xs[i]!];
    }
    return xs;
  };

  /**
   * Deals the tokens 1..WORKERS·PER_RESOURCE of each resource to the workers at random. Even
   * workers write theirs in ascending order (like a holder with successive grants), odd workers
   * in shuffled order (a zombie's late writes), resources interleaved.
   */
  const plans = (): { resource: string; token: string }[][] => {
    const plan: { resource: string; token: string }[][] = Array.from({ length: WORKERS }, () => []);
    for (const resource of RESOURCES) {
      const tokens = shuffle(Array.from({ length: WORKERS * PER_RESOURCE }, (_, i) => i + 1));
      for (const [i, t] of tokens.entries()) plan[i % WORKERS]!.push({ resource, token: String(t) });
    }
    return plan.map((p, w) => (w % 2 === 0 ? shuffle(p).sort((a, b) => Number(a.token) - Number(b.token)) : shuffle(p)));
  };

  /** Starts every worker, lets them all go at once, and returns every write they report. */
  const race = async (kind: 'fence' | 'control'): Promise<{ writes: RacedWrite[]; dataPath: string }> => {
    const dataPath = join(dir.path, `${kind}.db`);
    const db = new Database(dataPath);
    db.pragma('journal_mode = WAL');
    db.exec(`CREATE TABLE counters (resource TEXT PRIMARY KEY, n INTEGER NOT NULL);
             CREATE TABLE log (seq INTEGER PRIMARY KEY AUTOINCREMENT, resource TEXT NOT NULL, write_id TEXT NOT NULL, token INTEGER NOT NULL);`);
    db.close();
    const children = plans().map((plan, id) =>
      spawn(process.execPath, [racer, dataPath, String(id), JSON.stringify(plan), kind], { stdio: ['pipe', 'pipe', 'inherit'] }),
    );
    const outputs = children.map((child) => {
      let out = '';
      let onReady!: () => void;
      const ready = new Promise<void>((r) => (onReady = r));
      child.stdout.on('data', (chunk: Buffer) => {
        out += chunk.toString();
        if (out.startsWith('ready\n')) onReady();
      });
      const exited = new Promise<string>((resolve, reject) => {
        child.on('error', reject);
        child.on('exit', (code) => (code === 0 ? resolve(out) : reject(new Error(`racer exited with ${code}: ${out}`))));
      });
      return { ready, exited };
    });
    await Promise.all(outputs.map((o) => o.ready));
    for (const child of children) child.stdin.end('go\n');
    const results = await Promise.all(outputs.map((o) => o.exited));
    const writes = results.flatMap((out) => (JSON.parse(out.trim().split('\n').at(-1)!) as { writes: RacedWrite[] }).writes);
    return { writes, dataPath };
  };

  it('I3 across processes: accepted tokens never decrease, refused writes change nothing, the data is the accepted writes; storage layout: the mark in leasehold_fences is the highest accepted token', async () => {
    const { writes, dataPath } = await race('fence');
    expect(writes).toHaveLength(WORKERS * PER_RESOURCE * RESOURCES.length);
    expect(checkRace(writes, dataPath, true)).toEqual([]);
    for (const resource of RESOURCES) {
      expect(writes.some((w) => w.resource === resource && w.accepted)).toBe(true);
      expect(writes.some((w) => w.resource === resource && !w.accepted)).toBe(true); // the shuffled workers' stale writes
    }
  });

  it('control: the same race through a fence that ignores tokens fails the check', async () => {
    const { writes, dataPath } = await race('control');
    expect(writes.every((w) => w.accepted)).toBe(true);
    const violations = checkRace(writes, dataPath, false);
    expect(
      violations.some((v) => v.includes('token decreased')),
      violations.join('\n'),
    ).toBe(true);
  });
});

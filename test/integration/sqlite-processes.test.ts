/**
 * Several real processes share one SQLite lock file (all starting at once on a fresh file, so the
 * tables are created concurrently) and increment a counter through the SQLite fence.
 */
import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { promisify } from 'node:util';
import Database from 'better-sqlite3';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
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
    Promise.all(Array.from({ length: count }, (_, i) => run(process.execPath, [worker, lockPath, dataPath, String(iterations), String(i)], { timeout: 120_000 })));

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

/**
 * Failover with real processes: a three-member etcd cluster on loopback, four worker processes
 * that increment a counter in PostgreSQL through the PostgreSQL fence (reading it inside the
 * fence's transaction), and the etcd leader killed with SIGKILL mid-run, then restarted on its
 * data directory. The checker then judges the whole history: accepted tokens never decrease in
 * commit order, the counter equals the committed increments, every acknowledged write is there,
 * no token was granted twice, and work went on while two members held quorum.
 *
 * Needs dist/ (`npm run build`; `npm test` builds first) and PostgreSQL at LEASEHOLD_TEST_PG_URL
 * (a schema of its own, dropped afterwards).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startCluster, type Cluster } from '../fixtures/etcd-cluster.mjs';
import { eventually, PG_URL, sleep, uniqueName } from '../helpers/env.js';
import { check, type Committed } from './checker.js';

const WORKER = fileURLToPath(new URL('../fixtures/etcd-counter-worker.mjs', import.meta.url));
const DIST = fileURLToPath(new URL('../../dist/etcd/index.js', import.meta.url));
const WORKERS = 4;

interface Event {
  w: number;
  at: number;
  ev: string;
  id?: string;
  token?: string;
  code?: string | null;
  message?: string;
  reason?: string;
}

describe('etcd failover: leader killed under four fenced workers', () => {
  let cluster: Cluster | undefined;
  let pool: pg.Pool | undefined;
  const schema = uniqueName('lh_etcd');
  const workers: ChildProcess[] = [];
  const events: Event[] = [];
  const exited: Promise<void>[] = [];

  const count = async (): Promise<number> => Number((await pool!.query(`SELECT count(*) AS c FROM "${schema}".increments`)).rows[0].c);

  beforeAll(async () => {
    if (!existsSync(DIST)) throw new Error(`${DIST} is missing: run \`npm run build\` first (npm test does)`);
    pool = new pg.Pool({ connectionString: PG_URL, max: 2 });
    await pool.query(`CREATE SCHEMA "${schema}"`);
    await pool.query(`CREATE TABLE "${schema}".counter (id int PRIMARY KEY, n bigint NOT NULL)`);
    await pool.query(`INSERT INTO "${schema}".counter VALUES (1, 0)`);
    await pool.query(`CREATE TABLE "${schema}".increments (seq bigserial PRIMARY KEY, id text NOT NULL, token bigint NOT NULL, worker int NOT NULL)`);
    // etcd's default timings (100 ms heartbeat, 1 s election timeout): a realistic election after the kill.
    cluster = await startCluster({ members: 3 });
  });

  afterAll(async () => {
    for (const child of workers) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    await Promise.race([Promise.allSettled(exited), sleep(5_000)]);
    await cluster?.stop();
    await pool?.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`).catch(() => {});
    await pool?.end();
  });

  it('keeps the counter exact and the tokens ordered while the leader is down and after it returns', async () => {
    const c = cluster!;
    for (let w = 0; w < WORKERS; w++) {
      const cfg = { hosts: c.endpoints, pgUrl: PG_URL, schema, worker: w, ttlMs: 3_000, requestTimeoutMs: 1_000 };
      const child = spawn(process.execPath, [WORKER, JSON.stringify(cfg)], { stdio: ['pipe', 'pipe', 'pipe'] });
      workers.push(child);
      exited.push(new Promise((resolve) => child.once('exit', () => resolve())));
      createInterface({ input: child.stdout! }).on('line', (line) => {
        try {
          events.push(JSON.parse(line) as Event);
        } catch {
          // not an event line
        }
      });
      let stderr = '';
      child.stderr!.on('data', (d: Buffer) => (stderr = (stderr + d.toString()).slice(-4000)));
      child.once('exit', (code) => {
        if (code !== 0) events.push({ w, at: Date.now(), ev: 'crashed', message: `exit ${code}: ${stderr}` });
      });
    }

    // warm-up: every worker gets work done
    expect(await eventually(async () => (await count()) >= 40, 30_000, 100)).toBe(true);

    const leader = await c.leader();
    const beforeKill = await count();
    await leader.kill('SIGKILL');
    const killedAt = Date.now();

    // work goes on with two members out of three (a quorum), before the old leader returns; the
    // outage lasts at least 3 s (an election, then steady work on two members)
    const progressed = await eventually(async () => (await count()) >= beforeKill + 40 && Date.now() - killedAt >= 3_000, 30_000, 100);
    const duringOutage = (await count()) - beforeKill;
    expect(leader.running).toBe(false);
    expect(progressed, `only ${duringOutage} increments while ${leader.name} was down`).toBe(true);
    const newLeader = await c.leader();
    expect(newLeader).not.toBe(leader);

    // the old leader comes back on its data directory and rejoins as a follower
    leader.start();
    await c.waitHealthy();
    const afterRestart = await count();
    expect(await eventually(async () => (await count()) >= afterRestart + 40, 30_000, 100)).toBe(true);

    for (const child of workers) child.stdin!.write('stop\n');
    const stopped = await Promise.race([Promise.all(exited).then(() => true), sleep(30_000).then(() => false)]);
    expect(stopped).toBe(true);

    // the checker
    const rows = (await pool!.query(`SELECT seq, id, token FROM "${schema}".increments ORDER BY seq`)).rows as { seq: string; id: string; token: string }[];
    const committed: Committed[] = rows.map((r) => ({ seq: Number(r.seq), id: r.id, token: BigInt(r.token) }));
    const counter = Number((await pool!.query(`SELECT n FROM "${schema}".counter WHERE id = 1`)).rows[0].n);
    const acknowledged = events.filter((e) => e.ev === 'committed').map((e) => ({ id: e.id!, token: BigInt(e.token!) }));
    const granted = events.filter((e) => e.ev === 'granted').map((e) => BigInt(e.token!));
    const violations = check({ committed, counter, acknowledged, granted });
    expect(violations).toEqual([]);
    expect(events.filter((e) => e.ev === 'crashed')).toEqual([]);
    expect(counter).toBe(committed.length);
    // every worker did some of the work
    expect(new Set(acknowledged.map((a) => a.id.split('-')[0])).size).toBe(WORKERS);

    const summary = {
      committed: committed.length,
      beforeKill,
      duringOutage,
      firstCommitAfterKillMs: Math.min(...events.filter((e) => e.ev === 'committed' && e.at > killedAt).map((e) => e.at)) - killedAt,
      refused: events.filter((e) => e.ev === 'refused').length,
      lost: events.filter((e) => e.ev === 'lost').length,
      acquireFailed: events.filter((e) => e.ev === 'acquire-failed').length,
      writeFailed: events.filter((e) => e.ev === 'write-failed').length,
    };
    console.log(`etcd failover: ${JSON.stringify(summary)}`);
  });
});

// `leasehold verify` against PostgreSQL: the shared test server as a user's own deployment (the
// resource's rows are keyed by the run id and deleted at the end), and local:postgres, a cluster
// verify makes with initdb and crashes with an immediate stop; the resource shares that cluster.
import { chmodSync } from 'node:fs';
import { join } from 'node:path';
import pg from 'pg';
import { afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { killAll, requireBuild, sandbox, type Sandbox } from '../cli/helpers.js';
import { PG_URL } from '../helpers/env.js';
import { NEMESES, planSchedule } from '../../src/verify/schedule.js';
import { expectPass, faultCount, faultEffects, forcedEffects, i6Summary, killLeftovers, readReport, verify, type VerifyRun } from './helpers.js';

/** Its schedule forces a delayed write's refusal and a frozen holder's late signal (asserted below). */
const LOCAL_SEED = 764;
let sb: Sandbox;
const runs: VerifyRun[] = [];

beforeAll(requireBuild);
beforeEach(() => {
  sb = sandbox();
  // local:postgres runs the server as the postgres OS user (when the tests run as root): it must reach TMPDIR.
  chmodSync(sb.dir, 0o711);
});
afterEach(() => {
  killAll();
  for (const r of runs.splice(0)) killLeftovers(r.marker, sb.dir);
  sb.cleanup();
});

describe('leasehold verify on PostgreSQL', () => {
  it('--limit 2 on your own PostgreSQL: permits of a semaphore of 2, at most 2 valid at once under pause, delay and clock', async () => {
    const r = await verify(['--url', PG_URL, '--limit', '2', '--duration', '5s', '--ttl', '500ms', '--seed', '7', '--nemesis', 'pause,delay,clock'], sb);
    runs.push(r);
    const context = `stdout:\n${r.stdout}\nstderr:\n${r.stderr}`;
    expect(r.code, context).toBe(0);
    expect(r.verdicts, context).toEqual({ grants: 'PASS', permits: 'PASS', fence: 'PASS', 'no lost update': 'PASS', I6: 'PASS' });
    expect(r.stdout).toMatch(/^ {2}lease {8}permits of a semaphore of 2 \(acquire with limit 2\)$/m);
    expect(faultCount(r, 'delay')).toBeGreaterThanOrEqual(1);
  }, 120_000);

  it('your own PostgreSQL (the shared server): passes with pause, delay and clock, and deletes what it wrote (storage layout: its tables are looked for)', async () => {
    const r = await verify(['--url', PG_URL, '--duration', '5s', '--ttl', '400ms', '--seed', '5', '--nemesis', 'pause,delay,clock'], sb);
    runs.push(r);
    expectPass(r, sb);
    expect(r.stdout).toMatch(/writes through the fence \(postgresFence\)/);
    expect(faultCount(r, 'pause')).toBeGreaterThanOrEqual(1);
    expect(faultCount(r, 'delay')).toBeGreaterThanOrEqual(1);
    const id = /run ([0-9a-f]{8}),/.exec(r.stdout)![1]!;
    const client = new pg.Client({ connectionString: PG_URL });
    await client.connect();
    try {
      const like = `leasehold-verify/${id}/%`;
      for (const table of ['leasehold_verify_counters', 'leasehold_verify_log', 'leasehold_verify_fences']) {
        const { rows } = await client.query(`SELECT count(*)::int AS n FROM ${table} WHERE resource LIKE $1`, [like]);
        expect(rows[0].n, table).toBe(0);
      }
    } finally {
      await client.end();
    }
  }, 120_000);

  it('the control run against PostgreSQL fails with the violations named', async () => {
    const r = await verify(['--url', PG_URL, '--duration', '5s', '--ttl', '400ms', '--seed', '5', '--nemesis', 'pause', '--no-fence'], sb);
    runs.push(r);
    expect(r.code, r.stdout).toBe(1);
    expect(r.verdicts['no lost update'], r.stdout).toBe('FAIL');
    expect(r.stdout).toMatch(/^ {6}- lost update: /m);
  }, 120_000);

  it('the seed of the local:postgres run plans a delay and a pause whose effects are forced (see forcedEffects)', () => {
    const faults = planSchedule({ seed: LOCAL_SEED, durationMs: 7_000, ttlMs: 500, workers: 3, nemeses: [...NEMESES] });
    expect(forcedEffects(faults, 500)).toEqual({ delay: true, pause: true });
    expect(faults.filter((f) => f.kind === 'clock').length).toBeGreaterThanOrEqual(1);
  });

  it('local:postgres: passes under every nemesis, crashes (immediate stop) included, and the history shows what each fault did', async () => {
    const report = join(sb.dir, 'report');
    const r = await verify(['--url', 'local:postgres', '--duration', '7s', '--ttl', '500ms', '--seed', String(LOCAL_SEED), '--report', report], sb);
    runs.push(r);
    expectPass(r, sb);
    expect(r.stdout).toMatch(/coordinator {2}local:postgres \(PostgreSQL :\d+, started by verify\)/);
    for (const kind of ['pause', 'delay', 'crash', 'clock'] as const) expect(faultCount(r, kind), kind).toBeGreaterThanOrEqual(1);
    const { events, tail } = readReport(report, 3);
    expect(events.filter((e) => e.type === 'restart').every((e) => e.type === 'restart' && e.error === undefined)).toBe(true);
    const effects = faultEffects(events);
    expect(effects.delayedRefused.length, 'a write held by the delay, refused by the fence once delivered').toBeGreaterThanOrEqual(1);
    expect(effects.lostAfterResume.length, 'a frozen holder signalled lost right after SIGCONT').toBeGreaterThanOrEqual(1);
    // The I6 check reports the freeze: as a take-over from a frozen holder, or (when the take-over
    // was by a worker on a slowed clock, which I6 does not judge) as a lease that ran out during it.
    expect(i6Summary(tail)).toMatch(/\b[1-9]\d* frozen, knew right after SIGCONT|\b[1-9]\d* leases ran out during a freeze, each known ≤ \d+ ms after SIGCONT/);
    expect(effects.skewed.length, 'a worker ran on a skewed clock').toBeGreaterThanOrEqual(1);
  }, 180_000);
});

// `leasehold verify` against PostgreSQL: the shared test server as a user's own deployment (the
// resource's rows are keyed by the run id and deleted at the end), and local:postgres, a cluster
// verify makes with initdb and crashes with an immediate stop; the resource shares that cluster.
import { chmodSync } from 'node:fs';
import { join } from 'node:path';
import pg from 'pg';
import { afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { killAll, requireBuild, sandbox, type Sandbox } from '../cli/helpers.js';
import { PG_URL } from '../helpers/env.js';
import { expectPass, faultCount, killLeftovers, readReport, verify, type VerifyRun } from './helpers.js';

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
  it('your own PostgreSQL (the shared server): passes with pause, delay and clock, and deletes what it wrote', async () => {
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

  it('local:postgres: passes under every nemesis, crashes (immediate stop) included', async () => {
    const report = join(sb.dir, 'report');
    const r = await verify(['--url', 'local:postgres', '--duration', '7s', '--ttl', '500ms', '--seed', '9', '--report', report], sb);
    runs.push(r);
    expectPass(r, sb);
    expect(r.stdout).toMatch(/coordinator {2}local:postgres \(PostgreSQL :\d+, started by verify\)/);
    for (const kind of ['pause', 'delay', 'crash'] as const) expect(faultCount(r, kind), kind).toBeGreaterThanOrEqual(1);
    const { events } = readReport(report, 3);
    expect(events.filter((e) => e.type === 'restart').every((e) => e.type === 'restart' && e.error === undefined)).toBe(true);
  }, 180_000);
});

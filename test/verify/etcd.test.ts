// `leasehold verify` against etcd: one member this test starts, as a user's own etcd (verify did not
// start it: crash is not applicable), and local:etcd, one member verify starts in a data directory
// of its own and crashes with SIGKILL. etcd leases are whole seconds with a minimum (the backend
// rounds the ttl up to 2 s), so these runs are longer than the others; the resource is SQLite.
import { join } from 'node:path';
import { afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { startCluster, type Cluster } from '../fixtures/etcd-cluster.mjs';
import { killAll, requireBuild, sandbox, type Sandbox } from '../cli/helpers.js';
import { expectPass, faultCount, faultEffects, killLeftovers, readReport, verify, type VerifyRun } from './helpers.js';

let sb: Sandbox;
const runs: VerifyRun[] = [];
let cluster: Cluster | undefined;

beforeAll(requireBuild);
beforeEach(() => {
  sb = sandbox();
});
afterEach(async () => {
  killAll();
  for (const r of runs.splice(0)) killLeftovers(r.marker, sb.dir);
  sb.cleanup();
  await cluster?.stop();
  cluster = undefined;
});

describe('leasehold verify on etcd', () => {
  it('your own etcd (one member the test starts): passes with pause, delay and clock; crash is not applicable', async () => {
    cluster = await startCluster({ members: 1 });
    const url = `etcd://${cluster.hostList}`;
    const report = join(sb.dir, 'report');
    // Seed 7 plans one pause, one delay and one clock fault in 12 s at the 2 s ttl.
    const r = await verify(['--url', url, '--duration', '12s', '--ttl', '1s', '--seed', '7', '--report', report], sb, 180_000);
    runs.push(r);
    expectPass(r, sb);
    expect(r.stdout).toContain(`coordinator  ${url}\n`);
    expect(r.stdout).toMatch(/ttl 2s \(the coordinator's minimum; asked 1s\)/);
    expect(r.faults).toContain('crash n/a (verify did not start the coordinator; use --url local:redis, local:postgres, local:etcd or local:redlock)');
    for (const kind of ['pause', 'delay', 'clock'] as const) expect(faultCount(r, kind), kind).toBeGreaterThanOrEqual(1);
    const { events } = readReport(report, 3);
    expect(events.some((e) => e.type === 'crash')).toBe(false);
    expect(events.some((e) => e.type === 'delay-end' && e.heldBytes > 0)).toBe(true);
    expect(faultEffects(events).lostAfterResume.length, 'a frozen holder signalled lost right after SIGCONT').toBeGreaterThanOrEqual(1);
    // The member the test started is still the one that answers: verify never touched it.
    expect(cluster.members[0]!.running).toBe(true);
  }, 200_000);

  it("local:etcd: passes under every nemesis, crash and delay included, with the ttl rounded up to the server's minimum", async () => {
    const report = join(sb.dir, 'report');
    const r = await verify(['--url', 'local:etcd', '--duration', '14s', '--ttl', '1s', '--seed', '6', '--report', report], sb, 180_000);
    runs.push(r);
    expectPass(r, sb);
    expect(r.stdout).toMatch(/coordinator {2}local:etcd \(etcd :\d+, started by verify\)/);
    expect(r.stdout).toMatch(/ttl 2s \(the coordinator's minimum; asked 1s\)/);
    for (const kind of ['pause', 'delay', 'crash', 'clock'] as const) expect(faultCount(r, kind), kind).toBeGreaterThanOrEqual(1);
    const { header, events } = readReport(report, 3);
    expect(header).toMatchObject({ ttlMs: 2_000, fence: 'sqlite' });
    expect(events.some((e) => e.type === 'crash')).toBe(true);
    expect(events.some((e) => e.type === 'restart' && e.error === undefined)).toBe(true);
  }, 200_000);
});

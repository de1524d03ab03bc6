// `leasehold verify` against Redlock: three redis-servers this test starts, as a user's own Redlock
// deployment (verify did not start them: crash is not applicable), and local:redlock, three
// redis-servers verify starts itself and crashes one at a time (each restarted empty). Redlock has
// no fence of its own: the resource is SQLite.
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { killAll, requireBuild, sandbox, type Sandbox } from '../cli/helpers.js';
import { startRedis, stopAll } from '../redis/servers.js';
import { expectPass, faultCount, faultEffects, i6Summary, killLeftovers, readReport, verify, type VerifyRun } from './helpers.js';

let sb: Sandbox;
const runs: VerifyRun[] = [];

beforeAll(requireBuild);
afterAll(stopAll);
beforeEach(() => {
  sb = sandbox();
});
afterEach(() => {
  killAll();
  for (const r of runs.splice(0)) killLeftovers(r.marker, sb.dir);
  sb.cleanup();
});

describe('leasehold verify on Redlock', () => {
  it('your own Redlock (three redis-servers): passes with pause, delay and clock; crash is not applicable', async () => {
    const nodes = [await startRedis(), await startRedis(), await startRedis()];
    const url = `redlock://${nodes.map((n) => `127.0.0.1:${n.port}`).join(',')}`;
    const report = join(sb.dir, 'report');
    const r = await verify(['--url', url, '--duration', '5s', '--ttl', '400ms', '--seed', '1', '--report', report], sb);
    runs.push(r);
    expectPass(r, sb);
    expect(r.stdout).toContain(`coordinator  ${url}\n`);
    expect(r.stdout).toMatch(/resource {5}sqlite: SQLite file in the run directory; writes through the fence \(sqliteFence\)/);
    expect(r.faults).toContain('crash n/a (verify did not start the coordinator; use --url local:redis, local:postgres, local:etcd or local:redlock)');
    expect(faultCount(r, 'pause')).toBeGreaterThanOrEqual(1);
    expect(faultCount(r, 'delay')).toBeGreaterThanOrEqual(1);
    const { events, tail } = readReport(report, 3);
    // The delay proxies sit in front of all three servers: the held bytes were delivered.
    expect(events.some((e) => e.type === 'delay-end' && e.heldBytes > 0)).toBe(true);
    expect(faultEffects(events).lostAfterResume.length).toBeGreaterThanOrEqual(1);
    // The I6 check reports the freeze: as a take-over from a frozen holder, or (when the take-over
    // was by a worker on a slowed clock, which I6 does not judge) as a lease that ran out during it.
    expect(i6Summary(tail)).toMatch(/\b[1-9]\d* frozen, knew right after SIGCONT|\b[1-9]\d* leases ran out during a freeze, each known ≤ \d+ ms after SIGCONT/);
  }, 120_000);

  it('local:redlock: passes under every nemesis; each crash kills one of the three servers, in turn, and restarts it', async () => {
    const report = join(sb.dir, 'report');
    const r = await verify(['--url', 'local:redlock', '--duration', '5s', '--ttl', '400ms', '--seed', '2', '--report', report], sb);
    runs.push(r);
    expectPass(r, sb);
    const header =
      /coordinator {2}local:redlock \(Redlock over redis-server :(\d+), redis-server :(\d+), redis-server :(\d+), started by verify; no persistence\)/.exec(
        r.stdout,
      );
    expect(header, r.stdout).not.toBeNull();
    const ports = header!.slice(1, 4);
    for (const kind of ['pause', 'delay', 'crash', 'clock'] as const) expect(faultCount(r, kind), kind).toBeGreaterThanOrEqual(1);
    const { events } = readReport(report, 3);
    const crashed = events.flatMap((e) => (e.type === 'crash' ? [e.what] : []));
    // Seed 2 plans two crashes in 5 s: the first two servers, in order; each one is back.
    expect(crashed).toEqual([`redis-server :${ports[0]}`, `redis-server :${ports[1]}`]);
    expect(events.flatMap((e) => (e.type === 'restart' ? [[e.what, e.error]] : []))).toEqual(crashed.map((what) => [what, undefined]));
    expect(r.stdout).toContain(`crash   redis-server :${ports[0]} killed; restarting in`);
    expect(r.stdout).toContain(`restart redis-server :${ports[0]} is back`);
  }, 120_000);
});

// `leasehold verify` against Redis: the shared test server as a user's own deployment (crash is
// not applicable there), and local:redis, which verify starts itself without persistence and
// crashes. The resource is a Redis counter and list behind redisFence; with local:redis it lives
// on a second server of its own that is never crashed.
import { Redis } from 'ioredis';
import { afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { killAll, requireBuild, sandbox, startCli, type Sandbox } from '../cli/helpers.js';
import { freePort } from '../../src/verify/local.js';
import { REDIS_URL } from '../redis/servers.js';
import { NEMESES, planSchedule } from '../../src/verify/schedule.js';
import {
  expectClean,
  expectPass,
  faultCount,
  faultEffects,
  forcedEffects,
  i6Summary,
  killLeftovers,
  leftovers,
  readReport,
  verify,
  type VerifyRun,
} from './helpers.js';
import { readdirSync } from 'node:fs';
import { join } from 'node:path';

/** Its schedule forces a delayed write's refusal and a frozen holder's late signal (asserted below). */
const LOCAL_SEED = 60;
let sb: Sandbox;
const runs: VerifyRun[] = [];

beforeAll(requireBuild);
beforeEach(() => {
  sb = sandbox();
});
afterEach(() => {
  killAll();
  for (const r of runs.splice(0)) killLeftovers(r.marker, sb.dir);
  sb.cleanup();
});

function runId(r: VerifyRun): string {
  return /run ([0-9a-f]{8}),/.exec(r.stdout)![1]!;
}

describe('leasehold verify on Redis', () => {
  it('your own Redis (the shared server): passes with pause, delay and clock; crash is not applicable; the resource keys are removed (storage layout: its keys are scanned)', async () => {
    const r = await verify(['--url', REDIS_URL, '--duration', '5s', '--ttl', '400ms', '--seed', '31'], sb);
    runs.push(r);
    expectPass(r, sb);
    expect(r.stdout).toMatch(/resource {5}redis: redis:\/\/127\.0\.0\.1:\d+; writes through the fence \(redisFence\)/);
    expect(faultCount(r, 'crash')).toBe('n/a');
    expect(r.faults).toContain('crash n/a (verify did not start the coordinator; use --url local:redis, local:postgres, local:etcd or local:redlock)');
    expect(faultCount(r, 'pause')).toBeGreaterThanOrEqual(1);
    expect(faultCount(r, 'delay')).toBeGreaterThanOrEqual(1);
    const client = new Redis(REDIS_URL);
    try {
      expect(await client.keys(`leasehold-verify:*${runId(r)}*`)).toEqual([]);
    } finally {
      client.disconnect();
    }
  }, 120_000);

  it('--limit 2 on your own Redis passes (at most 2 valid permits at once); its control run (--count-then-acquire) fails the permits check', async () => {
    const args = ['--url', REDIS_URL, '--limit', '2', '--duration', '5s', '--ttl', '400ms', '--seed', '11', '--nemesis', 'pause,delay,clock'];
    const r = await verify(args, sb);
    runs.push(r);
    const context = `stdout:\n${r.stdout}\nstderr:\n${r.stderr}`;
    expect(r.code, context).toBe(0);
    expect(r.verdicts, context).toEqual({ grants: 'PASS', permits: 'PASS', fence: 'PASS', 'no lost update': 'PASS', I6: 'PASS' });
    expect(r.stdout).toMatch(/^ {2}lease {8}permits of a semaphore of 2 \(acquire with limit 2\)$/m);
    expectClean(r, sb);
    const control = await verify([...args, '--count-then-acquire'], sb);
    runs.push(control);
    expect(control.code, control.stdout).toBe(1);
    expect(control.verdicts, control.stdout).toMatchObject({ grants: 'PASS', permits: 'FAIL', fence: 'PASS', 'no lost update': 'PASS' });
    expect(control.stdout).toMatch(/^verdict: FAIL \(permits\)$/m);
    expectClean(control, sb);
  }, 180_000);

  it('eight processes share a semaphore of 3 for 20 s on your own Redis: never more than 3 valid permits at once', async () => {
    const args = [
      '--url',
      REDIS_URL,
      '--limit',
      '3',
      '--workers',
      '8',
      '--duration',
      '20s',
      '--ttl',
      '400ms',
      '--seed',
      '12',
      '--nemesis',
      'pause,delay,clock',
    ];
    const r = await verify(args, sb);
    runs.push(r);
    const context = `stdout:\n${r.stdout}\nstderr:\n${r.stderr}`;
    expect(r.code, context).toBe(0);
    expect(r.verdicts, context).toEqual({ grants: 'PASS', permits: 'PASS', fence: 'PASS', 'no lost update': 'PASS', I6: 'PASS' });
    expect(r.stdout).toMatch(/^ {2}lease {8}permits of a semaphore of 3 \(acquire with limit 3\)$/m);
    expectClean(r, sb);
  }, 180_000);

  it('the seed of the local:redis run plans a delay and a pause whose effects are forced (see forcedEffects)', () => {
    const faults = planSchedule({ seed: LOCAL_SEED, durationMs: 7_000, ttlMs: 400, workers: 3, nemeses: [...NEMESES] });
    expect(forcedEffects(faults, 400)).toEqual({ delay: true, pause: true });
    expect(faults.filter((f) => f.kind === 'clock').length).toBeGreaterThanOrEqual(1);
  });

  it('local:redis: passes under every nemesis, crashes included, and the history shows what each fault did', async () => {
    const report = join(sb.dir, 'report');
    const r = await verify(['--url', 'local:redis', '--duration', '7s', '--ttl', '400ms', '--seed', String(LOCAL_SEED), '--report', report], sb);
    runs.push(r);
    expectPass(r, sb);
    expect(r.stdout).toMatch(/coordinator {2}local:redis \(redis-server :\d+, started by verify; no persistence\)/);
    for (const kind of ['pause', 'delay', 'crash', 'clock'] as const) expect(faultCount(r, kind), kind).toBeGreaterThanOrEqual(1);
    expect(r.stdout).toMatch(/crash {3}redis-server :\d+ killed; restarting in/);
    expect(r.stdout).toMatch(/restart redis-server :\d+ is back/);
    const { events, tail } = readReport(report, 3);
    expect(events.some((e) => e.type === 'delay-end' && e.heldBytes > 0)).toBe(true);
    expect(events.some((e) => e.type === 'restart' && e.error === undefined)).toBe(true);
    const effects = faultEffects(events);
    expect(effects.delayedRefused.length, 'a write held by the delay, refused by the fence once delivered').toBeGreaterThanOrEqual(1);
    expect(effects.lostAfterResume.length, 'a frozen holder signalled lost right after SIGCONT').toBeGreaterThanOrEqual(1);
    // The I6 check reports the freeze: as a take-over from a frozen holder, or (when the take-over
    // was by a worker on a slowed clock, which I6 does not judge) as a lease that ran out during it.
    expect(i6Summary(tail)).toMatch(/\b[1-9]\d* frozen, knew right after SIGCONT|\b[1-9]\d* leases ran out during a freeze, each known ≤ \d+ ms after SIGCONT/);
    expect(effects.skewed.length, 'a worker ran on a skewed clock').toBeGreaterThanOrEqual(1);
  }, 120_000);

  it("the control run on local:redis (the README's example, shorter) exits 1: lost updates, named", async () => {
    const r = await verify(['--url', 'local:redis', '--seed', '42', '--no-fence', '--duration', '5s', '--ttl', '400ms'], sb);
    runs.push(r);
    expect(r.code, r.stdout).toBe(1);
    expect(r.stdout).toMatch(/CONTROL RUN \(--no-fence\)/);
    expect(r.verdicts['no lost update'], r.stdout).toBe('FAIL');
    expect(r.stdout).toMatch(/^ {6}- lost update: write #\d+ .* stored \d+ right after #\d+ .* stored \d+: it read a value from before that write$/m);
    expect(r.stdout).toMatch(/^verdict: FAIL \(.*lost-update.*\)$/m);
    expectClean(r, sb);
  }, 120_000);

  it('SIGINT in the middle of a run stops the workers and both servers and removes the run directory', async () => {
    const marker = `sigint${process.pid}`;
    const cli = startCli(['verify', '--url', 'local:redis', '--duration', '60s', '--ttl', '400ms', '--seed', '3'], sb, { LEASEHOLD_VERIFY_TEST_RUN: marker });
    runs.push({ marker } as VerifyRun);
    await cli.waitFor(/\[ *\d+\.\ds\] operations \d+/, 60_000);
    // the command, three workers and two redis-servers (coordinator and resource)
    expect(leftovers(marker, sb.dir).length).toBeGreaterThanOrEqual(6);
    cli.child.kill('SIGINT');
    const done = await cli.done;
    expect(done.code).toBe(130);
    expect(leftovers(marker, sb.dir)).toEqual([]);
    expect(readdirSync(sb.dir).filter((n) => n.startsWith('leasehold-verify-'))).toEqual([]);
  }, 120_000);

  it('a coordinator that cannot be reached exits 69 and starts nothing', async () => {
    const port = await freePort();
    const r = await verify(['--url', `redis://127.0.0.1:${port}`, '--duration', '2s', '--ttl', '300ms'], sb);
    runs.push(r);
    expect(r.code, r.stderr).toBe(69);
    expect(r.errLines[0]).toMatch(/^leasehold: coordinator redis:\/\/127\.0\.0\.1:\d+ unavailable: /);
    expectClean(r, sb);
  }, 60_000);
});

// `leasehold verify` end to end on SQLite (coordinator and resource are files; pause and clock
// apply, delay and crash do not): passes with the fence, the --no-fence control fails with the
// violations named, the same seed gives the same schedule, the report is written, bad arguments
// exit 64. Short runs with a small ttl; the assertions never depend on the machine's speed.
import { existsSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { killAll, requireBuild, runCli, sandbox, type Sandbox } from '../cli/helpers.js';
import { MUTANT_ENV } from '../../src/verify/protocol.js';
import { NEMESES, planSchedule } from '../../src/verify/schedule.js';
import { expectClean, expectPass, faultCount, killLeftovers, readReport, verify, type VerifyRun } from './helpers.js';

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

const SEED = 20_261_129;
const TTL = 400;
const common = (db: string): string[] => [
  '--url',
  `sqlite:${db}`,
  '--workers',
  '3',
  '--duration',
  '5s',
  '--ttl',
  `${TTL}ms`,
  '--seed',
  String(SEED),
  '--nemesis',
  'pause,clock',
];

describe('leasehold verify on SQLite', () => {
  it('the schedule of the seed used here has pauses (the control run needs them)', () => {
    const pauses = planSchedule({ seed: SEED, durationMs: 5_000, ttlMs: TTL, workers: 3, nemeses: ['pause', 'clock'] }).filter((f) => f.kind === 'pause');
    expect(pauses.length).toBeGreaterThanOrEqual(2);
  });

  it('passes with the fence, writes the report, and leaves nothing behind; the control run fails with the violations named, on the same schedule', async () => {
    const report = join(sb.dir, 'report');
    const fenced = await verify([...common(join(sb.dir, 'locks.db')), '--report', report], sb);
    runs.push(fenced);
    expectPass(fenced, sb);
    expect(fenced.stdout).toMatch(/^leasehold verify: run [0-9a-f]{8}, seed 20261129 \(repeat with --seed 20261129\)$/m);
    expect(fenced.stdout).toMatch(/^ {2}nemesis {6}pause; clock$/m);
    expect(faultCount(fenced, 'pause')).toBeGreaterThanOrEqual(1);
    expect(fenced.stdout).toMatch(/\+ *\d+\.\d\ds {2}pause {3}w\d \(pid \d+\) SIGSTOP for/); // progress while it runs
    expect(fenced.stdout).toMatch(/^ {2}\[ *\d+\.\ds\] operations \d+, accepted \d+/m);

    const { header, events, tail } = readReport(report, 3);
    expect(header).toMatchObject({ seed: SEED, fenced: true, fence: 'sqlite', workers: 3 });
    for (const type of ['start', 'granted', 'validity', 'write', 'accepted', 'release', 'pause', 'resume', 'clock', 'clock-set', 'stop', 'finished']) {
      expect(
        events.some((e) => e.type === type),
        `an event of type ${type}`,
      ).toBe(true);
    }
    for (let i = 1; i < events.length; i++) expect(events[i]!.t).toBeGreaterThanOrEqual(events[i - 1]!.t);
    expect(tail.filter((l) => l.type === 'check').map((l) => [l.id, l.verdict])).toEqual([
      ['grants', 'pass'],
      ['tokens', 'pass'],
      ['lost-update', 'pass'],
      ['i6', 'pass'],
    ]);
    const final = tail.find((l) => l.type === 'final') as { counter: number; log: unknown[] };
    expect(final.counter).toBe(events.filter((e) => e.type === 'accepted').length);
    expect(final.log).toHaveLength(final.counter);
    // Offsets differ per worker and never matter.
    const offsets = new Set(events.flatMap((e) => (e.type === 'clock' && e.rate === 1 ? [e.offsetMs] : [])));
    expect(offsets.size).toBe(3);

    const control = await verify([...common(join(sb.dir, 'control.db')), '--no-fence'], sb);
    runs.push(control);
    expect(control.code, control.stdout).toBe(1);
    expect(control.stdout).toMatch(/CONTROL RUN \(--no-fence\)/);
    expect(control.verdicts.fence, control.stdout).toBe('FAIL');
    expect(control.verdicts['no lost update'], control.stdout).toBe('FAIL');
    expect(control.stdout).toMatch(/^ {6}- write #\d+ \(w\d\.\d+, w\d\) committed token \d+ after #\d+ \(w\d\.\d+, w\d\) had committed token \d+$/m);
    expect(control.stdout).toMatch(/^ {6}- lost update: write #\d+ .* stored \d+ right after #\d+ .* stored \d+: it read a value from before that write$/m);
    expect(control.stdout).toMatch(/^verdict: FAIL \(tokens, lost-update\)$/m);
    expectClean(control, sb);
    // Same seed, same options: the same schedule.
    expect(control.schedule.length).toBeGreaterThanOrEqual(2);
    expect(control.schedule).toEqual(fenced.schedule);
  }, 180_000);

  it('the I6 mutant (workers whose backend overstates the ttl ×2) fails the I6 check with two holders at once; the fence still holds', async () => {
    const args = ['--url', `sqlite:${join(sb.dir, 'mutant.db')}`, '--duration', '5s', '--ttl', `${TTL}ms`, '--seed', String(SEED), '--nemesis', 'pause'];
    const r = await verify(args, sb, 120_000, { [MUTANT_ENV]: 'overstated-ttl' });
    runs.push(r);
    expect(r.code, r.stdout).toBe(1);
    expect(r.stdout).toContain(`${MUTANT_ENV}=overstated-ttl: the workers overstate their leases' ttl (×2), a test-only mutant: the I6 check must fail`);
    expect(r.verdicts, r.stdout).toEqual({ grants: 'PASS', fence: 'PASS', 'no lost update': 'PASS', I6: 'FAIL' });
    expect(r.stdout).toMatch(
      /^ {6}- w\d's lease \(token \d+\) was valid locally until \d+\.\d{3}s, but w\d was granted token \d+ at \d+\.\d{3}s: two holders at once$/m,
    );
    expect(r.stdout).toMatch(/^verdict: FAIL \(i6\)$/m);
    expectClean(r, sb);
  }, 120_000);

  it('local:sqlite: delay and crash do not apply there and say why; no nemesis at all also runs', async () => {
    const r = await verify(['--url', 'local:sqlite', '--workers', '2', '--duration', '1.5s', '--ttl', '300ms', '--nemesis', 'delay,crash'], sb);
    runs.push(r);
    expectPass(r, sb);
    expect(r.stdout).toMatch(
      /^ {2}nemesis {6}delay n\/a \(no TCP service: the coordinator and the resource are SQLite files\); crash n\/a \(SQLite has no server to crash\)$/m,
    );
    expect(r.faults).toMatch(/delay n\/a .*crash n\/a/);
    const none = await verify(['--url', 'local:sqlite', '--workers', '1', '--duration', '1s', '--ttl', '300ms', '--nemesis', 'none'], sb);
    runs.push(none);
    expectPass(none, sb);
    expect(none.stdout).toMatch(/^ {2}nemesis {6}none$/m);
  }, 60_000);

  it('bad arguments exit 64 with a usage line, before starting anything', async () => {
    const cases: [string[], RegExp][] = [
      [[], /--url is required \(or set LEASEHOLD_URL\)/],
      [['--url', 'memory:'], /memory: lives in one process/],
      [['--url', 'local:mysql'], /local:mysql is not one verify can start/],
      [['--url', 'ftp://x'], /unsupported scheme/],
      [['--url', 'local:sqlite', '--workers', '0'], /--workers.*expected an integer from 1/],
      [['--url', 'local:sqlite', '--workers', '65'], /--workers.*expected an integer from 1 to 64, got "65"/],
      [['--url', 'local:sqlite', '--no-fence', '--fence', 'sqlite'], /--no-fence and --fence do not go together/],
      [['--url', 'local:sqlite', '--fence', 'sqlite', '--no-fence'], /--no-fence and --fence do not go together/],
      [['--url', 'ftp://x', '--report', join(sb.dir, 'not-made')], /unsupported scheme/],
      [['--url', 'local:sqlite', '--ttl', '50ms', '--report', join(sb.dir, 'not-made')], /--ttl must be at least 100ms/],
      [['--url', 'local:sqlite', '--ttl', '50ms'], /--ttl must be at least 100ms/],
      [['--url', 'local:sqlite', '--ttl', '1s', '--duration', '1.5s'], /--duration \(1\.5s\) must be at least twice --ttl/],
      [['--url', 'local:sqlite', '--nemesis', 'pause,flood'], /--nemesis.*expected a comma-separated list of pause, delay, crash, clock/],
      [['--url', 'local:sqlite', '--fence', 'mongo'], /--fence.*Allowed choices are sqlite, postgres, mysql, redis/],
      [['--url', 'local:sqlite', '--fence', 'postgres'], /--fence postgres needs --fence-url/],
      [['--url', 'local:sqlite', '--fence-url', 'redis://x:1'], /--fence-url is for --fence postgres, mysql or redis/],
      [['--url', 'local:sqlite', '--seed', '-1'], /--seed/],
      [['--url', 'local:sqlite', '--seed', '4294967296'], /--seed.*expected an integer from 0 to 4294967295/],
      [['--url', 'local:sqlite', '--ttl', '500ms', '--work', '600ms'], /--work \(600ms\) must be shorter than --ttl/],
      [['--url', 'local:sqlite', '--report', join(sb.dir, 'file', 'report')], /cannot use --report .*ENOTDIR/],
    ];
    writeFileSync(join(sb.dir, 'file'), 'not a directory');
    for (const [args, message] of cases) {
      const r = await runCli(['verify', ...args], sb, { timeoutMs: 30_000, env: { LEASEHOLD_URL: '' } });
      expect(r.code, `${args.join(' ')}\n${r.stderr}`).toBe(64);
      expect(r.stderr, args.join(' ')).toMatch(message);
      expect(r.errLines.at(-1), args.join(' ')).toMatch(/^usage: leasehold verify --url URL/);
      expect(r.stdout).toBe('');
    }
    // A run refused for a bad argument creates no --report directory.
    expect(existsSync(join(sb.dir, 'not-made'))).toBe(false);
    expect(NEMESES).toHaveLength(4);
  }, 120_000);
});

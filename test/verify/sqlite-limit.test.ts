// `leasehold verify --limit N` end to end on SQLite: the workers hold permits of a semaphore of 2
// and the history shows at most 2 valid at once while the fence still refuses the late writes; the
// control run (--count-then-acquire: the workers count the holders with inspect, then take a plain
// shared lock) fails the permits check with the moments named; bad combinations exit 64.
import { join } from 'node:path';
import { afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { killAll, requireBuild, runCli, sandbox, type Sandbox } from '../cli/helpers.js';
import { expectClean, faultCount, killLeftovers, readReport, verify, type VerifyRun } from './helpers.js';

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
const args = (db: string): string[] => [
  '--url',
  `sqlite:${db}`,
  '--limit',
  '2',
  '--duration',
  '5s',
  '--ttl',
  '400ms',
  '--seed',
  String(SEED),
  '--nemesis',
  'pause,clock',
];

describe('leasehold verify --limit on SQLite', () => {
  it('a semaphore of 2 passes: at most 2 permits valid at once, the fence refuses late writes; the report says so', async () => {
    const report = join(sb.dir, 'report');
    const r = await verify([...args(join(sb.dir, 'locks.db')), '--report', report], sb);
    runs.push(r);
    const context = `stdout:\n${r.stdout}\nstderr:\n${r.stderr}`;
    expect(r.code, context).toBe(0);
    expect(r.verdicts, context).toEqual({ grants: 'PASS', permits: 'PASS', fence: 'PASS', 'no lost update': 'PASS', I6: 'PASS' });
    // The default workers with --limit 2: 2N + 2.
    expect(r.stdout).toMatch(/^ {2}workers {6}6 processes, /m);
    expect(r.stdout).toMatch(/^ {2}lease {8}permits of a semaphore of 2 \(acquire with limit 2\)$/m);
    // Permits really overlapped (two valid at once happened), or the run proved little.
    expect(r.stdout).toMatch(/^ {2}permits: at most 2 valid at once \(I9\) +PASS +\d+ permits, at most 2 valid at once( where checked)? \(limit 2\)/m);
    expect(r.stdout).toMatch(
      /late writes \(sent after the writer's permit had ended\): \d+ refused, \d+ committed before any higher token \(harmless\)|no late writes/,
    );
    expect(faultCount(r, 'pause')).toBeGreaterThanOrEqual(1);
    const { header, events, tail } = readReport(report, 6);
    expect(header).toMatchObject({ limit: 2, countThenAcquire: false, workers: 6 });
    expect(tail.filter((l) => l.type === 'check').map((l) => [l.id, l.verdict])).toEqual([
      ['grants', 'pass'],
      ['permits', 'pass'],
      ['tokens', 'pass'],
      ['lost-update', 'pass'],
      ['i6', 'pass'],
    ]);
    expect(events.filter((e) => e.type === 'granted').length).toBeGreaterThan(10);
    expectClean(r, sb);
  }, 120_000);

  it('the control run (--count-then-acquire) fails the permits check, naming the moments with more than 2 valid', async () => {
    const r = await verify([...args(join(sb.dir, 'control.db')), '--count-then-acquire'], sb);
    runs.push(r);
    expect(r.code, r.stdout).toBe(1);
    expect(r.stdout).toMatch(/^ {2}lease {8}CONTROL RUN \(--count-then-acquire\): a semaphore of 2 built by the workers/m);
    expect(r.verdicts.permits, r.stdout).toBe('FAIL');
    // The fence and the counter still hold: what failed is the semaphore alone.
    expect(r.verdicts, r.stdout).toMatchObject({ grants: 'PASS', fence: 'PASS', 'no lost update': 'PASS' });
    expect(r.stdout).toMatch(/^ {6}- [3-6] permits valid at once at \d+\.\d{3}s, limit 2: w\d token \d+ \(granted \d+\.\d{3}s, valid until \d+\.\d{3}s\), /m);
    expect(r.stdout).toMatch(/^verdict: FAIL \(permits\)$/m);
    expectClean(r, sb);
  }, 120_000);

  it('bad combinations exit 64 with a usage line, before starting anything', async () => {
    const cases: [string[], RegExp][] = [
      [['--limit', '0'], /--limit.*expected an integer from 1 to 10000, got "0"/],
      [['--limit', '10001'], /--limit.*expected an integer from 1 to 10000/],
      [['--limit', '3', '--workers', '3'], /--limit 3 needs more --workers than permits \(got 3\)/],
      [['--limit', '2', '--no-fence'], /--limit and --no-fence do not go together/],
      [['--count-then-acquire'], /--count-then-acquire is the control run of --limit N: give --limit too/],
    ];
    for (const [extra, message] of cases) {
      const r = await runCli(['verify', '--url', 'local:sqlite', ...extra], sb, { timeoutMs: 30_000, env: { LEASEHOLD_URL: '' } });
      expect(r.code, `${extra.join(' ')}\n${r.stderr}`).toBe(64);
      expect(r.stderr, extra.join(' ')).toMatch(message);
      expect(r.errLines.at(-1)).toMatch(/^usage: leasehold verify --url URL .*\[--limit N \[--count-then-acquire\]\]/);
      expect(r.stdout).toBe('');
    }
  }, 60_000);

  it("the help says that a run without --limit checks an election's terms", async () => {
    const r = await runCli(['verify', '--help'], sb);
    expect(r.code).toBe(0);
    expect(r.stdout.replace(/\s+/g, ' ')).toContain(
      "so a run without --limit already checks leaders' terms: no two valid at once (I6), and every fenced write of a deposed leader refused (I3).",
    );
  });
});

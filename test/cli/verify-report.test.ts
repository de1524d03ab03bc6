// `leasehold verify --report DIR` with a DIR it cannot write: a usage error (exit 64 and a usage
// line) before the run starts, never a hang. Each run is killed after a few seconds, so a
// regression (Node's recursive mkdir spins forever on /proc/x) fails instead of hanging the suite.
import { mkdirSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { killAll, requireBuild, runCli, sandbox, type Sandbox } from './helpers.js';

let sb: Sandbox;
beforeAll(requireBuild);
beforeEach(() => {
  sb = sandbox();
});
afterEach(() => {
  killAll();
  sb.cleanup();
});

/** verify with a run long enough that a refusal after the start would show (the run itself takes ≥ 4 s). */
async function verifyWithReport(report: string) {
  const started = Date.now();
  const r = await runCli(['verify', '--url', `sqlite:${join(sb.dir, 'v.db')}`, '--duration', '4s', '--ttl', '1s', '--report', report], sb, {
    timeoutMs: 8_000,
  });
  return { ...r, ms: Date.now() - started };
}

describe('verify --report with a path it cannot write', () => {
  it('a directory that cannot be created (/proc/x) is a usage error at once, not a busy loop', async () => {
    const r = await verifyWithReport('/proc/leasehold-test/report');
    expect(r.signal, 'killed by the test: the command hung').toBeNull();
    expect(r.code).toBe(64);
    expect(r.errLines[0]).toMatch(/^leasehold: cannot use --report \/proc\/leasehold-test\/report: .*ENOENT/);
    expect(r.errLines[1]).toMatch(/^usage: leasehold verify /);
    expect(r.errLines).toHaveLength(2);
    expect(r.stdout).toBe(''); // refused before the run: no schedule, no workers
    expect(r.ms).toBeLessThan(4_000);
  });

  it('a path under a regular file is a usage error before the run', async () => {
    const file = join(sb.dir, 'plain-file');
    writeFileSync(file, 'x');
    const r = await verifyWithReport(join(file, 'report'));
    expect(r.code).toBe(64);
    expect(r.errLines[0]).toMatch(/cannot use --report .*plain-file\/report: ENOTDIR/);
    expect(r.errLines[1]).toMatch(/^usage: leasehold verify /);
    expect(r.stdout).toBe('');
  });

  it('a report file that cannot be written (history.jsonl is a directory) is a usage error before the run', async () => {
    const dir = join(sb.dir, 'report');
    mkdirSync(join(dir, 'history.jsonl'), { recursive: true });
    const r = await verifyWithReport(dir);
    expect(r.code).toBe(64);
    expect(r.errLines[0]).toMatch(/cannot use --report .*report: EISDIR/);
    expect(r.errLines[1]).toMatch(/^usage: leasehold verify /);
    expect(r.stdout).toBe('');
    // The check leaves nothing behind of its own.
    expect(readdirSync(dir)).toEqual(['history.jsonl']);
  });

  it('missing parents are created and the run writes its report there', async () => {
    const dir = join(sb.dir, 'a', 'b', 'report');
    const r = await runCli(
      ['verify', '--url', `sqlite:${join(sb.dir, 'v.db')}`, '--duration', '2s', '--ttl', '500ms', '--nemesis', 'none', '--report', dir],
      sb,
      { timeoutMs: 30_000 },
    );
    expect(r.code, r.stderr).toBe(0);
    expect(readdirSync(dir).sort()).toEqual(['history.jsonl', 'timeline.svg']);
  }, 40_000);
});

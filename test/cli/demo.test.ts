// `leasehold demo` as a real process: real worker processes, a real SIGSTOP. Short ttl and pause
// keep it quick; the demo itself waits for each step (and keeps A frozen until B has saved), so a
// slow machine makes it slower, not wrong.
import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { alive, eventually, killAll, requireBuild, runCli, sandbox, startCli, type Sandbox } from './helpers.js';

let sb: Sandbox;

beforeAll(requireBuild);
beforeEach(() => {
  sb = sandbox();
});
afterEach(() => {
  killAll();
  sb.cleanup();
});

/** The two runs' sections of the output. */
function sections(stdout: string): { unfenced: string; fenced: string } {
  const one = stdout.indexOf('Run 1:');
  const two = stdout.indexOf('Run 2:');
  expect(one).toBeGreaterThanOrEqual(0);
  expect(two).toBeGreaterThan(one);
  return { unfenced: stdout.slice(one, two), fenced: stdout.slice(two) };
}

function workerPids(stdout: string): number[] {
  return [...stdout.matchAll(/started worker A \(pid (\d+)\) and worker B \(pid (\d+)\)/g)].flatMap((m) => [Number(m[1]), Number(m[2])]);
}

/** Temporary directories the demo made in the sandbox (it is TMPDIR). */
function demoTempDirs(): string[] {
  return readdirSync(sb.dir).filter((name) => name.startsWith('leasehold-demo-'));
}

describe('leasehold demo', () => {
  it('shows the overwrite without a fence and the refusal with one; exits 0; leaves nothing behind', async () => {
    const r = await runCli(['demo', '--ttl', '300ms', '--pause', '700ms'], sb, { timeoutMs: 90_000 });
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    const { unfenced, fenced } = sections(r.stdout);

    // Run 1: A checks (valid), is frozen, B takes over with token 2 and saves, A's plain UPDATE overwrites it.
    expect(unfenced).toMatch(/A\s+read doc:42 .*checked lease\.signal\.aborted = false/);
    expect(unfenced).toMatch(/SIGSTOP A/);
    expect(unfenced).toMatch(/B\s+acquired doc:42:recompute: token 2/);
    expect(unfenced).toMatch(/B\s+UPDATE doc:42 .* -> ACCEPTED/);
    expect(unfenced).toMatch(/SIGCONT A/);
    expect(unfenced).toMatch(/A\s+UPDATE doc:42 .*"recomputed by A under token 1" -> OVERWRITE/);
    expect(unfenced).toMatch(/A\s+lease\.signal aborted \((not-held|expired)\)/);
    expect(unfenced).toMatch(/final\s+doc:42 = "recomputed by A under token 1" \(written by A under token 1\)/);
    expect(unfenced).toMatch(/verdict: LOST UPDATE/);

    // Run 2: the same story through the fence: A is refused, B's result (token 4) stays.
    expect(fenced).toMatch(/B\s+acquired doc:42:recompute: token 4/);
    expect(fenced).toMatch(/B\s+fence\.write\("doc:42", token 4\) .* -> ACCEPTED/);
    expect(fenced).toMatch(/A\s+fence\.write\("doc:42", token 3\) -> REFUSED: StaleTokenError/);
    expect(fenced).toMatch(/A\s+lease\.signal aborted \((not-held|expired)\)/);
    expect(fenced).toMatch(/final\s+doc:42 = "recomputed by B under token 4" \(written by B under token 4\); the fence's highest accepted token: 4/);
    expect(fenced).toMatch(/verdict: SAFE/);
    expect(fenced).not.toMatch(/OVERWRITE/);

    // Timeline order in each run: check, freeze, B saves, continue, A writes.
    for (const section of [unfenced, fenced]) {
      const at = (re: RegExp): number => section.search(re);
      expect(at(/checked lease/)).toBeLessThan(at(/SIGSTOP A/));
      expect(at(/SIGSTOP A/)).toBeLessThan(at(/B\s+(UPDATE|fence\.write)/));
      expect(at(/B\s+(UPDATE|fence\.write)/)).toBeLessThan(at(/SIGCONT A/));
      expect(at(/SIGCONT A/)).toBeLessThan(at(/A\s+(UPDATE|fence\.write)/));
    }

    const pids = workerPids(r.stdout);
    expect(pids).toHaveLength(4);
    for (const pid of pids) expect(alive(pid)).toBe(false);
    expect(demoTempDirs()).toEqual([]);
  });

  for (const [what, args, ttl, pause] of [
    ['npm start (the defaults: ttl 1s, pause 1.2s)', [], '1s', '1.2s'],
    ['the literal story: --ttl 10s --pause 12s', ['--ttl', '10s', '--pause', '12s'], '10s', '12s'],
  ] as const) {
    it(`${what}: the overwrite without a fence, the refusal with one, exit 0`, async () => {
      const r = await runCli(['demo', ...args], sb, { timeoutMs: 150_000 });
      expect(r.stderr).toBe('');
      expect(r.code).toBe(0);
      const { unfenced, fenced } = sections(r.stdout);
      for (const section of [unfenced, fenced]) {
        expect(section).toContain(`SIGSTOP A: frozen for ${pause} between its check and its write (ttl ${ttl})`);
        expect(section).toContain(`SIGCONT A after ${pause}`);
      }
      expect(unfenced).toMatch(/verdict: LOST UPDATE/);
      expect(fenced).toMatch(/A\s+fence\.write\("doc:42", token 3\) -> REFUSED: StaleTokenError/);
      expect(fenced).toMatch(/verdict: SAFE/);
      expect(demoTempDirs()).toEqual([]);
    }, 180_000);
  }

  it('fails (exit 1, why on stderr) when the fenced run lets A write without the fence: the verdict is not hard-coded', async () => {
    const r = await runCli(['demo', '--ttl', '300ms', '--pause', '700ms'], sb, { timeoutMs: 90_000, env: { LEASEHOLD_DEMO_MUTANT: 'unfenced-a' } });
    expect(r.code).toBe(1);
    const { fenced } = sections(r.stdout);
    expect(fenced).toMatch(/A\s+UPDATE doc:42 .* -> OVERWRITE/);
    expect(fenced).toMatch(/final\s+doc:42 = "recomputed by A under token 3"/);
    expect(fenced).toMatch(/verdict: FAILED/);
    expect(r.errLines).toHaveLength(1);
    expect(r.errLines[0]).toMatch(/^leasehold: demo failed: .*A's stale write \(token 3\) was accepted/);
    expect(demoTempDirs()).toEqual([]);
  });

  it('keeps its files with --dir', async () => {
    const dir = join(sb.dir, 'kept');
    const r = await runCli(['demo', '--ttl', '200ms', '--pause', '500ms', '--dir', dir], sb, { timeoutMs: 90_000 });
    expect(r.code).toBe(0);
    expect(existsSync(join(dir, 'locks.db'))).toBe(true);
    expect(existsSync(join(dir, 'data.db'))).toBe(true);
  });

  it('survives a reader that goes away (demo | head): no stack trace, still cleans up', async () => {
    const cli = startCli(['demo', '--ttl', '200ms', '--pause', '400ms'], sb);
    await cli.waitFor(/zombie worker/, 30_000);
    cli.child.stdout!.destroy();
    const r = await cli.done;
    expect(r.code).toBe(0);
    expect(r.stderr).toBe('');
    expect(demoTempDirs()).toEqual([]);
  });

  it('on SIGINT while A is frozen, kills both workers, removes its temp dir and exits 130', async () => {
    const cli = startCli(['demo', '--ttl', '300ms', '--pause', '30s'], sb);
    await cli.waitFor(/SIGSTOP A/, 60_000);
    const pids = workerPids(cli.stdout);
    expect(pids).toHaveLength(2);
    expect(demoTempDirs()).toHaveLength(1);
    cli.child.kill('SIGINT');
    const r = await cli.done;
    expect(r.code).toBe(130);
    await eventually(() => pids.every((pid) => !alive(pid)), 10_000, 'the workers to be gone');
    expect(demoTempDirs()).toEqual([]);
  });
});

describe('leasehold demo --url', () => {
  it('takes its leases from the coordinator named by --url (tokens continue across runs)', async () => {
    const url = `sqlite:${join(sb.dir, 'shared-locks.db')}`;
    const first = await runCli(['demo', '--ttl', '300ms', '--pause', '700ms', '--url', url], sb, { timeoutMs: 90_000 });
    expect(first.code).toBe(0);
    const second = await runCli(['demo', '--ttl', '300ms', '--pause', '700ms', '--url', url], sb, { timeoutMs: 90_000 });
    expect(second.code).toBe(0);
    expect(sections(second.stdout).fenced).toMatch(/A\s+fence\.write\("doc:42", token 7\) -> REFUSED: StaleTokenError/);
    expect(existsSync(join(sb.dir, 'shared-locks.db'))).toBe(true);
  });

  it('refuses memory: (one process) and malformed URLs with exit 64, creating nothing', async () => {
    for (const url of ['memory:', 'nosuch://x']) {
      const r = await runCli(['demo', '--url', url], sb);
      expect(r.code).toBe(64);
      expect(r.stderr).toMatch(/usage: leasehold demo/);
    }
    expect(demoTempDirs()).toEqual([]);
  });
});

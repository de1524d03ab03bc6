// `leasehold run` as a real process: every exit path, the environment COMMAND sees, lease loss,
// the SIGTERM → SIGKILL grace, and signal forwarding. The lease store is a SQLite file that the
// test also opens, to hold keys itself and to play the operator who deletes a holder's row.
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { createLocks, parseSequencer, type Locks } from '../../src/index.js';
import { sqliteBackend } from '../../src/sqlite/index.js';
import { CHILD, NODE, alive, eventually, killAll, requireBuild, runCli, sandbox, sleep, startCli, type Sandbox } from './helpers.js';

const USAGE_LINE = /^usage: leasehold /m;

let sb: Sandbox;
let locks: Locks | undefined;

/** A Locks instance of the test process on the same lease store as the command. */
function testLocks(): Locks {
  locks ??= createLocks({ backend: sqliteBackend({ path: sb.db }), holderName: 'test-holder' });
  return locks;
}

async function waiters(key: string): Promise<number> {
  return (await testLocks().inspect(key)).find((s) => s.key === key)?.waiters ?? 0;
}

/**
 * The "key deleted by an operator" scenario: remove every holder row of `key` behind the holder's
 * back, and the sessions they are bound to (a session keeps its holders alive: the client learns of
 * the loss when its session's keep-alive finds the session gone).
 */
function deleteHolderRows(key: string): number {
  const db = new Database(sb.db, { timeout: 5_000 });
  try {
    db.prepare('DELETE FROM leasehold_locks_sessions WHERE id IN (SELECT session FROM leasehold_locks WHERE key = ?)').run(key);
    return db.prepare('DELETE FROM leasehold_locks WHERE key = ?').run(key).changes;
  } finally {
    db.close();
  }
}

beforeAll(requireBuild);
beforeEach(() => {
  sb = sandbox();
});
afterEach(async () => {
  killAll();
  await locks?.close();
  locks = undefined;
  sb.cleanup();
});

describe('leasehold run', () => {
  it("passes COMMAND's exit code through (0 and 3) and releases the lease afterwards", async () => {
    const ok = await runCli(['run', 'job', '--', NODE, CHILD, 'exit', '0'], sb);
    expect(ok).toMatchObject({ code: 0, stderr: '' });
    const three = await runCli(['run', 'job', '--', NODE, CHILD, 'exit', '3'], sb);
    expect(three).toMatchObject({ code: 3, stderr: '' });
    // Released, not left to expire: the key is free at once.
    const lease = await testLocks().tryAcquire('job', { ttlMs: 5_000 });
    expect(lease?.token).toBe(3n);
    await lease?.release();
  });

  it('gives COMMAND LEASEHOLD_KEY, LEASEHOLD_TOKEN and LEASEHOLD_SEQUENCER of its lease', async () => {
    const seen = [];
    for (let i = 0; i < 2; i++) {
      const r = await runCli(['run', 'tenant:42 export', '--', NODE, CHILD, 'env'], sb);
      expect(r.code).toBe(0);
      seen.push(JSON.parse(r.stdout) as { key: string; token: string; sequencer: string });
    }
    expect(seen.map((s) => s.token)).toEqual(['1', '2']);
    for (const s of seen) {
      expect(s.key).toBe('tenant:42 export');
      const parsed = parseSequencer(s.sequencer);
      expect(parsed).toMatchObject({ key: 'tenant:42 export', mode: 'exclusive' });
      expect(parsed.token.toString()).toBe(s.token);
    }
  });

  it('exits 75 with exactly one line when the key is busy, without running COMMAND', async () => {
    const held = await testLocks().acquire('job', { ttlMs: 30_000 });
    const marker = join(sb.dir, 'ran');
    const r = await runCli(['run', 'job', '--', NODE, CHILD, 'touch', marker], sb);
    expect(r.code).toBe(75);
    expect(r.errLines).toHaveLength(1);
    expect(r.errLines[0]).toMatch(/^leasehold: job is busy \(held by test-holder/);
    expect(r.stdout).toBe('');
    expect(existsSync(marker)).toBe(false);
    expect(held.held).toBe(true);
    await held.release();
  });

  it('exits 75 with one line when --wait runs out', async () => {
    const held = await testLocks().acquire('job', { ttlMs: 30_000 });
    const r = await runCli(['run', 'job', '--wait', '300ms', '--', NODE, CHILD, 'exit', '0'], sb);
    expect(r.code).toBe(75);
    expect(r.errLines).toHaveLength(1);
    expect(r.errLines[0]).toMatch(/^leasehold: job is busy \(held by test-holder.*waited 300ms$/);
    await held.release();
  });

  it('with --wait, runs COMMAND once the holder releases (with the next token)', async () => {
    const held = await testLocks().acquire('job', { ttlMs: 30_000 });
    const cli = startCli(['run', 'job', '--wait', '20s', '--', NODE, CHILD, 'env'], sb);
    await eventually(async () => (await waiters('job')) > 0, 15_000, 'leasehold run to queue for the key');
    expect(cli.stdout).toBe('');
    await held.release();
    const r = await cli.done;
    expect(r).toMatchObject({ code: 0, stderr: '' });
    expect(JSON.parse(r.stdout)).toMatchObject({ key: 'job', token: '2' });
  });

  it('exits 130 when interrupted while waiting, without running COMMAND', async () => {
    const held = await testLocks().acquire('job', { ttlMs: 30_000 });
    const marker = join(sb.dir, 'ran');
    const cli = startCli(['run', 'job', '--wait', '30s', '--', NODE, CHILD, 'touch', marker], sb);
    await eventually(async () => (await waiters('job')) > 0, 15_000, 'leasehold run to queue for the key');
    cli.child.kill('SIGINT');
    const r = await cli.done;
    expect(r.code).toBe(130);
    expect(r.errLines).toEqual(['leasehold: interrupted by SIGINT while waiting for job']);
    expect(existsSync(marker)).toBe(false);
    await held.release();
  });

  it('shared mode: runs beside another shared holder, is busy beside an exclusive one', async () => {
    const shared = await testLocks().acquire('reports', { ttlMs: 30_000, mode: 'shared' });
    const ok = await runCli(['run', 'reports', '--mode', 'shared', '--', NODE, CHILD, 'exit', '0'], sb);
    expect(ok.code).toBe(0);
    const busy = await runCli(['run', 'reports', '--', NODE, CHILD, 'exit', '0'], sb);
    expect(busy.code).toBe(75);
    await shared.release();
  });

  it('exits 127 with one line when COMMAND is not found', async () => {
    const r = await runCli(['run', 'job', '--', 'leasehold-no-such-command-xyz', 'arg'], sb);
    expect(r.code).toBe(127);
    expect(r.errLines).toEqual(['leasehold: leasehold-no-such-command-xyz: command not found']);
    // The lease taken for it was given back.
    const lease = await testLocks().tryAcquire('job', { ttlMs: 5_000 });
    expect(lease).not.toBeNull();
    await lease?.release();
  });

  it('exits 126 with one line when COMMAND cannot be executed', async () => {
    const r = await runCli(['run', 'job', '--', CHILD], sb); // not executable: no x bit
    expect(r.code).toBe(126);
    expect(r.errLines).toHaveLength(1);
    expect(r.errLines[0]).toMatch(/^leasehold: .*cli-child\.mjs: cannot execute/);
  });

  it('exits 69 with one line when the coordinator cannot be reached', async () => {
    const r = await runCli(['run', 'job', '--url', `sqlite:${join(sb.dir, 'missing-dir', 'sub', 'l.db')}`, '--', NODE, CHILD, 'exit', '0'], sb);
    expect(r.code).toBe(69);
    expect(r.errLines).toHaveLength(1);
    expect(r.errLines[0]).toMatch(/^leasehold: coordinator unavailable: /);
  });

  it.each([
    { why: 'no arguments', args: [] },
    { why: 'missing KEY', args: ['run'] },
    { why: 'missing COMMAND', args: ['run', 'job'] },
    { why: 'nothing after --', args: ['run', 'job', '--'] },
    { why: 'COMMAND without --', args: ['run', 'job', 'true'] },
    { why: 'unknown option', args: ['run', 'job', '--bogus', '--', 'true'] },
    { why: 'bad duration', args: ['run', 'job', '--ttl', '5x', '--', 'true'] },
    { why: 'negative duration', args: ['run', 'job', '--wait', '-1s', '--', 'true'] },
    { why: 'duration overflow', args: ['run', 'job', '--ttl', '999999999h', '--', 'true'] },
    { why: 'ttl below the minimum', args: ['run', 'job', '--ttl', '1ms', '--', 'true'] },
    { why: 'bad URL', args: ['run', 'job', '--url', 'nosuch:scheme', '--', 'true'] },
    { why: 'bad mode', args: ['run', 'job', '--mode', 'both', '--', 'true'] },
    { why: 'empty KEY', args: ['run', '', '--', 'true'] },
    { why: 'unknown subcommand', args: ['frobnicate'] },
    { why: 'ls: unknown option', args: ['ls', '--nope'] },
    { why: 'ls: bad URL', args: ['ls', '--url', 'nosuch:scheme'] },
    { why: 'demo: bad duration', args: ['demo', '--pause', 'soon'] },
    { why: 'demo: pause not longer than ttl', args: ['demo', '--ttl', '1s', '--pause', '1s'] },
  ])('exits 64 with a usage line for bad arguments: $why', async ({ args }) => {
    const r = await runCli(args, sb);
    expect(r.code).toBe(64);
    expect(r.stderr).toMatch(USAGE_LINE);
    expect(r.stderr).not.toMatch(/^\s+at /m); // no stack trace
    expect(r.stdout).toBe('');
  });

  it('prints --help and --version', async () => {
    const help = await runCli(['--help'], sb);
    expect(help.code).toBe(0);
    expect(help.stdout).toMatch(/run .*KEY/);
    const runHelp = await runCli(['run', '--help'], sb);
    expect(runHelp.code).toBe(0);
    expect(runHelp.stdout).toMatch(/--grace/);
    const version = await runCli(['--version'], sb);
    expect(version.code).toBe(0);
    expect(version.stdout.trim()).toMatch(/^\d+\.\d+\.\d+/);
  });

  it('does not read options meant for COMMAND (everything after --)', async () => {
    const r = await runCli(['run', 'job', '--', NODE, CHILD, 'exit', '0', '--help', '--ttl', 'nonsense'], sb);
    expect(r).toMatchObject({ code: 0, stdout: '' });
  });

  it('reports a child killed by a signal as 128 + n', async () => {
    const r = await runCli(['run', 'job', '--', NODE, CHILD, 'kill-self', 'SIGKILL'], sb);
    expect(r.code).toBe(128 + 9);
  });

  it('storage layout: on a lost lease (holder row deleted by an operator), sends COMMAND SIGTERM and exits with its status', async () => {
    const cli = startCli(['run', 'job', '--ttl', '1s', '--', NODE, CHILD, 'wait'], sb);
    await cli.waitFor(/^ready/m);
    expect(deleteHolderRows('job')).toBe(1);
    const r = await cli.done;
    expect(r.stdout).toMatch(/^child got SIGTERM$/m);
    expect(r.code).toBe(128 + 15);
    expect(r.errLines).toHaveLength(1);
    expect(r.errLines[0]).toMatch(
      /^leasehold: lost the lease on job \(token 1\): .*\((not-held|expired|session-lost)\); sending SIGTERM to .*SIGKILL after 10s$/,
    );
  });

  it('sends SIGKILL after --grace to a COMMAND that ignores SIGTERM', async () => {
    const cli = startCli(['run', 'job', '--ttl', '1s', '--grace', '300ms', '--', NODE, CHILD, 'ignore-term'], sb);
    await cli.waitFor(/^ready/m);
    deleteHolderRows('job');
    const r = await cli.done;
    expect(r.stdout).toMatch(/^child ignores SIGTERM$/m);
    expect(r.code).toBe(128 + 9);
    expect(r.errLines).toHaveLength(2);
    expect(r.errLines[0]).toMatch(/^leasehold: lost the lease on job .*SIGKILL after 300ms$/);
    expect(r.errLines[1]).toMatch(/still running 300ms after SIGTERM; sending SIGKILL$/);
  });

  it.each([
    { signal: 'SIGTERM' as const, n: 15 },
    { signal: 'SIGINT' as const, n: 2 },
    { signal: 'SIGHUP' as const, n: 1 },
    { signal: 'SIGQUIT' as const, n: 3 },
    { signal: 'SIGUSR1' as const, n: 10 },
    { signal: 'SIGUSR2' as const, n: 12 },
  ])('forwards $signal to COMMAND, waits for it, then releases', async ({ signal, n }) => {
    const cli = startCli(['run', 'job', '--', NODE, CHILD, 'wait'], sb);
    await cli.waitFor(/^ready/m);
    cli.child.kill(signal);
    const r = await cli.done;
    expect(r.stdout).toMatch(new RegExp(`^child got ${signal}$`, 'm'));
    expect(r.code).toBe(128 + n);
    expect(r.stderr).toBe('');
    const lease = await testLocks().tryAcquire('job', { ttlMs: 5_000 });
    expect(lease).not.toBeNull();
    await lease?.release();
  });

  it('does not exit before COMMAND does: a forwarded SIGTERM that COMMAND ignores keeps leasehold waiting', async () => {
    const cli = startCli(['run', 'job', '--', NODE, CHILD, 'ignore-term'], sb);
    const [, pid] = (await cli.waitFor(/^ready (\d+)$/m)) as unknown as [string, string];
    cli.child.kill('SIGTERM');
    await cli.waitFor(/^child ignores SIGTERM$/m);
    await sleep(300);
    expect(alive(cli.pid)).toBe(true);
    process.kill(Number(pid), 'SIGKILL');
    const r = await cli.done;
    expect(r.code).toBe(128 + 9);
  });
});

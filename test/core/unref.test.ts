/**
 * leasehold's timers (renewal, validity, the SQLite change poll, idle sessions) never keep a
 * process alive: a script that takes leases and never releases them exits by itself with code 0.
 * The control keeps one timer of its own and must still be running, so the check can fail.
 */
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { tempDir } from '../helpers/env.js';

const script = new URL('../fixtures/hold-and-exit.mjs', import.meta.url).pathname;

/**
 * Runs the script; resolves with its exit code and output, or with `code: 'running'` if it is
 * still alive `boundMs` after it printed its leases (then kills it). Start-up time is not counted.
 */
function runFor(args: string[], boundMs: number): Promise<{ code: number | null | 'running'; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [script, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    let timer: ReturnType<typeof setTimeout> | undefined;
    child.stdout.on('data', (c: Buffer) => {
      stdout += c.toString();
      timer ??= setTimeout(() => {
        child.removeAllListeners('exit');
        child.kill('SIGKILL');
        resolve({ code: 'running', stdout, stderr });
      }, boundMs);
    });
    child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    child.on('error', reject);
    child.on('exit', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

describe("timers are unref'd", () => {
  const dir = tempDir();
  afterAll(() => dir.cleanup());

  it('a process holding leases on memory and SQLite, never released, exits by itself with code 0', async () => {
    const r = await runFor([join(dir.path, 'exit.db')], 10_000);
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    const out = JSON.parse(r.stdout) as { tokens: string[]; busy: string };
    expect(out.tokens).toHaveLength(3);
    expect(out.busy).toBe('ACQUIRE_TIMEOUT');
  });

  it('control: the same script with one timer of its own is still running', async () => {
    const r = await runFor([join(dir.path, 'control.db'), 'keep-alive'], 3_000);
    expect(r.code).toBe('running');
  });
});

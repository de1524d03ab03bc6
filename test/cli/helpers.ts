// Runs the built `leasehold` command (dist/cli/main.js) as a real process, in a sandbox: a temp
// directory as cwd and TMPDIR, and LEASEHOLD_URL=sqlite:<dir>/l.db. Every process started here is
// killed by `killAll` (call it in afterEach); sandboxes are removed by `cleanup`.
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const ROOT = fileURLToPath(new URL('../../', import.meta.url));
export const MAIN = join(ROOT, 'dist/cli/main.js');
/** The COMMAND the run tests use; see its header for the modes. */
export const CHILD = join(ROOT, 'test/fixtures/cli-child.mjs');
export const NODE = process.execPath;

export function requireBuild(): void {
  if (!existsSync(MAIN)) throw new Error(`${MAIN} is missing: run \`npm run build\` before these tests`);
}

export interface Sandbox {
  dir: string;
  /** The SQLite lease store that LEASEHOLD_URL points at. */
  db: string;
  env: NodeJS.ProcessEnv;
  cleanup(): void;
}

export function sandbox(): Sandbox {
  const dir = mkdtempSync(join(tmpdir(), 'leasehold-cli-test-'));
  const db = join(dir, 'l.db');
  const env: NodeJS.ProcessEnv = { ...process.env, LEASEHOLD_URL: `sqlite:${db}`, TMPDIR: dir };
  delete env.LEASEHOLD_DEMO_MUTANT;
  delete env.LEASEHOLD_DEBUG;
  return { dir, db, env, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

export interface Finished {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
  /** stderr split into lines, without the final empty one. */
  errLines: string[];
}

const live = new Set<ChildProcess>();

/** A running `leasehold` process with its output so far. */
export class Cli {
  readonly child: ChildProcess;
  stdout = '';
  stderr = '';
  readonly done: Promise<Finished>;
  readonly #waiters = new Set<() => void>();

  constructor(args: readonly string[], sb: Sandbox, env?: NodeJS.ProcessEnv) {
    this.child = spawn(NODE, [MAIN, ...args], { cwd: sb.dir, env: { ...sb.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    live.add(this.child);
    this.child.stdout!.setEncoding('utf8').on('data', (d: string) => {
      this.stdout += d;
      this.#wake();
    });
    this.child.stderr!.setEncoding('utf8').on('data', (d: string) => {
      this.stderr += d;
      this.#wake();
    });
    this.done = new Promise((resolve) => {
      this.child.on('close', (code, signal) => {
        live.delete(this.child);
        this.#wake();
        resolve({ code, signal, stdout: this.stdout, stderr: this.stderr, errLines: this.stderr.split('\n').filter((l) => l !== '') });
      });
    });
  }

  get pid(): number {
    return this.child.pid!;
  }

  /** Resolves once stdout (or stderr) matches; rejects after `timeoutMs` or if the process ends first. */
  async waitFor(pattern: RegExp, timeoutMs = 20_000, stream: 'stdout' | 'stderr' = 'stdout'): Promise<RegExpMatchArray> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const m = this[stream].match(pattern);
      if (m) return m;
      if (this.child.exitCode !== null || this.child.signalCode !== null) {
        throw new Error(`leasehold exited before ${stream} matched ${pattern}\nstdout: ${this.stdout}\nstderr: ${this.stderr}`);
      }
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`timed out waiting for ${pattern} on ${stream}\nstdout: ${this.stdout}\nstderr: ${this.stderr}`);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(done, Math.min(left, 200));
        const waiters = this.#waiters;
        function done(): void {
          clearTimeout(timer);
          waiters.delete(done);
          resolve();
        }
        waiters.add(done);
      });
    }
  }

  #wake(): void {
    for (const w of [...this.#waiters]) w();
  }
}

export function startCli(args: readonly string[], sb: Sandbox, env?: NodeJS.ProcessEnv): Cli {
  return new Cli(args, sb, env);
}

/** Runs `leasehold args…` to completion (killed after `timeoutMs`). */
export async function runCli(args: readonly string[], sb: Sandbox, options?: { env?: NodeJS.ProcessEnv; timeoutMs?: number }): Promise<Finished> {
  const cli = new Cli(args, sb, options?.env);
  const timer = setTimeout(() => cli.child.kill('SIGKILL'), options?.timeoutMs ?? 25_000);
  try {
    return await cli.done;
  } finally {
    clearTimeout(timer);
  }
}

/** Kills every leasehold process a test started and left running. */
export function killAll(): void {
  for (const child of live) child.kill('SIGKILL');
  live.clear();
}

/** True while a process with this pid exists (a zombie not yet reaped by its parent counts as gone on Linux only after reaping). */
export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** Polls `check` until it returns true or `timeoutMs` passes. */
export async function eventually(check: () => boolean | Promise<boolean>, timeoutMs = 10_000, what = 'condition'): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(25);
  }
}

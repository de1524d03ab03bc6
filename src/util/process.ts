/**
 * Process helpers shared by the commands that run worker processes (`leasehold demo`, and
 * `leasehold verify` in src/verify): one wrapper around a forked worker, waiting for SIGSTOP to
 * take hold, and the shell's conventions for signals.
 */
import { fork, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { constants } from 'node:os';
import type { Writable } from 'node:stream';
import { sleep } from './sleep.js';

/** A process killed by signal n ends, for the shell, with status 128 + n. */
export const SIGNAL_EXIT_BASE = 128;

/** The shell's exit status for a process killed by `signal` (128 + its number; SIGTERM → 143). */
export function signalExitCode(signal: NodeJS.Signals): number {
  return SIGNAL_EXIT_BASE + (constants.signals[signal] ?? 0);
}

/** The signals that ask a command to stop: Ctrl-C, `kill`, a closed terminal. */
export const STOP_SIGNALS: readonly NodeJS.Signals[] = Object.freeze(['SIGINT', 'SIGTERM', 'SIGHUP']);

/** Calls `handler` on each of {@link STOP_SIGNALS} until the returned function is called. */
export function onStopSignals(handler: (signal: NodeJS.Signals) => void): () => void {
  for (const s of STOP_SIGNALS) process.on(s, handler);
  return () => {
    for (const s of STOP_SIGNALS) process.off(s, handler);
  };
}

/** How a process ended: its exit code, or the signal that killed it. */
export interface ChildExit {
  code: number | null;
  signal: NodeJS.Signals | null;
}

export interface ChildWorkerOptions<Event> {
  /** Shown in messages about the process, e.g. `worker A`. */
  name: string;
  /** Arguments after the script's path. */
  args: readonly string[];
  /** The worker's stdout: the parent's, or nowhere. */
  stdout: 'inherit' | 'ignore';
  /** The worker's stderr: the parent's, or kept in memory (its last 2,000 characters: {@link ChildWorker.stderr}). */
  stderr: 'inherit' | 'keep';
  /**
   * A pipe from parent to worker at fd 4, after the IPC channel at fd 3. A byte written there
   * waits in the pipe, so a worker reads it as soon as it runs, even one stopped when it was sent.
   * @default false
   */
  pipe?: boolean;
  /** Each IPC message from the worker, in order. */
  onMessage?: (message: Event) => void;
  /** Once, when the process has exited (after its last message). */
  onExit?: (exit: ChildExit) => void;
}

/** Characters of a kept stderr that are remembered. */
const STDERR_TAIL = 2_000;

/**
 * A worker process forked from a script of this package, talking over IPC: commands go in with
 * `send`, events come back to `onMessage`. Nothing it does throws: sending to, signalling or
 * killing a process that is gone does nothing, and a failed start ends in `exited` like any exit.
 */
export class ChildWorker<Command extends object, Event> {
  readonly name: string;
  /** Resolves when the process has exited. */
  readonly exited: Promise<ChildExit>;
  readonly #child: ChildProcess;
  readonly #wakers = new Set<() => void>();
  #exit: ChildExit | undefined;
  #stderr = '';

  constructor(path: string, options: ChildWorkerOptions<Event>) {
    this.name = options.name;
    const stderr = options.stderr === 'keep' ? 'pipe' : 'inherit';
    this.#child = fork(path, [...options.args], {
      stdio: ['ignore', options.stdout, stderr, 'ipc', ...(options.pipe ? ['pipe' as const] : [])],
      execArgv: [],
    });
    if (options.stderr === 'keep') {
      this.#child.stderr!.setEncoding('utf8').on('data', (d: string) => {
        this.#stderr = (this.#stderr + d).slice(-STDERR_TAIL);
      });
    }
    this.#child.on('message', (message: Event) => {
      options.onMessage?.(message);
      this.#wake();
    });
    this.#child.on('error', () => {
      // A failed kill or send; a failed start ends in 'exit' too. Nothing to add here.
    });
    // The extra pipe must not crash the parent if the worker is already gone.
    this.#child.stdio[4]?.on('error', () => {});
    this.exited = new Promise((resolve) => {
      this.#child.on('exit', (code, signal) => {
        this.#exit = { code, signal };
        options.onExit?.(this.#exit);
        this.#wake();
        resolve(this.#exit);
      });
    });
  }

  get pid(): number | undefined {
    return this.#child.pid;
  }

  get running(): boolean {
    return this.#child.exitCode === null && this.#child.signalCode === null;
  }

  /** How the process ended, once it has. */
  get exit(): ChildExit | undefined {
    return this.#exit;
  }

  /** The end of what the worker wrote to stderr (`stderr: 'keep'`), trimmed; empty otherwise. */
  get stderr(): string {
    return this.#stderr.trim();
  }

  send(command: Command): void {
    if (this.running && this.#child.connected) this.#child.send(command);
  }

  /** Writes to the pipe at fd 4 (`pipe: true`). */
  write(data: string): void {
    (this.#child.stdio[4] as Writable | null | undefined)?.write(data);
  }

  signal(signal: NodeJS.Signals): void {
    if (this.running) this.#child.kill(signal);
  }

  /** SIGKILL, which ends a stopped (SIGSTOPped) process too, at once: no SIGCONT needed. */
  kill(): void {
    if (this.running) this.#child.kill('SIGKILL');
  }

  /** Resolves at the next message or at the exit, or after `timeoutMs`, whichever comes first. */
  changed(timeoutMs: number): Promise<void> {
    if (this.#exit) return Promise.resolve();
    return new Promise((resolve) => {
      const timer = setTimeout(done, timeoutMs);
      const wakers = this.#wakers;
      function done(): void {
        clearTimeout(timer);
        wakers.delete(done);
        resolve();
      }
      wakers.add(done);
    });
  }

  /** Waits up to `timeoutMs` for the process to exit, then kills it if it is still running. */
  async stop(timeoutMs: number): Promise<void> {
    const deadline = performance.now() + timeoutMs;
    while (!this.#exit && performance.now() < deadline) await this.changed(deadline - performance.now());
    this.kill();
  }

  #wake(): void {
    for (const wake of [...this.#wakers]) wake();
  }
}

/**
 * Waits until the kernel reports the process stopped (state T in /proc/PID/stat) after a SIGSTOP,
 * so that nothing sent to it afterwards can be read before the freeze. Without /proc (not Linux),
 * waits a moment instead. Rejects when it is not stopped within 5 s.
 */
export async function waitUntilStopped(target: { readonly pid: number | undefined; readonly name: string }): Promise<void> {
  const deadline = performance.now() + 5_000;
  for (;;) {
    let state: string | undefined;
    try {
      const stat = readFileSync(`/proc/${target.pid}/stat`, 'utf8');
      state = stat.slice(stat.lastIndexOf(')') + 2).charAt(0);
    } catch {
      await sleep(50);
      return;
    }
    if (state === 'T' || state === 't') return;
    if (performance.now() > deadline) throw new Error(`${target.name} did not stop after SIGSTOP (state ${state})`);
    await sleep(1);
  }
}

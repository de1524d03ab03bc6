import { spawn, type ChildProcess } from 'node:child_process';
import { AcquireTimeoutError, describeLoss, LeaseLostError } from '../core/errors.js';
import { onLoss, type Lease } from '../core/lease.js';
import type { Locks } from '../core/locks.js';
import type { LockMode } from '../core/validate.js';
import { createLocks } from '../index.js';
import { formatDuration } from '../util/duration.js';
import { signalExitCode } from '../util/process.js';
import { sleep } from '../util/sleep.js';
import { CliExit, EXIT, oneLine, shown } from './exit.js';

/** Signals that `leasehold run` passes on to COMMAND instead of dying of them. */
export const FORWARDED_SIGNALS: readonly NodeJS.Signals[] = Object.freeze(['SIGINT', 'SIGTERM', 'SIGHUP', 'SIGQUIT', 'SIGUSR1', 'SIGUSR2']);

export interface RunOptions {
  key: string;
  /** The program to run (looked up in PATH, never through a shell) and its arguments. */
  command: string;
  args: readonly string[];
  /** Lease ttl; renewed at ttl/3 while COMMAND runs. */
  ttlMs: number;
  /** 0: one attempt, never wait (tryAcquire). Otherwise how long to wait for a busy key (`Infinity` allowed). */
  waitMs: number;
  /** After a lost lease: time between SIGTERM and SIGKILL. 0 sends SIGKILL at once. */
  graceMs: number;
  mode: LockMode;
  /** Coordinator URL; undefined means LEASEHOLD_URL, else the embedded SQLite store. */
  url: string | undefined;
  /** A semaphore permit: at most `limit` holders of the key at once (mode is then ignored). Undefined: a plain lock. */
  limit?: number | undefined;
  /** The key stays held until this long after the grant even if COMMAND ends sooner (ShedLock's lockAtLeastFor). 0: released at once. */
  minHoldMs?: number | undefined;
  /** The grant's public label (shown by ls and the dashboard). Undefined: the client's holder name. */
  label?: string | undefined;
}

/** How COMMAND ended: an exit (code or signal) or a failure to start it at all. */
type ChildOutcome = { code: number | null; signal: NodeJS.Signals | null } | { error: NodeJS.ErrnoException };

/**
 * `leasehold run`: acquires the lease, runs COMMAND while holding it (renewed in the background),
 * releases it when COMMAND exits, and resolves with the exit code to use:
 *
 * - COMMAND's own exit code; 128 + n when it was killed by signal n;
 * - 75 when the key is busy (at once with `waitMs` 0, after `waitMs` otherwise);
 * - 127 when COMMAND is not found, 126 when it cannot be executed;
 * - 128 + n when leasehold received signal n before COMMAND started.
 *
 * With `limit`, the lease is one permit of a semaphore (Consul's `lock -n`): at most `limit`
 * instances run COMMAND at once, each with a token of its own. With `minHoldMs`, a COMMAND that ends
 * sooner leaves the key held until `minHoldMs` after the grant (renewal stops, it then expires), so
 * the same job fired a little later elsewhere skips; when more than one ttl of that hold is left,
 * leasehold keeps the lease (renewed) until only one ttl is left, since nobody renews it after exit.
 *
 * COMMAND gets LEASEHOLD_KEY, LEASEHOLD_TOKEN and LEASEHOLD_SEQUENCER, so it can hand the fencing
 * token to the resources it writes. When the lease is lost (`lease.signal` aborts: a renewal found
 * the key gone, or local validity ran out), COMMAND gets SIGTERM, then SIGKILL after `graceMs`.
 * The exit code is still COMMAND's own. Signals sent to leasehold (see {@link FORWARDED_SIGNALS})
 * are passed on to COMMAND; leasehold exits only after COMMAND has.
 *
 * Not guaranteed: a lease is not a mutex. COMMAND may still be running, and writing, for up to
 * `graceMs` after the coordinator has handed the key to someone else, and a frozen machine
 * notices nothing at all until it runs again; resources COMMAND writes should check
 * LEASEHOLD_TOKEN with a fence. Only COMMAND itself is signalled, not processes it started in
 * the background. If leasehold itself is killed with SIGKILL, COMMAND keeps running without the
 * lease (nothing can forward a SIGKILL); the `exit` handler covers every other way out. COMMAND
 * stays in leasehold's process group (so it keeps the terminal), which means a Ctrl-C typed at a
 * terminal reaches it twice: once from the terminal, once forwarded.
 *
 * Rejects with `CliExit`, or with the library's errors (`BackendUnavailableError` when the
 * coordinator is unreachable, `InvalidArgumentError` for a bad key, ttl or URL).
 */
export async function runCommand(o: RunOptions, warn: (line: string) => void): Promise<number> {
  // A malformed URL throws here, before anything else happens.
  const locks = createLocks({ url: o.url });
  let child: ChildProcess | undefined;
  let childExited = false;
  let received: NodeJS.Signals | undefined;
  const beforeStart = new AbortController();

  const onSignal = (signal: NodeJS.Signals): void => {
    if (child && !childExited) {
      child.kill(signal);
      return;
    }
    if (!child) {
      // Still acquiring: stop waiting; the lease (if one arrives) is released on the way out.
      received ??= signal;
      beforeStart.abort(new CliExit(signalExitCode(signal), `interrupted by ${signal} while waiting for ${shown(o.key)}`));
      return;
    }
    // COMMAND is done and we are releasing (time-boxed anyway): a signal now means "stop waiting".
    process.exit(signalExitCode(signal));
  };
  for (const signal of FORWARDED_SIGNALS) process.on(signal, onSignal);

  try {
    const lease = await obtain(locks, o, beforeStart.signal);
    // Read right after the grant: core's minimum hold counts from a moment a little earlier, never later.
    const grantedAt = performance.now();
    try {
      if (received) throw new CliExit(signalExitCode(received), `interrupted by ${received} before ${shown(o.command)} started`);
      if (lease.signal.aborted) throw new CliExit(EXIT.TEMPFAIL, `${lossLine(lease)} before ${shown(o.command)} started`);

      const started = startChild(o.command, o.args, {
        ...process.env,
        LEASEHOLD_KEY: o.key,
        LEASEHOLD_TOKEN: lease.token.toString(),
        LEASEHOLD_SEQUENCER: lease.sequencer,
      });
      child = started.child;
      const running = started.child;
      const killOnExit = (): void => {
        if (running.exitCode === null && running.signalCode === null) running.kill('SIGKILL');
      };
      process.on('exit', killOnExit);

      let graceTimer: ReturnType<typeof setTimeout> | undefined;
      const onLost = (): void => {
        if (childExited) return;
        const who = `${shown(o.command)} (pid ${running.pid ?? '?'})`;
        if (o.graceMs === 0) {
          warn(`${lossLine(lease)}; sending SIGKILL to ${who}`);
          running.kill('SIGKILL');
          return;
        }
        warn(`${lossLine(lease)}; sending SIGTERM to ${who}, SIGKILL after ${formatDuration(o.graceMs)}`);
        running.kill('SIGTERM');
        graceTimer = setTimeout(() => {
          if (childExited) return;
          warn(`${who} still running ${formatDuration(o.graceMs)} after SIGTERM; sending SIGKILL`);
          running.kill('SIGKILL');
        }, o.graceMs);
      };
      // onLoss reads lease.signal once: a loss that the read itself makes official (validity ran out
      // while COMMAND was being spawned, or during a freeze) still reaches onLost.
      const unwatch = onLoss(lease, onLost);

      const outcome = await started.outcome;
      childExited = true;
      unwatch();
      if (graceTimer) clearTimeout(graceTimer);
      process.off('exit', killOnExit);

      if ('error' in outcome) {
        const e = outcome.error;
        if (e.code === 'ENOENT') throw new CliExit(EXIT.NOT_FOUND, `${shown(o.command)}: command not found`);
        throw new CliExit(EXIT.CANNOT_EXECUTE, `${shown(o.command)}: cannot execute: ${oneLine(e.message)}`);
      }
      await holdOn(lease, grantedAt, o);
      return outcome.code ?? signalExitCode(outcome.signal ?? 'SIGKILL');
    } finally {
      // After a loss or a second call this resolves and does nothing; a failure only costs the ttl.
      await lease.release().catch((error: unknown) => {
        warn(
          `could not release ${shown(o.key)} (${oneLine(String((error as Error)?.message ?? error))}); it frees itself when its ttl (${formatDuration(o.ttlMs)}) runs out`,
        );
      });
    }
  } finally {
    for (const signal of FORWARDED_SIGNALS) process.off(signal, onSignal);
    await locks.close().catch(() => {});
  }
}

/**
 * A minimum hold longer than one ttl: nobody renews the lease once this process has exited, so it
 * stays (the lease renewed in the background) until only one ttl of the hold is left; the release
 * then keeps the key for exactly that rest. Returns at once when the lease is lost meanwhile.
 */
async function holdOn(lease: Lease, grantedAt: number, o: RunOptions): Promise<void> {
  const waitMs = grantedAt + (o.minHoldMs ?? 0) - lease.ttlMs - performance.now();
  if (waitMs <= 0 || !lease.held) return;
  await sleep(waitMs, { signal: lease.signal });
}

/** Acquires per `waitMs`: one attempt when 0 (the cron case), else waits; busy becomes exit 75. */
async function obtain(locks: Locks, o: RunOptions, signal: AbortSignal): Promise<Lease> {
  const options = {
    ttlMs: o.ttlMs,
    ...(o.limit === undefined ? { mode: o.mode } : { limit: o.limit }),
    ...(o.minHoldMs ? { minHoldMs: o.minHoldMs } : {}),
    ...(o.label === undefined ? {} : { label: o.label }),
  };
  if (o.waitMs === 0) {
    const lease = await locks.tryAcquire(o.key, options);
    if (lease) return lease;
    throw new CliExit(EXIT.TEMPFAIL, `${shown(o.key)} is busy (${await whoHolds(locks, o.key)})`);
  }
  try {
    return await keepingAlive(locks.acquire(o.key, { ...options, waitMs: o.waitMs, signal }));
  } catch (error) {
    if (error instanceof CliExit) throw error;
    if (error instanceof AcquireTimeoutError) {
      const who = error.holder === undefined ? await whoHolds(locks, o.key) : `held by ${error.holder}`;
      throw new CliExit(EXIT.TEMPFAIL, `${shown(o.key)} is busy (${who}); waited ${formatDuration(o.waitMs)}`);
    }
    throw error;
  }
}

/**
 * Keeps the process alive until `promise` settles. Core's waiting pauses keep the process alive
 * themselves (since 077b851; before that Node exited with code 0 in the middle of `--wait`), but
 * a backend may wait on unref'd handles of its own (SQLite polls for changes on an unref'd
 * timer), and exiting mid-wait would report success for a command that never ran.
 */
async function keepingAlive<T>(promise: Promise<T>): Promise<T> {
  const timer = setInterval(() => {}, 60_000);
  try {
    return await promise;
  } finally {
    clearInterval(timer);
  }
}

/** Names the current holder(s) for the busy message; best effort (the holder may just have left). */
async function whoHolds(locks: Locks, key: string): Promise<string> {
  try {
    const state = (await locks.inspect(key)).find((s) => s.key === key);
    if (state && state.holders.length > 0) {
      const holders = state.holders.map((h) => `${h.holder}, token ${h.token}`).join('; ');
      return state.limit === undefined ? `held by ${holders}` : `all ${state.limit} permits held: by ${holders}`;
    }
    if (state && state.lockDelayRemainingMs > 0) {
      return `in lock-delay for another ${formatDuration(state.lockDelayRemainingMs)} after a lease expired unreleased`;
    }
    if (state && state.waiters > 0) return `held by nobody, but ${state.waiters} waiting in line`;
  } catch {
    // Only a diagnostic: the busy answer itself stands.
  }
  return 'held by another holder that may have just released it';
}

function lossLine(lease: Lease): string {
  const reason = lease.signal.reason;
  if (reason instanceof LeaseLostError) {
    return `lost the lease on ${shown(lease.key)} (token ${lease.token}): ${describeLoss(reason.reason)} (${reason.reason})`;
  }
  return `lost the lease on ${shown(lease.key)} (token ${lease.token}): ${oneLine(String(reason))}`;
}

/** Spawns COMMAND without a shell, stdio inherited. A failure to start arrives as `{ error }`. */
function startChild(command: string, args: readonly string[], env: NodeJS.ProcessEnv): { child: ChildProcess; outcome: Promise<ChildOutcome> } {
  let child: ChildProcess;
  try {
    child = spawn(command, [...args], { stdio: 'inherit', env });
  } catch (error) {
    // Synchronous refusals (a NUL byte in an argument, ...): nothing was started.
    throw new CliExit(EXIT.CANNOT_EXECUTE, `${shown(command)}: cannot execute: ${oneLine((error as Error).message)}`);
  }
  const outcome = new Promise<ChildOutcome>((resolve) => {
    let spawned = false;
    child.once('spawn', () => {
      spawned = true;
    });
    // After a successful spawn, 'error' can only be a failed kill(); the 'exit' event still comes.
    child.on('error', (error: NodeJS.ErrnoException) => {
      if (!spawned) resolve({ error });
    });
    child.once('exit', (code, signal) => resolve({ code, signal }));
  });
  return { child, outcome };
}

// Runs `leasehold verify` as a real process (the built dist/), in a CLI sandbox, and makes sure
// nothing it started outlives a test. `leftovers` finds a run's processes in /proc: by a marker in
// their environment (the command and its workers inherit it), or by a working directory inside the
// sandbox (the servers verify starts run in its run directory; redis-server and postgres rewrite
// their environment area for their process titles, so the marker cannot be read there).
import { randomBytes } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { join } from 'node:path';
import { expect } from 'vitest';
import { RESUME_BOUND_MS } from '../../src/verify/checker.js';
import { MUTANT_ENV, type HistoryEvent } from '../../src/verify/protocol.js';
import type { PlannedFault } from '../../src/verify/schedule.js';
import { runCli, type Finished, type Sandbox } from '../cli/helpers.js';
import { checkXml } from './xml.js';

const MARKER = 'LEASEHOLD_VERIFY_TEST_RUN';

export interface VerifyRun extends Finished {
  marker: string;
  /** `check -> PASS|FAIL` from the summary table. */
  verdicts: Record<string, string>;
  /** The `schedule` lines printed at the start. */
  schedule: string[];
  /** `faults` line of the table. */
  faults: string;
}

/** Runs `leasehold verify …args`; generous timeout (a loaded 2-core machine). The I6 mutant is off unless `env` sets it. */
export async function verify(args: readonly string[], sb: Sandbox, timeoutMs = 120_000, env: NodeJS.ProcessEnv = {}): Promise<VerifyRun> {
  const marker = randomBytes(6).toString('hex');
  const r = await runCli(['verify', ...args], sb, { env: { [MUTANT_ENV]: '', ...env, [MARKER]: marker }, timeoutMs });
  const verdicts: Record<string, string> = {};
  for (const m of r.stdout.matchAll(/^ {2}(grants|permits|fence|no lost update|I6|run)\b.*?\s(PASS|FAIL)\s/gm)) verdicts[m[1]!] = m[2]!;
  const lines = r.stdout.split('\n');
  const faults = lines.find((l) => l.startsWith('  faults')) ?? '';
  return { ...r, marker, verdicts, schedule: scheduleLines(lines), faults };
}

/** The `schedule` line and its continuation lines. */
function scheduleLines(lines: string[]): string[] {
  const first = lines.findIndex((l) => l.startsWith('  schedule'));
  if (first < 0) return [];
  const out = [lines[first]!];
  for (let i = first + 1; i < lines.length && /^ {15}\S/.test(lines[i]!); i++) out.push(lines[i]!);
  return out;
}

/** Processes still alive that a run started: marked with `marker`, or working inside `dir`. */
export function leftovers(marker: string, dir: string): number[] {
  const found: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry) || Number(entry) === process.pid) continue;
    try {
      const env = readFileSync(`/proc/${entry}/environ`, 'latin1');
      if (env.includes(`${MARKER}=${marker}`)) found.push(Number(entry));
      else if (`${readlinkSync(`/proc/${entry}/cwd`)}/`.startsWith(`${dir}/`)) found.push(Number(entry));
    } catch {
      // gone, or not ours to read
    }
  }
  return found;
}

/** Kills what a run left behind (SIGCONT first: a frozen process dies only once it runs). */
export function killLeftovers(marker: string, dir: string): void {
  for (const pid of leftovers(marker, dir)) {
    try {
      process.kill(pid, 'SIGCONT');
      process.kill(pid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
}

/** A line of the summary table for a nemesis: `pause 3`, `crash n/a (…)`. */
export function faultCount(run: VerifyRun, kind: string): number | 'n/a' {
  const m = new RegExp(`\\b${kind} (n/a|\\d+)`).exec(run.faults);
  expect(m, `${kind} in: ${run.faults}`).not.toBeNull();
  return m![1] === 'n/a' ? 'n/a' : Number(m![1]);
}

/** Asserts a passing run: exit 0, every check PASS, nothing left running, no temp dirs left. */
export function expectPass(run: VerifyRun, sb: Sandbox): void {
  const context = `stdout:\n${run.stdout}\nstderr:\n${run.stderr}`;
  expect(run.code, context).toBe(0);
  expect(run.verdicts, context).toEqual({ grants: 'PASS', fence: 'PASS', 'no lost update': 'PASS', I6: 'PASS' });
  expect(run.stdout).toContain('verdict: PASS (every check passed)');
  expectClean(run, sb);
}

export function expectClean(run: VerifyRun, sb: Sandbox): void {
  expect(leftovers(run.marker, sb.dir), 'processes left running').toEqual([]);
  expect(
    readdirSync(sb.dir).filter((n) => n.startsWith('leasehold-verify-')),
    'temporary directories left',
  ).toEqual([]);
}

/** Reads a report directory: the history lines, and the SVG checked for well-formedness and lanes. */
export function readReport(dir: string, workers: number): { header: Record<string, unknown>; events: HistoryEvent[]; tail: Record<string, unknown>[] } {
  const lines = readFileSync(join(dir, 'history.jsonl'), 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as Record<string, unknown>);
  expect(lines[0]!.type).toBe('run');
  const tail = lines.filter((l) => l.type === 'final' || l.type === 'check');
  const events = lines.slice(1).filter((l) => l.type !== 'final' && l.type !== 'check') as unknown as HistoryEvent[];
  expect(existsSync(join(dir, 'timeline.svg'))).toBe(true);
  const { problems, elements } = checkXml(readFileSync(join(dir, 'timeline.svg'), 'utf8'));
  expect(problems).toEqual([]);
  const lanes = elements.filter((e) => e.name === 'g' && e.attributes.class === 'lane').map((e) => e.attributes['data-worker']);
  expect(lanes).toEqual(Array.from({ length: workers }, (_, i) => String(i + 1)));
  return { header: lines[0]!, events, tail };
}

type Of<T extends HistoryEvent['type']> = Extract<HistoryEvent, { type: T }>;
const is =
  <T extends HistoryEvent['type']>(type: T) =>
  (e: HistoryEvent): e is Of<T> =>
    e.type === type;

/** The harness stamps `resume` right after sending SIGCONT; on 2 cores the worker can run (and stamp) first. */
const RESUME_STAMP_SLACK_MS = 50;

/**
 * What the faults did, read from a history (events in time order), beyond being counted:
 * - `delayedRefused`: writes a worker sent while its requests were held that the fence refused
 *   once they were delivered (someone with a newer token had written meanwhile);
 * - `lostAfterResume`: leases whose validity ran out while their worker was frozen, signalled lost
 *   (by a process that had not run since: `running: false`) right after SIGCONT;
 * - `skewed`: the workers that applied a clock rate other than 1.
 */
export function faultEffects(events: readonly HistoryEvent[]): { delayedRefused: string[]; lostAfterResume: string[]; skewed: number[] } {
  const delayedRefused: string[] = [];
  const lostAfterResume: string[] = [];
  for (const [i, e] of events.entries()) {
    if (e.type === 'delay') {
      const end = events
        .slice(i)
        .filter(is('delay-end'))
        .find((x) => x.w === e.w);
      if (!end) continue;
      for (const write of events.filter(is('write'))) {
        if (write.w !== e.w || write.t < e.t || write.t > end.t) continue;
        if (events.filter(is('refused')).some((x) => x.op === write.op && x.t >= end.t)) delayedRefused.push(write.op);
      }
    }
    if (e.type === 'pause') {
      const resume = events
        .slice(i)
        .filter(is('resume'))
        .find((x) => x.w === e.w);
      if (!resume) continue;
      const lost = events
        .filter(is('lost'))
        .find(
          (x) =>
            x.w === e.w &&
            !x.running &&
            x.due !== null &&
            x.due >= e.t &&
            x.due <= resume.t &&
            x.t >= resume.t - RESUME_STAMP_SLACK_MS &&
            x.t <= resume.t + RESUME_BOUND_MS,
        );
      if (lost) lostAfterResume.push(`w${lost.w} token ${lost.token}`);
    }
  }
  const skewed = events
    .filter(is('clock'))
    .filter((e) => e.rate !== 1)
    .map((e) => e.w);
  return { delayedRefused, lostAfterResume, skewed };
}

/** The I6 check's summary from a report's tail. */
export function i6Summary(tail: Record<string, unknown>[]): string {
  const line = tail.find((l) => l.type === 'check' && l.id === 'i6');
  expect(line, 'the i6 check line').toBeDefined();
  return String(line!.summary);
}

/**
 * Faults of a schedule whose effect is forced, not left to chance (each judged against the crashes
 * and pauses planned near it):
 * - `delay`: one of at least 1.8 ttl, with no crash within a ttl of it (a crash drops the held
 *   connection) and no pause planned from 3 ttl before it to 1.3 ttl into it (the pause could
 *   freeze the next holder). The holder's lease expires after 1 ttl, the next holder writes at about
 *   1.2 ttl, the held write arrives after 1.8 ttl: the fence must refuse it.
 * - `pause`: one with no crash within a ttl of it: the lease runs out during the freeze (2–3.5 ttl),
 *   another worker takes the key at about 1 ttl, and the frozen one learns it only after SIGCONT.
 */
export function forcedEffects(faults: readonly PlannedFault[], ttlMs: number): { delay: boolean; pause: boolean } {
  const near = (kind: string, from: number, to: number): boolean =>
    faults.some((f) => f.kind === kind && f.at < to && f.at + (kind === 'crash' ? f.durationMs + ttlMs : 0) > from);
  return {
    delay: faults.some(
      (d) =>
        d.kind === 'delay' &&
        d.durationMs >= 1.8 * ttlMs &&
        !near('crash', d.at - ttlMs, d.at + d.durationMs + ttlMs) &&
        !near('pause', d.at - 3 * ttlMs, d.at + 1.3 * ttlMs),
    ),
    pause: faults.some((p) => p.kind === 'pause' && !near('crash', p.at - ttlMs, p.at + p.durationMs + ttlMs)),
  };
}

/**
 * What `leasehold verify` shows and keeps: the summary table on the terminal and, with
 * `--report DIR`, `DIR/history.jsonl` and `DIR/timeline.svg`.
 *
 * history.jsonl, one JSON object per line:
 * - first a `{"type":"run", …}` line: options, seed, run id, the planned schedule, nemeses;
 * - then every history event in time order (see protocol.ts: `t` is ms since the start on this
 *   machine's CLOCK_MONOTONIC; `w` the worker);
 * - then `{"type":"final", …}` (the resource's counter, log in commit order and fence mark) and one
 *   `{"type":"check", …}` line per check with its verdict and violations.
 */
import { closeSync, mkdirSync, openSync, statSync, unlinkSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import type { CheckResult, Stats } from './checker.js';
import type { HistoryEvent } from './protocol.js';
import type { FinalState } from './store.js';
import { timelineSvg } from './svg.js';

export interface Summary {
  stats: Stats;
  checks: readonly CheckResult[];
  /** Requested nemeses: undefined = applied, else why not. */
  nemeses: ReadonlyArray<{ kind: string; notApplicable?: string }>;
  /** Extra failures of the run itself (a worker died, nothing was written). */
  runProblems: readonly string[];
}

/** The table printed at the end of a run. */
export function formatSummary(s: Summary): string[] {
  const { stats } = s;
  const lines: string[] = ['', 'results'];
  const failed = stats.failed > 0 ? `, ${stats.failed} failed (indeterminate; ${stats.failedCommitted} of them committed)` : ', 0 failed';
  lines.push(`  operations  ${stats.operations} (${stats.granted} acquired, ${stats.acquireFailed} acquire errors, ${stats.lost} leases lost)`);
  lines.push(
    `  writes      ${stats.writes}: ${stats.accepted} accepted, ${stats.refused} refused by the fence${failed}${stats.unfinished ? `, ${stats.unfinished} unfinished` : ''}`,
  );
  const faults = s.nemeses.map(({ kind, notApplicable }) =>
    notApplicable ? `${kind} n/a (${notApplicable})` : `${kind} ${stats.faults[kind as keyof Stats['faults']] ?? 0}`,
  );
  lines.push(
    `  faults      ${faults.length > 0 ? faults.join(', ') : 'none requested'}${stats.faults.skipped ? `; ${stats.faults.skipped} skipped (see history)` : ''}`,
  );
  lines.push('');
  const rows: [string, string, string][] = s.checks.map((c) => [c.title, c.verdict === 'pass' ? 'PASS' : 'FAIL', c.summary]);
  if (s.runProblems.length > 0) rows.push(['run: workers ran to the end and wrote', 'FAIL', `${s.runProblems.length} problems`]);
  const width = Math.max(...rows.map((r) => r[0].length), 'check'.length);
  lines.push(`  ${'check'.padEnd(width)}  verdict  detail`);
  for (const [i, [title, verdict, detail]] of rows.entries()) {
    lines.push(`  ${title.padEnd(width)}  ${verdict.padEnd(7)}  ${detail}`);
    const check = s.checks[i];
    const problems = check ? check.violations : s.runProblems;
    for (const v of problems) lines.push(`      - ${v}`);
  }
  lines.push('');
  const failedChecks = [...s.checks.filter((c) => c.verdict === 'fail').map((c) => c.id), ...(s.runProblems.length > 0 ? ['run'] : [])];
  lines.push(failedChecks.length === 0 ? 'verdict: PASS (every check passed)' : `verdict: FAIL (${failedChecks.join(', ')})`);
  return lines;
}

export interface ReportFiles {
  dir: string;
  header: Record<string, unknown>;
  events: readonly HistoryEvent[];
  final: FinalState;
  checks: readonly CheckResult[];
  flagged: readonly string[];
  workers: readonly number[];
  title: string;
  subtitle: string;
  endMs: number;
}

/** The files `--report DIR` writes, inside DIR. */
export const REPORT_FILES = Object.freeze(['history.jsonl', 'timeline.svg'] as const);

/**
 * Creates `dir` and its missing parents, one level at a time, and throws (never loops) when that
 * is impossible. Not `mkdirSync(dir, { recursive: true })`: on Node 20 that spins forever at 100 %
 * CPU for a path it cannot create under an existing parent, such as `/proc/x` (mkdir says ENOENT,
 * the parent exists, so it tries the child again).
 */
export function makeDirs(dir: string): void {
  const missing: string[] = [];
  let at = resolve(dir);
  for (;;) {
    const st = statSync(at, { throwIfNoEntry: false });
    if (st) {
      if (!st.isDirectory()) throw new Error(`${at} is not a directory`);
      break;
    }
    missing.push(at);
    const parent = dirname(at);
    if (parent === at) break; // the root itself is missing: mkdir below says why
    at = parent;
  }
  for (const d of missing.reverse()) {
    try {
      mkdirSync(d);
    } catch (error) {
      // Created meanwhile by someone else is fine; anything else is final.
      if ((error as NodeJS.ErrnoException).code !== 'EEXIST' || !statSync(d, { throwIfNoEntry: false })?.isDirectory()) throw error;
    }
  }
}

/**
 * Checks before a run that its report can be written: creates `dir` (see {@link makeDirs}) and
 * opens each report file for writing (a file that did not exist is removed again). Throws the
 * first failure, as is.
 */
export function prepareReportDir(dir: string): void {
  makeDirs(dir);
  for (const name of REPORT_FILES) {
    const path = join(dir, name);
    const existed = statSync(path, { throwIfNoEntry: false }) !== undefined;
    closeSync(openSync(path, 'a'));
    if (!existed) unlinkSync(path);
  }
}

/** Writes history.jsonl and timeline.svg into `dir` (created if missing); returns their paths. */
export function writeReport(r: ReportFiles): { history: string; timeline: string } {
  makeDirs(r.dir);
  const json = (value: unknown): string => JSON.stringify(value, (_k, v: unknown) => (typeof v === 'bigint' ? v.toString() : v));
  const lines = [
    json({ type: 'run', ...r.header }),
    ...[...r.events].sort((a, b) => a.t - b.t).map(json),
    json({ type: 'final', counter: r.final.counter, highest: r.final.highest, log: r.final.log }),
    ...r.checks.map((c) =>
      json({ type: 'check', id: c.id, title: c.title, verdict: c.verdict, summary: c.summary, violationCount: c.violationCount, violations: c.violations }),
    ),
  ];
  const history = join(r.dir, 'history.jsonl');
  const timeline = join(r.dir, 'timeline.svg');
  writeFileSync(history, `${lines.join('\n')}\n`);
  writeFileSync(timeline, timelineSvg({ title: r.title, subtitle: r.subtitle, events: r.events, workers: r.workers, endMs: r.endMs, flagged: r.flagged }));
  return { history, timeline };
}

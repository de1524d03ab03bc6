import { formatDuration } from '../util/duration.js';
import { hash32, mulberry32, uniform } from './random.js';

/** The faults `leasehold verify` can inject, in the order they are listed and reported. */
export const NEMESES = Object.freeze(['pause', 'delay', 'crash', 'clock'] as const);
export type NemesisKind = (typeof NEMESES)[number];

/**
 * One planned fault. Times and lengths are fixed by the seed; the target of `pause` and `delay`
 * is not: it is whichever worker holds the lease when the fault is due (the point is to hit a
 * holder), so it is recorded in the history, not planned.
 */
export interface PlannedFault {
  /** Milliseconds after the workers were told to start. */
  readonly at: number;
  readonly kind: NemesisKind;
  /** How long it lasts: the freeze (pause), the hold (delay), the downtime (crash), the skew (clock). */
  readonly durationMs: number;
  /** clock only: the worker (0-based) whose clock rate changes, and the rate it runs at meanwhile. */
  readonly worker?: number;
  readonly rate?: number;
}

export interface ScheduleInput {
  readonly seed: number;
  readonly durationMs: number;
  /** The effective lease ttl (after the backend's minimum): fault lengths are multiples of it. */
  readonly ttlMs: number;
  readonly workers: number;
  /** The nemeses that apply to this run. */
  readonly nemeses: readonly NemesisKind[];
}

type Range = readonly [lo: number, hi: number];

/**
 * Shape of each nemesis, in multiples of the ttl: when the first fault comes, how long each
 * lasts, the quiet gap after it. Each reason in its line.
 */
export const SHAPES: Readonly<Record<NemesisKind, { first: Range; length: Range; gap: Range }>> = Object.freeze({
  /** Frozen 2–3.5 ttl: the lease expires (1 ttl), another worker takes over, works (ttl/5) and writes, all before the frozen one runs again. */
  pause: { first: [1, 3], length: [2, 3.5], gap: [1.5, 4] },
  /** Held 1.5–2.5 ttl: the holder's renewals and its write arrive after its lease is gone. */
  delay: { first: [1.5, 4], length: [1.5, 2.5], gap: [2, 5] },
  /** Down 0.5–1.5 ttl, then restarted; far apart, since clients need a moment to reconnect. */
  crash: { first: [2, 5], length: [0.5, 1.5], gap: [4, 8] },
  /** A rate in [0.9, 1.1] for 2–6 ttl, then back to 1. */
  clock: { first: [0.5, 2], length: [2, 6], gap: [0.5, 2] },
});

/** Bounds of the clock rates the clock nemesis sets. */
export const CLOCK_RATES: Range = Object.freeze([0.9, 1.1] as const);

/** Faults end at least this many ttls before the run does, so the last hand-offs can complete. */
const QUIET_TAIL_TTLS = 1;

/**
 * The fault schedule of a run: one independent stream per nemesis (its own PRNG, derived from the
 * seed and the nemesis' name, so enabling one more nemesis does not move the others), sorted by
 * time. Pure: the same input gives the same schedule.
 */
export function planSchedule(input: ScheduleInput): PlannedFault[] {
  const { seed, durationMs, ttlMs, workers } = input;
  const end = durationMs - QUIET_TAIL_TTLS * ttlMs;
  const faults: PlannedFault[] = [];
  for (const kind of NEMESES) {
    if (!input.nemeses.includes(kind)) continue;
    const random = mulberry32((seed ^ hash32(kind)) >>> 0);
    const shape = SHAPES[kind];
    let at = uniform(random, ...shape.first) * ttlMs;
    for (;;) {
      const length = uniform(random, ...shape.length) * ttlMs;
      const extra = kind === 'clock' ? { worker: Math.min(workers - 1, Math.floor(random() * workers)), rate: round3(uniform(random, ...CLOCK_RATES)) } : {};
      if (at + length > end) break;
      faults.push({ at: Math.round(at), kind, durationMs: Math.round(length), ...extra });
      at += length + uniform(random, ...shape.gap) * ttlMs;
    }
  }
  return faults.sort((a, b) => a.at - b.at || NEMESES.indexOf(a.kind) - NEMESES.indexOf(b.kind));
}

/** One line per nemesis for the terminal: `pause  3 × at 0.8s(1.1s) 2.9s(0.9s) …`. */
export function describeSchedule(faults: readonly PlannedFault[], nemeses: readonly NemesisKind[]): string[] {
  return nemeses.map((kind) => {
    const mine = faults.filter((f) => f.kind === kind);
    if (mine.length === 0) return `${kind.padEnd(6)} none fits in this run`;
    const items = mine.map((f) => {
      const what = kind === 'clock' ? ` w${f.worker! + 1}×${f.rate}` : '';
      return `${formatDuration(f.at)}${what}(${formatDuration(f.durationMs)})`;
    });
    return `${kind.padEnd(6)} ${mine.length} × at ${items.join(' ')}`;
  });
}

function round3(x: number): number {
  return Math.round(x * 1000) / 1000;
}

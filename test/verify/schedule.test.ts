import { describe, expect, it } from 'vitest';
import { mulberry32 } from '../../src/verify/random.js';
import { CLOCK_RATES, describeSchedule, NEMESES, planSchedule, SHAPES, type ScheduleInput } from '../../src/verify/schedule.js';

const base: ScheduleInput = { seed: 42, durationMs: 30_000, ttlMs: 1_000, workers: 3, nemeses: NEMESES };

describe('verify: the seeded fault schedule', () => {
  it('the same seed and options give the same schedule; another seed gives another', () => {
    expect(planSchedule(base)).toEqual(planSchedule({ ...base }));
    expect(planSchedule({ ...base, seed: 43 })).not.toEqual(planSchedule(base));
    expect(describeSchedule(planSchedule(base), NEMESES)).toEqual(describeSchedule(planSchedule(base), NEMESES));
  });

  it('mulberry32 replays its sequence and stays in [0, 1)', () => {
    const a = mulberry32(7);
    const b = mulberry32(7);
    const xs = Array.from({ length: 1_000 }, () => a());
    expect(xs).toEqual(Array.from({ length: 1_000 }, () => b()));
    expect(xs.every((x) => x >= 0 && x < 1)).toBe(true);
    expect(new Set(xs).size).toBeGreaterThan(990);
  });

  it('each nemesis has its own stream: leaving one out does not move the others', () => {
    const all = planSchedule(base);
    const withoutDelay = planSchedule({ ...base, nemeses: ['pause', 'crash', 'clock'] });
    expect(withoutDelay).toEqual(all.filter((f) => f.kind !== 'delay'));
    expect(planSchedule({ ...base, nemeses: [] })).toEqual([]);
  });

  it('faults fit the run, are sorted, and have the planned shapes', () => {
    for (const seed of [1, 2, 3, 99, 4_000_000_000]) {
      const faults = planSchedule({ ...base, seed });
      expect(faults.length).toBeGreaterThan(4);
      for (const kind of NEMESES) expect(faults.some((f) => f.kind === kind)).toBe(true);
      for (let i = 1; i < faults.length; i++) expect(faults[i]!.at).toBeGreaterThanOrEqual(faults[i - 1]!.at);
      for (const f of faults) {
        expect(f.at + f.durationMs).toBeLessThanOrEqual(base.durationMs - base.ttlMs + 1);
        const [lo, hi] = SHAPES[f.kind].length;
        expect(f.durationMs).toBeGreaterThanOrEqual(Math.round(lo * base.ttlMs) - 1);
        expect(f.durationMs).toBeLessThanOrEqual(Math.round(hi * base.ttlMs) + 1);
        if (f.kind === 'pause' || f.kind === 'delay') expect(f.durationMs).toBeGreaterThan(base.ttlMs); // past the lease
        if (f.kind === 'clock') {
          expect(f.rate).toBeGreaterThanOrEqual(CLOCK_RATES[0]);
          expect(f.rate).toBeLessThanOrEqual(CLOCK_RATES[1]);
          expect(f.worker).toBeGreaterThanOrEqual(0);
          expect(f.worker).toBeLessThan(base.workers);
        }
      }
      // Faults of one kind do not overlap.
      for (const kind of NEMESES) {
        const mine = faults.filter((f) => f.kind === kind);
        for (let i = 1; i < mine.length; i++) expect(mine[i]!.at).toBeGreaterThanOrEqual(mine[i - 1]!.at + mine[i - 1]!.durationMs);
      }
    }
  });

  it('a run too short for a fault plans none and says so', () => {
    const faults = planSchedule({ ...base, durationMs: 1_500 });
    expect(faults).toEqual([]);
    expect(describeSchedule(faults, ['pause'])).toEqual(['pause  none fits in this run']);
  });
});

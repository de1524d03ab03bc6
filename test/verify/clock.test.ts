import { describe, expect, it } from 'vitest';
import { manualClock } from '../../src/core/clock.js';
import { Locks } from '../../src/core/locks.js';
import { memoryBackend } from '../../src/memory/index.js';
import { adjustableClock } from '../../src/verify/clock.js';

describe("verify: the workers' adjustable clock", () => {
  it('runs at its rate, stays continuous when the rate changes, and re-arms timers at the new rate', () => {
    const base = manualClock(1_000);
    const clock = adjustableClock({ offsetMs: 5_000, rate: 2 }, base);
    const t0 = clock.now();
    base.advance(100);
    expect(clock.now() - t0).toBeCloseTo(200);
    const fired: number[] = [];
    clock.setTimeout(() => fired.push(base.now()), 100); // due 100 clock-ms from now: 50 real ms at rate 2
    clock.setRate(0.5); // now it takes 200 real ms
    const before = clock.now();
    expect(before - t0).toBeCloseTo(200); // no jump
    base.advance(199);
    expect(fired).toEqual([]);
    base.advance(1);
    expect(fired).toEqual([1_300]);
    expect(clock.now() - before).toBeCloseTo(100);
    const handle = clock.setTimeout(() => fired.push(-1), 10);
    clock.clearTimeout(handle);
    clock.setRate(1);
    base.advance(100);
    expect(fired).toEqual([1_300]);
    expect(base.pending()).toBe(0);
    expect(() => clock.setRate(0)).toThrow(RangeError);
  });

  it('offsets never matter: Locks makes the same decisions at offset 0 and at ±10^12 ms', async () => {
    // Core only subtracts readings of one clock (validity = send time + ttl − drift, compared with
    // now()); a constant offset cancels out. Same script, three offsets, identical observations.
    const observe = async (offsetMs: number): Promise<string[]> => {
      const base = manualClock(0);
      const clock = adjustableClock({ offsetMs, rate: 1 }, base);
      const locks = new Locks({ backend: memoryBackend({ clock: base }), clock });
      const seen: string[] = [];
      const lease = await locks.acquire('k', { ttlMs: 1_000, autoRenew: false });
      lease.signal.addEventListener('abort', () => seen.push(`lost at ${base.now()}`));
      for (const step of [300, 300, 300, 100]) {
        base.advance(step);
        seen.push(`t=${base.now()} held=${lease.held} remaining=${lease.remainingMs().toFixed(3)}`);
      }
      await locks.close();
      return seen;
    };
    const zero = await observe(0);
    expect(zero).toContain('lost at 988');
    expect(await observe(1e12)).toEqual(zero);
    expect(await observe(-1e12)).toEqual(zero);
  });
});

import type { ManualClock } from '../../src/core/clock.js';

/** Lets pending promise chains settle (several macrotask turns). */
export async function flush(): Promise<void> {
  for (let i = 0; i < 10; i++) await new Promise((r) => setImmediate(r));
}

/** Advances the manual clock in steps of `step` ms, letting promises settle between them. */
export async function advance(clock: ManualClock, ms: number, step = 5): Promise<void> {
  for (let t = 0; t < ms; t += step) {
    clock.advance(Math.min(step, ms - t));
    await flush();
  }
}

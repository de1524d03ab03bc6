import { skewedClock, systemClock, type Clock, type TimerHandle } from '../core/clock.js';

/**
 * A worker's clock under the clock nemesis: core's {@link skewedClock} (an offset and a rate over
 * the monotonic system clock), whose rate the harness can change while the worker runs.
 *
 * - The offset is set once per worker (each gets a different, large one). It never matters: core
 *   only ever subtracts two readings of the same clock (validity = send time + ttl − drift,
 *   compared with `now()`), so a constant offset cancels out. The verifier's runs show it, and a
 *   unit test pins it (same decisions with offset 0 and with ±10^12 ms).
 * - The rate is what matters: a clock slower than 1 − driftFactor lets a worker believe in its
 *   lease after the coordinator (whose clock stays authoritative, I7) has let it expire. A rate
 *   change is continuous (the clock never jumps, as a monotonic clock never does) and re-arms
 *   pending timers, so each fires when the clock, at its new rate, reaches the time it was due.
 */
export interface AdjustableClock extends Clock {
  /** Changes the rate from now on; the reading stays continuous. */
  setRate(rate: number): void;
  readonly rate: number;
  /** The offset the clock started with. */
  readonly offsetMs: number;
}

interface Pending {
  /** When the timer is due, on this clock. */
  due: number;
  fn: () => void;
  options: { keepAlive?: boolean } | undefined;
  handle: TimerHandle;
}

export function adjustableClock(options: { offsetMs?: number; rate?: number } = {}, base: Clock = systemClock): AdjustableClock {
  const offsetMs = options.offsetMs ?? 0;
  let rate = checkRate(options.rate ?? 1);
  let segment = skewedClock(base, { offsetMs, rate });
  const timers = new Map<object, Pending>();

  const arm = (key: object, p: Pending): void => {
    p.handle = segment.setTimeout(
      () => {
        timers.delete(key);
        p.fn();
      },
      Math.max(0, p.due - segment.now()),
      p.options,
    );
  };

  return {
    now: () => segment.now(),
    setTimeout(fn, ms, timerOptions) {
      const key = {};
      const p: Pending = { due: segment.now() + Math.max(0, ms), fn, options: timerOptions, handle: {} };
      timers.set(key, p);
      arm(key, p);
      return key;
    },
    clearTimeout(handle) {
      const p = timers.get(handle);
      if (!p) return;
      timers.delete(handle);
      segment.clearTimeout(p.handle);
    },
    setRate(next) {
      checkRate(next);
      // A new skewed segment that starts where the old one is now: continuous, at the new rate.
      const reading = segment.now();
      segment = skewedClock(base, { offsetMs: reading - base.now(), rate: next });
      rate = next;
      for (const [key, p] of timers) {
        base.clearTimeout(p.handle);
        arm(key, p);
      }
    },
    get rate() {
      return rate;
    },
    offsetMs,
  };
}

function checkRate(rate: number): number {
  if (!(rate > 0) || !Number.isFinite(rate)) throw new RangeError(`clock rate must be a positive finite number, got ${rate}`);
  return rate;
}

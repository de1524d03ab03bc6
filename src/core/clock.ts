/**
 * The client's notion of time. Durations (validity, renewal, waiting) are measured on a monotonic
 * clock, never as differences of `Date.now()`. Injectable, so tests can drive time by hand and the
 * verifier can skew a worker's clock.
 */
export interface Clock {
  /** Monotonic milliseconds; only differences are meaningful. */
  now(): number;
  /**
   * Runs `fn` after `ms`. Background timers (renewal, validity) never keep the process alive;
   * `keepAlive` is for timers a caller is awaiting (waiting for a busy key), which must.
   */
  setTimeout(fn: () => void, ms: number, options?: { keepAlive?: boolean }): TimerHandle;
  clearTimeout(handle: TimerHandle): void;
}

/** Opaque timer handle of a {@link Clock}. */
export type TimerHandle = { readonly __timer: unique symbol } | object;

/**
 * The margin by which a client ends a lease's validity before the coordinator can: a fraction of
 * the ttl for clock-rate drift, plus 2 ms for timer resolution (node-redlock's arithmetic). Used by
 * `Locks` (I5) and by backends that judge validity themselves (Redlock's quorum).
 */
export function driftMarginMs(ttlMs: number, driftFactor: number): number {
  return ttlMs * driftFactor + 2;
}

/** setTimeout's upper bound (2^31 − 1 ms); longer delays fire at once in Node, so they are capped. */
export const MAX_TIMER_MS = 2_147_483_647;

/** performance.now() and unref'd Node timers. */
export const systemClock: Clock = Object.freeze({
  now: () => performance.now(),
  setTimeout(fn: () => void, ms: number, options?: { keepAlive?: boolean }): TimerHandle {
    const t = setTimeout(fn, Math.min(Math.max(0, ms), MAX_TIMER_MS));
    if (!options?.keepAlive) t.unref?.();
    return t;
  },
  clearTimeout(handle: TimerHandle): void {
    clearTimeout(handle as ReturnType<typeof setTimeout>);
  },
});

/** A clock that only moves when told to; timers fire synchronously inside {@link ManualClock.advance}. */
export interface ManualClock extends Clock {
  /** Moves time forward, firing each due timer at its own due time, in order. */
  advance(ms: number): void;
  /** Time leaps forward first, then every overdue timer fires, all seeing the new time: what a process sees after SIGSTOP/SIGCONT. */
  jump(ms: number): void;
  /** Number of pending timers (for tests that check nothing is left behind). */
  pending(): number;
}

export function manualClock(start = 0): ManualClock {
  let current = start;
  let seq = 0;
  const timers = new Map<object, { at: number; seq: number; fn: () => void }>();
  /** Fires due timers in order; with `leap`, time is already at `target` when they run. */
  const fire = (target: number, leap: boolean): void => {
    if (leap) current = Math.max(current, target);
    for (;;) {
      let next: [object, { at: number; seq: number; fn: () => void }] | undefined;
      for (const entry of timers) {
        if (entry[1].at > target) continue;
        if (!next || entry[1].at < next[1].at || (entry[1].at === next[1].at && entry[1].seq < next[1].seq)) next = entry;
      }
      if (!next) break;
      timers.delete(next[0]);
      current = Math.max(current, next[1].at);
      next[1].fn();
    }
    current = Math.max(current, target);
  };
  return {
    now: () => current,
    setTimeout(fn, ms) {
      const handle = {};
      timers.set(handle, { at: current + Math.max(0, ms), seq: seq++, fn });
      return handle;
    },
    clearTimeout(handle) {
      timers.delete(handle);
    },
    advance: (ms) => fire(current + ms, false),
    jump: (ms) => fire(current + ms, true),
    pending: () => timers.size,
  };
}

/**
 * A clock that runs at `rate` times the speed of `base` and is offset by `offsetMs`: the way a
 * worker with a bad oscillator or a stepped clock sees time. Timers scale with the rate, so a
 * fast clock fires its timers early in real time, as a real one would.
 */
export function skewedClock(base: Clock, skew: { offsetMs?: number; rate?: number }): Clock {
  const rate = skew.rate ?? 1;
  const offset = skew.offsetMs ?? 0;
  if (!(rate > 0) || !Number.isFinite(rate)) throw new RangeError('skewedClock: rate must be a positive finite number');
  const origin = base.now();
  return {
    now: () => origin + offset + (base.now() - origin) * rate,
    setTimeout: (fn, ms, options) => base.setTimeout(fn, ms / rate, options),
    clearTimeout: (h) => base.clearTimeout(h),
  };
}

import type { Clock } from './clock.js';

/** Exponential backoff with full jitter (AWS architecture blog): uniform in [0, min(cap, base·2^attempt)]. */
export function fullJitter(attempt: number, baseMs: number, capMs: number, random: () => number = Math.random): number {
  const ceiling = Math.min(capMs, baseMs * 2 ** Math.min(attempt, 30));
  return random() * ceiling;
}

/**
 * Resolves after `ms` on `clock`, or early when `wake` is called or `signal` aborts. Never
 * rejects: the caller looks at the signal afterwards.
 */
export function pause(clock: Clock, ms: number, signal?: AbortSignal): { done: Promise<void>; wake: () => void } {
  let wake!: () => void;
  const done = new Promise<void>((resolve) => {
    if (signal?.aborted) {
      wake = () => {};
      resolve();
      return;
    }
    const finish = (): void => {
      clock.clearTimeout(timer);
      signal?.removeEventListener('abort', finish);
      resolve();
    };
    // The caller is awaiting this pause: keep the process alive (an unref'd wait would let Node exit mid-await).
    const timer = clock.setTimeout(finish, ms, { keepAlive: true });
    signal?.addEventListener('abort', finish, { once: true });
    wake = finish;
  });
  return { done, wake };
}

/** Options of {@link sleep}. */
export interface SleepOptions {
  /** Ends the sleep early, at once when it aborts (already aborted: resolves at once). */
  signal?: AbortSignal | undefined;
  /** false: the timer does not keep the process alive (a bounded wait for a reader that may be gone). @default true */
  ref?: boolean | undefined;
}

/**
 * Resolves after `ms` milliseconds, or as soon as `options.signal` aborts. Never rejects: a caller
 * that was interrupted looks at its signal and decides (the nemesis heals, a loop stops). The timer
 * and the abort listener are both removed whichever comes first.
 */
export function sleep(ms: number, options?: SleepOptions): Promise<void> {
  const signal = options?.signal;
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const timer = setTimeout(done, ms);
    if (options?.ref === false) timer.unref();
    signal?.addEventListener('abort', done, { once: true });
    function done(): void {
      clearTimeout(timer);
      signal?.removeEventListener('abort', done);
      resolve();
    }
  });
}

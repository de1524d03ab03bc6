/** Time-bounded waits for the adapters: closing and opening connections must not hang on a frozen server. */
export { settleWithin } from '../../core/call.js';

/**
 * `p`, unless `ms` pass or `signal` aborts first: then it rejects (and `p`'s outcome is ignored).
 * For opening our own subscriber connection, which a frozen server would keep waiting for ever.
 */
export function within<T>(p: Promise<T>, ms: number, signal: AbortSignal | undefined, what: string): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    let done = false;
    const finish = (): boolean => {
      if (done) return false;
      done = true;
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
      return true;
    };
    const onAbort = (): void => {
      if (finish()) reject(new Error(`${what}: closed before it was ready`));
    };
    const timer = setTimeout(() => {
      if (finish()) reject(new Error(`${what} got no answer within ${ms} ms`));
    }, ms);
    if (signal?.aborted) return onAbort();
    signal?.addEventListener('abort', onAbort, { once: true });
    p.then(
      (value) => {
        if (finish()) resolve(value);
      },
      (error: unknown) => {
        if (finish()) reject(error);
      },
    );
  });
}

/** Silences a connection we own: connection errors surface on the commands (as BackendUnavailableError); the event itself is only noise. */
export function quiet(client: { on(event: string, listener: () => void): unknown }): void {
  client.on('error', () => {});
}

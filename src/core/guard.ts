import type { Backend, KeyState, SessionSupport } from './backend.js';
import { ClosedError } from './errors.js';

/**
 * The part of the backend contract that is the same for every backend, kept once here rather than
 * re-coded in each: after `close()` every call rejects with `ClosedError` (and `close()` itself is
 * idempotent, closing the backend once); `inspect` answers only keys under the prefix, sorted by
 * key, holders in token order. `Locks` wraps its backend with it; a backend keeps only what is its
 * own (its connections, its scripts, its queue).
 *
 * Time limits are not here: core bounds each call where it makes it (`withTimeout`), because what a
 * late answer means depends on the call (a grant nobody waits for is given back).
 */
export function guardBackend(backend: Backend, options: { closesBackend?: boolean } = {}): Backend {
  const closesBackend = options.closesBackend ?? true;
  let closed: Promise<void> | undefined;
  const what = `${backend.name} backend`;
  const guarded =
    <A extends unknown[], R>(fn: (...args: A) => Promise<R>) =>
    (...args: A): Promise<R> => {
      if (closed) return Promise.reject(new ClosedError(what));
      return fn(...args);
    };
  const sessions: SessionSupport | undefined = backend.sessions && {
    open: guarded((ttlMs: number) => backend.sessions!.open(ttlMs)),
    keepAlive: guarded((id: string, ttlMs: number) => backend.sessions!.keepAlive(id, ttlMs)),
    // Ending a session after close() has nothing left to end: the backend's close ended them.
    close: (id: string) => (closed ? Promise.resolve() : backend.sessions!.close(id)),
  };
  const wrapped: Backend = {
    name: backend.name,
    capabilities: backend.capabilities,
    acquire: guarded((req) => backend.acquire(req)),
    renew: guarded((req) => backend.renew(req)),
    release: guarded((req) => backend.release(req)),
    inspect: guarded(async (prefix: string) => orderStates(await backend.inspect(prefix), prefix)),
    // closesBackend false: a backend lent by its owner (the lock service's `backend` option) is only
    // refused from here on, and left open for its owner.
    close: () => (closed ??= closesBackend ? Promise.resolve().then(() => backend.close()) : Promise.resolve()),
    ...(backend.subscribe && {
      subscribe: guarded((key: string, onChange: Parameters<NonNullable<Backend['subscribe']>>[1], cursor?: unknown) =>
        backend.subscribe!(key, onChange, cursor),
      ),
    }),
    // Giving up a place after close(): the backend's close ended the connection and the places with it.
    ...(backend.cancelWait && { cancelWait: (req: { key: string; owner: string }) => (closed ? Promise.resolve() : backend.cancelWait!(req)) }),
    ...(sessions && { sessions }),
    ...(backend.watch && { watch: guarded((key: string, onChange: () => void) => backend.watch!(key, onChange)) }),
  };
  return wrapped;
}

/** Keys under `prefix` only, sorted by key (code-unit order, as `<` compares); each key's holders in token order. */
export function orderStates(states: readonly KeyState[], prefix: string): KeyState[] {
  return states
    .filter((s) => s.key.startsWith(prefix))
    .map((s) => (isSortedByToken(s) ? s : { ...s, holders: [...s.holders].sort((a, b) => (a.token < b.token ? -1 : a.token > b.token ? 1 : 0)) }))
    .sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
}

function isSortedByToken(s: KeyState): boolean {
  for (let i = 1; i < s.holders.length; i++) if (s.holders[i - 1]!.token > s.holders[i]!.token) return false;
  return true;
}

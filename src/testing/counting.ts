/**
 * Call counting over the Backend interface, shared by the conformance suite and the repository's
 * own tests (not exported from `leasehold/testing`: a tool of the suites, not part of the contract).
 */
import type { Backend } from '../core/backend.js';

/** Counts calls to the Backend interface (instrumentation of the public surface, not a mock). */
export function counting(backend: Backend): { backend: Backend; counts: Record<string, number>; sessionIds: string[] } {
  const counts: Record<string, number> = {};
  const sessionIds: string[] = [];
  const bump = (name: string): void => {
    counts[name] = (counts[name] ?? 0) + 1;
  };
  const wrapped: Backend = Object.create(backend) as Backend;
  for (const name of ['acquire', 'renew', 'release', 'inspect', 'close', 'subscribe', 'cancelWait'] as const) {
    const fn = backend[name] as ((...args: unknown[]) => unknown) | undefined;
    if (fn) Object.defineProperty(wrapped, name, { value: (...args: unknown[]) => (bump(name), fn.apply(backend, args)) });
  }
  if (backend.sessions) {
    const s = backend.sessions;
    Object.defineProperty(wrapped, 'sessions', {
      value: {
        open: async (ttl: number) => {
          bump('sessions.open');
          const r = await s.open(ttl);
          sessionIds.push(r.id);
          return r;
        },
        keepAlive: (id: string, ttl: number) => (bump('sessions.keepAlive'), s.keepAlive(id, ttl)),
        close: (id: string) => (bump('sessions.close'), s.close(id)),
      },
    });
  }
  return { backend: wrapped, counts, sessionIds };
}

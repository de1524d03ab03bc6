/**
 * Small tools the MySQL fault tests share: how a call settled within a bound (a hang is an answer
 * too), a backend that records when its successful calls were sent (the I6 bound), retrying while
 * a restarted server comes back, and the ids of a user's connections (to KILL them).
 */
import type mysql from 'mysql2/promise';
import type { Backend, SessionSupport } from '../../src/core/backend.js';
import { BackendUnavailableError } from '../../src/core/errors.js';
import { sleep } from '../helpers/env.js';

export type Outcome<T> = { value: T } | { error: unknown } | 'hung';

/** Resolves with how `p` settled, or 'hung' after `ms` (a regression must fail the test, not hang the suite). */
export function within<T>(p: Promise<T>, ms: number): Promise<Outcome<T>> {
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve('hung'), ms);
    p.then(
      (value) => {
        clearTimeout(timer);
        resolve({ value });
      },
      (error: unknown) => {
        clearTimeout(timer);
        resolve({ error });
      },
    );
  });
}

/** The error of an outcome; fails (throws) when the call succeeded or hung. */
export function errorOf(o: Outcome<unknown>, what: string): unknown {
  if (o === 'hung') throw new Error(`${what} hung`);
  if ('value' in o) throw new Error(`${what} succeeded (${String(o.value)}) where it should have failed`);
  return o.error;
}

/**
 * A view of `backend` that records, on the client's monotonic clock, when each call that kept a
 * lease alive (acquire, renew, session open and keep-alive) was sent, for the calls that succeeded.
 * The coordinator counts a ttl from the request's arrival, so it cannot grant the key to anyone
 * else before (last such send) + ttl: I6 asks the lease's signal to abort before that.
 */
export function recording(backend: Backend): { backend: Backend; lastKeptAt: () => number } {
  let last = Number.NEGATIVE_INFINITY;
  const kept = async <T>(call: () => Promise<T>, ok: (value: T) => boolean): Promise<T> => {
    const sentAt = performance.now();
    const value = await call();
    if (ok(value)) last = Math.max(last, sentAt);
    return value;
  };
  const sessions: SessionSupport | undefined = backend.sessions && {
    open: (ttlMs) =>
      kept(
        () => backend.sessions!.open(ttlMs),
        () => true,
      ),
    keepAlive: (id, ttlMs) =>
      kept(
        () => backend.sessions!.keepAlive(id, ttlMs),
        (alive) => alive,
      ),
    close: (id) => backend.sessions!.close(id),
  };
  const view: Backend = {
    name: backend.name,
    capabilities: backend.capabilities,
    acquire: (req) =>
      kept(
        () => backend.acquire(req),
        (r) => r.granted,
      ),
    renew: (req) =>
      kept(
        () => backend.renew(req),
        (r) => r.renewed,
      ),
    release: (req) => backend.release(req),
    inspect: (prefix) => backend.inspect(prefix),
    close: () => backend.close(),
    ...(backend.subscribe && { subscribe: backend.subscribe.bind(backend) }),
    ...(backend.cancelWait && { cancelWait: backend.cancelWait.bind(backend) }),
    ...(backend.watch && { watch: backend.watch.bind(backend) }),
    ...(sessions && { sessions }),
  };
  return { backend: view, lastKeptAt: () => last };
}

/**
 * Runs `fn` until it succeeds while the server comes back: a BackendUnavailableError is retried
 * for up to `ms`; any other error fails at once (a raw driver error is a bug). Returns the value and
 * the unavailable errors seen on the way.
 */
export async function untilAvailable<T>(fn: () => Promise<T>, ms = 30_000): Promise<{ value: T; unavailable: BackendUnavailableError[] }> {
  const end = performance.now() + ms;
  const unavailable: BackendUnavailableError[] = [];
  for (;;) {
    try {
      return { value: await fn(), unavailable };
    } catch (error) {
      if (!(error instanceof BackendUnavailableError) || performance.now() > end) throw error;
      unavailable.push(error);
      await sleep(100);
    }
  }
}

/** Ids of the server's connections logged in as `user` (PROCESSLIST), the caller's own left out. */
export async function connectionIds(admin: mysql.Pool | mysql.Connection, user: string): Promise<number[]> {
  const [rows] = await admin.query('SELECT ID AS id FROM information_schema.PROCESSLIST WHERE USER = ? AND ID <> CONNECTION_ID() ORDER BY ID', [user]);
  return (rows as { id: number | string }[]).map((r) => Number(r.id));
}

/** KILL each connection; one that ended in between is not an error (ER_NO_SUCH_THREAD). */
export async function killConnections(admin: mysql.Pool | mysql.Connection, ids: readonly number[]): Promise<number> {
  let killed = 0;
  for (const id of ids) {
    try {
      await admin.query(`KILL CONNECTION ${Number(id)}`);
      killed++;
    } catch (error) {
      if ((error as { code?: string }).code !== 'ER_NO_SUCH_THREAD') throw error;
    }
  }
  return killed;
}

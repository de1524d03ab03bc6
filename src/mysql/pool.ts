import { settleWithin } from '../core/call.js';
import { createPool, type Pool } from './driver.js';
import type { MysqlPool } from './util.js';

/** Connecting to a server that does not answer fails after this long, as BackendUnavailableError, instead of hanging. */
const CONNECT_TIMEOUT_MS = 5_000;

/** The parts of a mysql2 connection (the callback one inside the promise wrapper) the pool's events hand out. */
interface CoreConnection {
  readonly stream?: { ref?(): unknown; unref?(): unknown; destroy?(): unknown; destroyed?: boolean };
  on(event: 'error' | 'end', listener: (...args: unknown[]) => void): unknown;
  destroy(): void;
}

export interface OwnPool {
  readonly pool: MysqlPool;
  /**
   * Ends the pool politely (QUIT on each connection) and waits for the server's goodbye at most
   * `ms`; a server that never answers (frozen, a black-holed link) has its sockets dropped then.
   */
  end(ms: number): Promise<void>;
}

/**
 * The pool the backend makes from a `uri`: bounded connects, TCP keep-alive, big numbers as strings
 * (tokens are BIGINT UNSIGNED), and sockets that keep the process alive only while a statement is
 * on them (as pg's `allowExitOnIdle`): a process that holds leases and has nothing else to do exits,
 * with its idle connections still open. The URL's own parameters are mysql2's options; the ones set
 * here come first.
 */
export function createOwnPool(uri: string, size: number): OwnPool {
  const pool: Pool = createPool({
    uri,
    connectionLimit: size,
    // maxIdle below connectionLimit would start mysql2's idle sweep, a ref'd timer that keeps the process alive
    maxIdle: size,
    connectTimeout: CONNECT_TIMEOUT_MS,
    enableKeepAlive: true,
    supportBigNumbers: true,
    bigNumberStrings: true,
    charset: 'utf8mb4',
  });
  const open = new Set<CoreConnection>();
  const events = pool as unknown as { on(event: string, listener: (connection: CoreConnection) => void): unknown };
  events.on('connection', (connection) => {
    open.add(connection);
    // A connection that breaks while idle (a server restart) reports it here; with no listener left the process would crash.
    connection.on('error', () => {});
    connection.on('end', () => open.delete(connection));
  });
  events.on('acquire', (connection) => connection.stream?.ref?.());
  events.on('release', (connection) => connection.stream?.unref?.());
  return {
    pool: pool as unknown as MysqlPool,
    async end(ms) {
      await settleWithin(
        pool.end().catch(() => {}),
        ms,
      );
      for (const connection of open) dropConnection(connection);
      open.clear();
    },
  };
}

/**
 * Ends a mysql2 connection for good, at once. mysql2's `destroy()` only half-closes the socket (our
 * FIN) and then waits for the server to close its side, which a frozen server never does: the
 * socket would stay open (and keep the process alive) until the server runs again. Destroying the
 * socket itself as well frees it now. Accepts a core connection or a promise-API one (whose core
 * connection is `.connection`).
 */
export function dropConnection(connection: unknown): void {
  const c = connection as { destroy?(): void; stream?: CoreConnection['stream']; connection?: { stream?: CoreConnection['stream'] } } | null;
  if (!c) return;
  const stream = c.stream ?? c.connection?.stream;
  if (typeof c.destroy === 'function' && stream?.destroyed !== true) c.destroy();
  if (stream && stream.destroyed !== true) stream.destroy?.();
}

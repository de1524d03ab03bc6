import type { ChainableCommander } from 'ioredis';
import { BackendUnavailableError, InvalidArgumentError, StaleTokenError } from '../core/errors.js';
import type { Fence } from '../core/fence.js';
import { toToken, type TokenInput } from '../core/token.js';
import { checkInteger, checkKey, checkKnownOptions, checkObject, describe } from '../core/validate.js';
import { checkKeyPrefix, deadline, encodeKey, mapRedisError } from './client.js';

/** The transaction `mutate` queues its commands on: an ioredis MULTI (sent with EXEC after `mutate` returns). */
export type RedisMulti = ChainableCommander;

/** The few methods of an ioredis connection the fence uses (typed structurally). */
interface FenceConnection {
  watch(...keys: string[]): Promise<unknown>;
  unwatch(): Promise<unknown>;
  get(key: string): Promise<string | null>;
  multi(): RedisMulti;
  quit(): Promise<unknown>;
  disconnect(): void;
  on(event: string, listener: (...args: never[]) => void): unknown;
}

/** An ioredis client (`Redis` or `Cluster`): the fence reads marks through it and duplicates it for transactions. */
export interface RedisFenceClient {
  get(key: string): Promise<string | null>;
  duplicate(): FenceConnection;
}

export interface RedisFenceOptions {
  /** Prefix of the high-water mark keys; must not contain `{` or `}`. @default 'leasehold:fence:' */
  prefix?: string;
  /** Dedicated connections for WATCH/MULTI/EXEC (WATCH is per connection); more writers wait. @default 4 */
  connections?: number;
  /** Longest wait for one Redis reply. @default 2000 */
  commandTimeoutMs?: number;
}

/** Idle transaction connections are closed after this long (they are opened again when needed). */
const IDLE_CLOSE_MS = 10_000;
/** A write whose mark keeps changing under it (other writers of the same resource) gives up after this many tries. */
const MAX_ATTEMPTS = 100;

/**
 * A fence for data kept in Redis. `write` WATCHes the resource's mark, reads it, refuses a lower
 * token (StaleTokenError, nothing sent), and otherwise hands `mutate` a MULTI that already raises
 * the mark; the commands `mutate` queues run with it in one EXEC. If another writer changed the
 * mark in between, EXEC does nothing and the write is checked again (I3: check and mutation commit
 * together, never check-then-write).
 *
 * - `mutate` queues commands; it cannot read inside the transaction (Redis transactions have no
 *   reads), so read-modify-write must be a command (INCR, HINCRBY…) or a script you queue.
 * - If `mutate` throws, nothing is sent and its error reaches you unchanged.
 * - A queued command that fails when EXEC runs it (e.g. WRONGTYPE) does not undo the others:
 *   Redis has no rollback. `write` then rejects with InvalidArgumentError naming the command.
 * - Redis Cluster: MULTI needs one slot. The mark key is `<prefix>{<resource>}` (with `}` and `%`
 *   percent-encoded); give your data keys the same hash tag.
 * - The fence opens up to `connections` duplicates of `client` (WATCH is per connection), closes
 *   them after 10 s idle; `close()` closes them now. `client` itself stays yours.
 */
export function redisFence(client: RedisFenceClient, options?: RedisFenceOptions): Fence<RedisMulti> & { close(): Promise<void> } {
  if (typeof client !== 'object' || client === null || typeof client.duplicate !== 'function' || typeof client.get !== 'function') {
    throw new InvalidArgumentError('client', `expected an ioredis client (get, duplicate), got ${describe(client)}`);
  }
  const o = checkObject(options, 'options');
  checkKnownOptions(o, ['prefix', 'connections', 'commandTimeoutMs'], 'options');
  const prefix = o.prefix === undefined ? 'leasehold:fence:' : checkKeyPrefix(o.prefix, 'options.prefix');
  const size = o.connections === undefined ? 4 : checkInteger(o.connections, 'options.connections', 1, 1_000);
  const timeoutMs = o.commandTimeoutMs === undefined ? 2_000 : checkInteger(o.commandTimeoutMs, 'options.commandTimeoutMs', 1, 600_000);
  const markKey = (resource: string): string => `${prefix}{${encodeKey(resource)}}`;
  const pool = new Pool(client, size);
  const call = <T>(p: Promise<T>, what: string): Promise<T> => deadline(p, timeoutMs, 'redis fence', what);

  return {
    async write<R>(resource: string, token: TokenInput, mutate: (tx: RedisMulti) => R | Promise<R>): Promise<R> {
      checkKey(resource, 'resource');
      const t = toToken(token);
      if (typeof mutate !== 'function') throw new InvalidArgumentError('mutate', `expected a function, got ${describe(mutate)}`);
      const key = markKey(resource);
      const conn = await pool.take();
      let healthy = true;
      try {
        for (let attempt = 1; ; attempt++) {
          await call(conn.watch(key), 'watch');
          const current = await call(conn.get(key), 'read mark');
          if (current !== null && BigInt(current) > t) {
            await call(conn.unwatch(), 'unwatch');
            throw new StaleTokenError(resource, t, BigInt(current));
          }
          const tx = conn.multi();
          tx.set(key, t.toString());
          let result: R;
          try {
            result = await mutate(tx);
          } catch (error) {
            await call(conn.unwatch(), 'unwatch').catch(() => (healthy = false));
            throw new MutateFailed(error); // nothing was sent: the queued commands die with tx
          }
          const replies = (await call(tx.exec(), 'exec')) as [Error | null, unknown][] | null;
          if (replies === null) {
            // The mark changed between WATCH and EXEC (another writer): nothing ran; check again.
            if (attempt >= MAX_ATTEMPTS) throw new BackendUnavailableError('redis fence', `write to "${resource}" kept conflicting with other writers (${attempt} tries)`);
            continue;
          }
          const failed = replies.findIndex(([error]) => error);
          if (failed >= 0) {
            const error = replies[failed]![0]!;
            throw new InvalidArgumentError('mutate', `queued command #${failed} failed when EXEC ran it (${error.message}); Redis does not roll back the others`, { cause: error });
          }
          return result;
        }
      } catch (error) {
        if (error instanceof MutateFailed) throw error.error; // the caller's own error, unchanged
        if (error instanceof StaleTokenError || error instanceof InvalidArgumentError) throw error;
        healthy = false;
        throw mapRedisError('redis fence', 'write', error);
      } finally {
        pool.give(conn, healthy);
      }
    },

    async highest(resource: string): Promise<bigint | null> {
      checkKey(resource, 'resource');
      let v: string | null;
      try {
        v = await call(client.get(markKey(resource)), 'read mark');
      } catch (error) {
        throw mapRedisError('redis fence', 'read mark', error);
      }
      return v === null ? null : BigInt(v);
    },

    close: () => pool.close(),
  };
}

/** Carries an error thrown by the caller's `mutate` past our own error mapping. */
class MutateFailed {
  constructor(readonly error: unknown) {}
}

/** Dedicated connections for WATCH (per-connection state), lent to one writer at a time. */
class Pool {
  readonly #client: RedisFenceClient;
  readonly #size: number;
  readonly #idle: FenceConnection[] = [];
  readonly #waiters: ((c: FenceConnection) => void)[] = [];
  #open = 0;
  #idleTimer: ReturnType<typeof setTimeout> | undefined;

  constructor(client: RedisFenceClient, size: number) {
    this.#client = client;
    this.#size = size;
  }

  take(): Promise<FenceConnection> {
    const c = this.#idle.pop();
    if (c) return Promise.resolve(c);
    if (this.#open < this.#size) {
      this.#open++;
      const conn = this.#client.duplicate();
      conn.on('error', () => {});
      return Promise.resolve(conn);
    }
    return new Promise((resolve) => this.#waiters.push(resolve));
  }

  give(conn: FenceConnection, healthy: boolean): void {
    if (!healthy) {
      // Its WATCH state is unknown (a timeout, a lost connection): replace it.
      conn.disconnect();
      this.#open--;
      const next = this.#waiters.shift();
      if (next) void this.take().then(next);
      return;
    }
    const next = this.#waiters.shift();
    if (next) return next(conn);
    this.#idle.push(conn);
    if (this.#idleTimer) clearTimeout(this.#idleTimer);
    this.#idleTimer = setTimeout(() => void this.close(), IDLE_CLOSE_MS);
    this.#idleTimer.unref();
  }

  async close(): Promise<void> {
    if (this.#idleTimer) clearTimeout(this.#idleTimer);
    this.#idleTimer = undefined;
    const idle = this.#idle.splice(0);
    this.#open -= idle.length;
    await Promise.all(idle.map((c) => c.quit().catch(() => c.disconnect())));
  }
}

import type { ChainableCommander } from 'ioredis';
import { BackendUnavailableError, InvalidArgumentError, StaleTokenError } from '../core/errors.js';
import type { Fence } from '../core/fence.js';
import { toToken, type TokenInput } from '../core/token.js';
import { checkInteger, checkKey, checkKnownOptions, checkObject, describe } from '../core/validate.js';
import { checkKeyPrefix, deadline, encodeKey, hasErrorClass, mapRedisError } from './client.js';

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
  /** 'ready' once connected. */
  readonly status?: string;
}

/** An ioredis client (`Redis` or `Cluster`): the fence reads marks through it and duplicates it for transactions. */
export interface RedisFenceClient {
  get(key: string): Promise<string | null>;
  duplicate(): FenceConnection;
}

/** A node-redis MULTI, as far as the fence uses it. */
export interface NodeRedisFenceMulti {
  set(key: string, value: string): unknown;
  exec(): Promise<unknown>;
}

/** The few methods of a node-redis (v4 and later) connection the fence uses (typed structurally). */
interface NodeRedisFenceConnection {
  connect(): Promise<unknown>;
  watch(key: string): Promise<unknown>;
  unwatch(): Promise<unknown>;
  get(key: string): Promise<unknown>;
  multi(): NodeRedisFenceMulti;
  close?(): Promise<unknown>;
  quit?(): Promise<unknown>;
  destroy?(): void;
  disconnect?(): unknown;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- matches node-redis's EventEmitter typing
  on(event: string, listener: (...args: any[]) => void): unknown;
}

/** A node-redis client: the fence reads marks through it and duplicates it (then connects the duplicate) for transactions. */
export interface NodeRedisFenceClient {
  sendCommand(args: string[]): Promise<unknown>;
  get(key: string): Promise<unknown>;
  duplicate(): NodeRedisFenceConnection;
}

/**
 * What `mutate` gets from a node-redis fence unless you name your MULTI's type: any command,
 * loosely typed. For full typing pass it as the type argument:
 * `redisFence<ReturnType<typeof client.multi<'typed'>>>(client)` (node-redis 5+ types `multi`
 * generically, so it cannot be inferred from the client).
 */
export type NodeRedisMulti = NodeRedisFenceMulti & {
  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- whatever command the caller queues
  [command: string]: any;
};

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
 * - `client` is an ioredis client (`mutate` gets an ioredis MULTI) or a node-redis client (v4 and
 *   later; `mutate` gets its MULTI: `tx.incr(…)`, `tx.rPush(…)`).
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
export function redisFence(client: RedisFenceClient, options?: RedisFenceOptions): Fence<RedisMulti> & { close(): Promise<void> };
export function redisFence<Multi extends NodeRedisFenceMulti = NodeRedisMulti>(client: NodeRedisFenceClient, options?: RedisFenceOptions): Fence<Multi> & { close(): Promise<void> };
export function redisFence(client: RedisFenceClient | NodeRedisFenceClient, options?: RedisFenceOptions): Fence<unknown> & { close(): Promise<void> } {
  const c = client as unknown as Record<string, unknown> | null;
  if (typeof c !== 'object' || c === null || typeof c.duplicate !== 'function' || typeof c.get !== 'function') {
    throw new InvalidArgumentError('client', `expected an ioredis or node-redis client (get, duplicate), got ${describe(client)}`);
  }
  const o = checkObject(options, 'options');
  checkKnownOptions(o, ['prefix', 'connections', 'commandTimeoutMs'], 'options');
  const prefix = o.prefix === undefined ? 'leasehold:fence:' : checkKeyPrefix(o.prefix, 'options.prefix');
  const size = o.connections === undefined ? 4 : checkInteger(o.connections, 'options.connections', 1, 1_000);
  const timeoutMs = o.commandTimeoutMs === undefined ? 2_000 : checkInteger(o.commandTimeoutMs, 'options.commandTimeoutMs', 1, 600_000);
  const markKey = (resource: string): string => `${prefix}{${encodeKey(resource)}}`;
  const call = <T>(p: Promise<T>, what: string): Promise<T> => deadline(p, timeoutMs, 'redis fence', what);
  // The same rule as the backends' (wrapClient): ioredis has `call`, node-redis has `sendCommand` and no `call`.
  const open = typeof c.call !== 'function' && typeof c.sendCommand === 'function' ? nodeRedisTx(client as NodeRedisFenceClient, call) : ioredisTx(client as RedisFenceClient, call);
  const pool = new Pool(open, size);

  return {
    async write<R>(resource: string, token: TokenInput, mutate: (tx: unknown) => R | Promise<R>): Promise<R> {
      checkKey(resource, 'resource');
      const t = toToken(token);
      if (typeof mutate !== 'function') throw new InvalidArgumentError('mutate', `expected a function, got ${describe(mutate)}`);
      const key = markKey(resource);
      let conn: TxConn | undefined;
      let healthy = true;
      try {
        conn = await pool.take();
        for (let attempt = 1; ; attempt++) {
          await call(conn.watch(key), 'watch');
          const current = await call(conn.get(key), 'read mark');
          if (current !== null && BigInt(current) > t) {
            await call(conn.unwatch(), 'unwatch');
            throw new StaleTokenError(resource, t, BigInt(current));
          }
          const tx = conn.begin(key, t.toString());
          let result: R;
          try {
            result = await mutate(tx);
          } catch (error) {
            await call(conn.unwatch(), 'unwatch').catch(() => (healthy = false));
            throw new MutateFailed(error); // nothing was sent: the queued commands die with tx
          }
          const outcome = await call(conn.exec(tx), 'exec');
          if (outcome === 'conflict') {
            // The mark changed between WATCH and EXEC (another writer): nothing ran; check again.
            if (attempt >= MAX_ATTEMPTS) throw new BackendUnavailableError('redis fence', `write to "${resource}" kept conflicting with other writers (${attempt} tries)`);
            continue;
          }
          if (outcome !== undefined) {
            const { index, error } = outcome;
            throw new InvalidArgumentError('mutate', `queued command #${index} failed when EXEC ran it (${error.message}); Redis does not roll back the others`, { cause: error });
          }
          return result;
        }
      } catch (error) {
        if (error instanceof MutateFailed) throw error.error; // the caller's own error, unchanged
        if (error instanceof StaleTokenError || error instanceof InvalidArgumentError) throw error;
        healthy = false;
        throw mapRedisError('redis fence', 'write', error);
      } finally {
        if (conn) pool.give(conn, healthy);
      }
    },

    async highest(resource: string): Promise<bigint | null> {
      checkKey(resource, 'resource');
      let v: unknown;
      try {
        v = await call((client as { get(key: string): Promise<unknown> }).get(markKey(resource)), 'read mark');
      } catch (error) {
        throw mapRedisError('redis fence', 'read mark', error);
      }
      return v === null || v === undefined ? null : BigInt(String(v));
    },

    close: () => pool.close(),
  } as Fence<unknown> & { close(): Promise<void> };
}

/**
 * One dedicated connection for WATCH/MULTI/EXEC, over either driver. `exec` answers 'conflict'
 * when a watched key changed (nothing ran), the first queued command that failed, or undefined.
 */
interface TxConn {
  watch(key: string): Promise<unknown>;
  unwatch(): Promise<unknown>;
  get(key: string): Promise<string | null>;
  /** A MULTI with the mark already raised in it. */
  begin(key: string, token: string): unknown;
  exec(tx: unknown): Promise<'conflict' | { index: number; error: Error } | undefined>;
  quit(): Promise<void>;
  destroy(): void;
}

function ioredisTx(client: RedisFenceClient, call: <T>(p: Promise<T>, what: string) => Promise<T>): () => Promise<TxConn> {
  return async () => {
    const conn = client.duplicate();
    conn.on('error', () => {});
    if (conn.status !== undefined && conn.status !== 'ready') {
      // A client without an offline queue (as leasehold's own) refuses commands until connected: wait for it.
      try {
        await call(
          new Promise<void>((resolve, reject) => {
            conn.on('ready', () => resolve());
            conn.on('end', () => reject(new Error('connection ended')));
          }),
          'connect',
        );
      } catch (error) {
        conn.disconnect();
        throw error;
      }
    }
    return {
      watch: (key) => conn.watch(key),
      unwatch: () => conn.unwatch(),
      get: (key) => conn.get(key),
      begin(key, token) {
        const tx = conn.multi();
        tx.set(key, token);
        return tx;
      },
      async exec(tx) {
        const replies = (await (tx as RedisMulti).exec()) as [Error | null, unknown][] | null;
        if (replies === null) return 'conflict';
        const index = replies.findIndex(([error]) => error);
        return index >= 0 ? { index, error: replies[index]![0]! } : undefined;
      },
      quit: async () => {
        await conn.quit().catch(() => conn.disconnect());
      },
      destroy: () => conn.disconnect(),
    };
  };
}

/**
 * node-redis: its EXEC rejects with a `WatchError` when a watched key changed or the connection
 * was re-established after WATCH (nothing ran either way), and with an error carrying
 * `errorIndexes` and `replies` when queued commands failed.
 */
function nodeRedisTx(client: NodeRedisFenceClient, call: <T>(p: Promise<T>, what: string) => Promise<T>): () => Promise<TxConn> {
  return async () => {
    const conn = client.duplicate();
    conn.on('error', () => {});
    const destroy = (): void => {
      if (conn.destroy) conn.destroy();
      else void Promise.resolve(conn.disconnect?.()).catch(() => {});
    };
    try {
      await call(conn.connect(), 'connect');
    } catch (error) {
      destroy();
      throw error;
    }
    return {
      watch: (key) => conn.watch(key),
      unwatch: () => conn.unwatch(),
      get: async (key) => {
        const v = await conn.get(key);
        return v === null || v === undefined ? null : String(v);
      },
      begin(key, token) {
        const tx = conn.multi();
        tx.set(key, token);
        return tx;
      },
      async exec(tx) {
        try {
          await (tx as NodeRedisFenceMulti).exec();
          return undefined;
        } catch (error) {
          if (hasErrorClass(error, 'WatchError')) return 'conflict';
          const failed = error as { errorIndexes?: unknown; replies?: unknown };
          if (Array.isArray(failed.errorIndexes) && Array.isArray(failed.replies) && failed.errorIndexes.length > 0) {
            const index = Number(failed.errorIndexes[0]);
            const reply: unknown = failed.replies[index];
            return { index, error: reply instanceof Error ? reply : new Error(String(reply)) };
          }
          throw error;
        }
      },
      quit: async () => {
        try {
          await (conn.close ?? conn.quit)?.call(conn);
        } catch {
          destroy();
        }
      },
      destroy,
    };
  };
}

/** Carries an error thrown by the caller's `mutate` past our own error mapping. */
class MutateFailed {
  constructor(readonly error: unknown) {}
}

/** Dedicated connections for WATCH (per-connection state), lent to one writer at a time. */
class Pool {
  readonly #open: () => Promise<TxConn>;
  readonly #size: number;
  readonly #idle: TxConn[] = [];
  readonly #waiters: { resolve: (c: TxConn) => void; reject: (error: unknown) => void }[] = [];
  #count = 0;
  #idleTimer: ReturnType<typeof setTimeout> | undefined;

  constructor(open: () => Promise<TxConn>, size: number) {
    this.#open = open;
    this.#size = size;
  }

  take(): Promise<TxConn> {
    const c = this.#idle.pop();
    if (c) return Promise.resolve(c);
    if (this.#count < this.#size) {
      this.#count++;
      return this.#open().catch((error: unknown) => {
        this.#count--;
        throw error;
      });
    }
    return new Promise((resolve, reject) => this.#waiters.push({ resolve, reject }));
  }

  give(conn: TxConn, healthy: boolean): void {
    if (!healthy) {
      // Its WATCH state is unknown (a timeout, a lost connection): replace it.
      conn.destroy();
      this.#count--;
      const next = this.#waiters.shift();
      if (next) this.take().then(next.resolve, next.reject);
      return;
    }
    const next = this.#waiters.shift();
    if (next) return next.resolve(conn);
    this.#idle.push(conn);
    if (this.#idleTimer) clearTimeout(this.#idleTimer);
    this.#idleTimer = setTimeout(() => void this.close(), IDLE_CLOSE_MS);
    this.#idleTimer.unref();
  }

  async close(): Promise<void> {
    if (this.#idleTimer) clearTimeout(this.#idleTimer);
    this.#idleTimer = undefined;
    const idle = this.#idle.splice(0);
    this.#count -= idle.length;
    await Promise.all(idle.map((c) => c.quit()));
  }
}

import type { ChainableCommander } from 'ioredis';
import { BackendUnavailableError, InvalidArgumentError, PartialWriteError, StaleTokenError } from '../core/errors.js';
import { FENCE_GUARD_OPTIONS, fenceTokenCheck, guardHandle, type Fence, type FenceGuardOptions } from '../core/fence.js';
import type { TokenInput } from '../core/token.js';
import { checkInteger, checkKey, checkKnownOptions, checkObject, describe } from '../core/validate.js';
import { Deadlines } from './deadline.js';
import { hasErrorClass, mapRedisError, replyCode } from './errors.js';
import { checkKeyPrefix, encodeKey } from './keys.js';

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
  // biome-ignore lint/suspicious/noExplicitAny: matches node-redis's EventEmitter typing
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
  // biome-ignore lint/suspicious/noExplicitAny: whatever command the caller queues
  [command: string]: any;
};

export interface RedisFenceOptions extends FenceGuardOptions {
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
 * - `mutate` gets a guarded view of the MULTI: EXEC (any variant), DISCARD, WATCH, UNWATCH, MULTI,
 *   SELECT, QUIT and RESET (as methods or raw commands) are refused with InvalidArgumentError naming
 *   `mutate`, and nothing is sent even if `mutate` caught the error; once `write` settled every call
 *   through it is refused. (An EXEC by `mutate` would run the transaction, and the fence's own EXEC
 *   would then run it again without WATCH and could lower the mark.)
 * - A queued command that Redis refuses when queueing it (unknown command, wrong arguments):
 *   Redis discards the whole transaction, nothing ran; InvalidArgumentError naming `mutate`.
 * - A queued command that fails when EXEC runs it (e.g. WRONGTYPE) does not undo the others:
 *   Redis has no rollback. `write` then rejects with PartialWriteError (PARTIAL_WRITE): the mark
 *   was raised and the other commands ran.
 * - Redis Cluster: MULTI needs one slot. The mark key is `<prefix>{<resource>}` (with `}` and `%`
 *   percent-encoded); give your data keys the same hash tag.
 * - The fence opens up to `connections` duplicates of `client` (WATCH is per connection), closes
 *   them after 10 s idle; `close()` closes them now. `client` itself stays yours.
 */
export function redisFence(client: RedisFenceClient, options?: RedisFenceOptions): Fence<RedisMulti> & { close(): Promise<void> };
export function redisFence<Multi extends NodeRedisFenceMulti = NodeRedisMulti>(
  client: NodeRedisFenceClient,
  options?: RedisFenceOptions,
): Fence<Multi> & { close(): Promise<void> };
export function redisFence(client: RedisFenceClient | NodeRedisFenceClient, options?: RedisFenceOptions): Fence<unknown> & { close(): Promise<void> } {
  const c = client as unknown as Record<string, unknown> | null;
  if (typeof c !== 'object' || c === null || typeof c.duplicate !== 'function' || typeof c.get !== 'function') {
    throw new InvalidArgumentError('client', `expected an ioredis or node-redis client (get, duplicate), got ${describe(client)}`);
  }
  const o = checkObject(options, 'options');
  checkKnownOptions(o, ['prefix', 'connections', 'commandTimeoutMs', ...FENCE_GUARD_OPTIONS], 'options');
  const readToken = fenceTokenCheck(o);
  const prefix = o.prefix === undefined ? 'leasehold:fence:' : checkKeyPrefix(o.prefix, 'options.prefix');
  const size = o.connections === undefined ? 4 : checkInteger(o.connections, 'options.connections', 1, 1_000);
  const timeoutMs = o.commandTimeoutMs === undefined ? 2_000 : checkInteger(o.commandTimeoutMs, 'options.commandTimeoutMs', 1, 600_000);
  const markKey = (resource: string): string => `${prefix}{${encodeKey(resource)}}`;
  const deadlines = new Deadlines(timeoutMs, 'redis fence');
  const call = <T>(p: Promise<T>, what: string): Promise<T> => deadlines.bound(p, what);
  // The same rule as the backends' (wrapClient): ioredis has `call`, node-redis has `sendCommand` and no `call`.
  const open =
    typeof c.call !== 'function' && typeof c.sendCommand === 'function'
      ? nodeRedisTx(client as NodeRedisFenceClient, call)
      : ioredisTx(client as RedisFenceClient, call);
  const pool = new Pool(open, size);

  return {
    async write<R>(resource: string, token: TokenInput, mutate: (tx: unknown) => R | Promise<R>, writeOptions?: unknown): Promise<R> {
      checkKey(resource, 'resource');
      const t = readToken(resource, token, writeOptions);
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
          const guard = guardHandle(tx as object, refuseRedis, REDIS_ASYNC);
          let result: R;
          try {
            result = await mutate(guard.handle);
          } catch (error) {
            await call(conn.unwatch(), 'unwatch').catch(() => (healthy = false));
            // nothing was sent: the queued commands die with tx
            throw guard.misuse ?? new MutateFailed(error);
          } finally {
            guard.revoke();
          }
          if (guard.misuse) {
            // mutate caught the refusal: send nothing all the same
            await call(conn.unwatch(), 'unwatch').catch(() => (healthy = false));
            throw guard.misuse;
          }
          const outcome = await call(conn.exec(tx), 'exec');
          if (outcome === 'conflict') {
            // The mark changed between WATCH and EXEC (another writer): nothing ran; check again.
            if (attempt >= MAX_ATTEMPTS)
              throw new BackendUnavailableError('redis fence', `write to "${resource}" kept conflicting with other writers (${attempt} tries)`);
            continue;
          }
          if (outcome !== undefined && 'discarded' in outcome) {
            const error = outcome.discarded;
            const code = replyCode(error);
            if (code === 'ERR' || code === 'EXECABORT' || code === 'CROSSSLOT') {
              throw new InvalidArgumentError('mutate', `Redis refused a command mutate queued (${error.message}) and discarded the transaction: nothing ran`, {
                cause: error,
              });
            }
            healthy = false;
            throw mapRedisError('redis fence', 'exec', error);
          }
          if (outcome !== undefined) {
            const { index, error } = outcome;
            // index 0 is the fence's own SET of the mark; mutate's commands follow
            throw new PartialWriteError(
              resource,
              t,
              `the command #${index} queued by mutate failed when EXEC ran it (${error.message}); Redis does not roll back: the mark and the other commands were applied`,
              { cause: error },
            );
          }
          return result;
        }
      } catch (error) {
        if (error instanceof MutateFailed) throw error.error; // the caller's own error, unchanged
        if (error instanceof StaleTokenError || error instanceof InvalidArgumentError || error instanceof PartialWriteError) throw error;
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
type ExecOutcome = 'conflict' | { index: number; error: Error } | { discarded: Error } | undefined;

interface TxConn {
  watch(key: string): Promise<unknown>;
  unwatch(): Promise<unknown>;
  get(key: string): Promise<string | null>;
  /** A MULTI with the mark already raised in it. */
  begin(key: string, token: string): unknown;
  exec(tx: unknown): Promise<ExecOutcome>;
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
        let replies: [Error | null, unknown][] | null;
        try {
          replies = (await (tx as RedisMulti).exec()) as [Error | null, unknown][] | null;
        } catch (error) {
          // EXECABORT: a command was refused when queued and Redis discarded the transaction
          if (replyCode(error) !== 'EXECABORT') throw error;
          const first = (error as { previousErrors?: unknown }).previousErrors;
          return { discarded: Array.isArray(first) && first[0] instanceof Error ? first[0] : (error as Error) };
        }
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
          // a command refused when queued (node-redis rejects with its reply): Redis discarded the transaction
          if (replyCode(error) !== undefined) return { discarded: error as Error };
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

/** Refused calls whose API is asynchronous: refused with a rejected promise. */
const REDIS_ASYNC: ReadonlySet<string> = new Set(['exec', 'execBuffer', 'execTyped', 'execAsPipeline', 'execAsPipelineTyped', 'EXEC']);
/** Commands that would run, drop or move the fence's transaction (or the connection it runs on). */
const REDIS_REFUSED = new Set(['exec', 'discard', 'watch', 'unwatch', 'multi', 'select', 'quit', 'reset']);
/** Methods that send a raw command named by their first argument (ioredis call/callBuffer, node-redis sendCommand/addCommand). */
const RAW_COMMAND = new Set(['call', 'callbuffer', 'sendcommand', 'addcommand']);

/** What `mutate` must not do with the MULTI: run it, drop it, watch, nest, or switch database. */
function refuseRedis(method: string, args: unknown[]): string | undefined {
  const m = method.toLowerCase();
  let command: string | undefined;
  if (m.startsWith('exec') || REDIS_REFUSED.has(m)) command = m.startsWith('exec') ? 'EXEC' : m.toUpperCase();
  else if (RAW_COMMAND.has(m)) {
    const first: unknown = Array.isArray(args[0]) ? (args[0] as unknown[])[0] : args[0];
    const name = typeof first === 'string' ? first : first instanceof Uint8Array ? Buffer.from(first).toString() : undefined;
    if (name !== undefined && REDIS_REFUSED.has(name.toLowerCase())) command = name.toUpperCase();
  }
  if (command === undefined) return undefined;
  return `mutate called ${command} on the fence's MULTI; the fence runs it with EXEC after mutate returns (refused; nothing was sent)`;
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

import { createHash } from 'node:crypto';
import { Redis, type RedisOptions } from 'ioredis';
import { BackendUnavailableError, InvalidArgumentError, LeaseholdError } from '../core/errors.js';
import { describe } from '../core/validate.js';

/**
 * The few methods leasehold calls on an ioredis client (`Redis` or `Cluster`), typed structurally
 * so any compatible client fits. Nothing is called through `instanceof`.
 */
export interface IoredisLike {
  call(command: string, ...args: (string | number)[]): Promise<unknown>;
  /** `Redis` takes option overrides (leasehold passes `{ autoResubscribe: false }`); a `Cluster` is duplicated without arguments. */
  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- Redis takes options here, Cluster its startup nodes
  duplicate(override?: any): IoredisLike;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- matches ioredis's EventEmitter typing
  on(event: string, listener: (...args: any[]) => void): unknown;
  subscribe(...channels: string[]): Promise<unknown>;
  quit(): Promise<unknown>;
  disconnect(): void;
  /** 'ready' when commands can be sent; anything else means not connected (yet or any more). */
  readonly status?: string;
  /** Set on ioredis `Cluster` clients. */
  readonly isCluster?: boolean;
  /** Cluster clients: the master nodes (SCAN runs on each). */
  nodes?(role?: 'master' | 'slave' | 'all'): IoredisLike[];
}

/** The few methods leasehold calls on a node-redis (v4 and later; tested with v6) client, typed structurally. */
export interface NodeRedisLike {
  sendCommand(args: string[]): Promise<unknown>;
  duplicate(): NodeRedisLike;
  connect(): Promise<unknown>;
  subscribe(channel: string, listener: (message: string, channel: string) => void): Promise<unknown>;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- matches node-redis's EventEmitter typing
  on(event: string, listener: (...args: any[]) => void): unknown;
  readonly isReady: boolean;
  quit?(): Promise<unknown>;
  close?(): Promise<unknown>;
  destroy?(): void;
}

/** A Redis client the user already has: ioredis (Redis or Cluster) or node-redis. */
export type RedisClientLike = IoredisLike | NodeRedisLike;

/** A subscription connection of our own, on one channel. */
export interface Subscriber {
  readonly ready: boolean;
  /** Unsubscribes politely (QUIT) for at most `timeoutMs`, then drops the socket: bounded, never rejects. */
  close(timeoutMs?: number): Promise<void>;
}

/** One Redis connection as the backends see it: raw commands, a subscriber, SCAN targets. */
export interface Conn {
  /**
   * Sends one command; rejects with the driver's error. Fails fast when the connection is down or
   * refused (with the driver's error: ECONNREFUSED…); a call in flight when the connection closes
   * fails then, with the error that closed it (see {@link Conn.explain}).
   */
  command(args: readonly string[]): Promise<unknown>;
  /**
   * The same as `command([name, ...args])`, without building the joined array, and for the hot path:
   * a rejection is the driver's own; pass it through {@link Conn.explain}.
   */
  send(name: string, args: readonly string[]): Promise<unknown>;
  /**
   * The error a caller should see for a driver's rejection: a call in flight when the connection
   * closed (ioredis says only "Reached the max retries per request limit") becomes "connection
   * closed with the call in flight: <the error that closed it>"; anything else is returned as is.
   */
  explain(error: unknown): unknown;
  /**
   * Opens a second connection subscribed to `channel`; messages go to `onMessage`. Bounded: when it
   * is not subscribed within `timeoutMs`, or `signal` aborts first, the connection is dropped and
   * the promise rejects.
   */
  subscribe(channel: string, onMessage: (message: string) => void, timeoutMs: number, signal?: AbortSignal): Promise<Subscriber>;
  /** Where SCAN must run to see every key: the masters of a cluster, or this connection. */
  scanTargets(): Conn[];
  readonly isCluster: boolean;
  /**
   * Closes the connection if we opened it (a user's client is left alone): QUIT, waited for at most
   * `timeoutMs` (a frozen server never answers it), then the socket is dropped. Never rejects.
   */
  close(timeoutMs?: number): Promise<void>;
}

/** How long `close()` waits for QUIT when no bound is given. */
export const CLOSE_TIMEOUT_MS = 2_000;

/**
 * Options of the ioredis clients leasehold creates from a URL: no offline queue and no resending
 * of unanswered commands (a dead connection fails the call at once with BackendUnavailableError
 * instead of queueing it for later, where it could grant a lease nobody waits for), reconnection
 * with capped backoff. Pass your own client (`{ client }`) for other settings, e.g. automatic pipelining.
 */
export const CLIENT_DEFAULTS: Readonly<RedisOptions> = Object.freeze({
  enableOfflineQueue: false,
  autoResendUnfulfilledCommands: false,
  maxRetriesPerRequest: 0,
  // Off: on this kind of machine it costs a sequential caller ~30 % (every command waits for the
  // next tick) and did not raise throughput of 64 concurrent loops measurably (bench/README.md).
  // The backend batches concurrent calls itself, only while the connection is busy (LuaRunner).
  enableAutoPipelining: false,
  connectTimeout: 2_000,
  // After close() gave up on QUIT (a frozen server), the socket is ended and then destroyed after
  // this long (ioredis's default, 2 s, keeps a process alive that long for nothing). A live server
  // closes its side at once, so this only matters when it does not.
  disconnectTimeout: 200,
  retryStrategy: (attempt: number) => Math.min(25 * 2 ** Math.min(attempt, 10), 1_000),
});

/** Creates an ioredis client for `url` with {@link CLIENT_DEFAULTS}. */
export function connectUrl(url: unknown, what = 'url'): Conn {
  if (typeof url !== 'string' || !/^rediss?:\/\//i.test(url)) {
    throw new InvalidArgumentError(what, `expected a redis:// or rediss:// URL, got ${describe(url)}`);
  }
  let client: Redis;
  try {
    client = new Redis(url, { ...CLIENT_DEFAULTS });
  } catch (cause) {
    throw new InvalidArgumentError(what, `cannot use ${JSON.stringify(url)}: ${(cause as Error).message}`, { cause });
  }
  return ioredisConn(client as unknown as IoredisLike, true);
}

/** Wraps a client the user passed in; throws InvalidArgumentError when it has neither shape. */
export function wrapClient(client: unknown, what = 'client'): Conn {
  const c = client as Record<string, unknown> | null;
  if (typeof c === 'object' && c !== null) {
    if (typeof c.call === 'function' && typeof c.duplicate === 'function') return ioredisConn(c as unknown as IoredisLike, false);
    if (typeof c.sendCommand === 'function' && typeof c.duplicate === 'function' && typeof c.connect === 'function') {
      return nodeRedisConn(c as unknown as NodeRedisLike, false);
    }
  }
  throw new InvalidArgumentError(what, `expected an ioredis or node-redis client (call/sendCommand and duplicate), got ${describe(client)}`);
}

function quiet(client: { on(event: string, listener: () => void): unknown }): void {
  // Connection errors surface on the commands (as BackendUnavailableError); the event itself is only noise.
  client.on('error', () => {});
}

/** Resolves once `p` settles or `ms` passed, whichever comes first; never rejects (a close that must not hang). */
function settleWithin(p: Promise<unknown> | undefined, ms: number): Promise<void> {
  if (p === undefined) return Promise.resolve();
  return new Promise<void>((resolve) => {
    const done = (): void => {
      clearTimeout(timer);
      resolve();
    };
    const timer = setTimeout(done, ms);
    p.then(done, done);
  });
}

/**
 * `p`, unless `ms` pass or `signal` aborts first: then it rejects (and `p`'s outcome is ignored).
 * For opening our own subscriber connection, which a frozen server would keep waiting for ever.
 */
function within<T>(p: Promise<T>, ms: number, signal: AbortSignal | undefined, what: string): Promise<T> {
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

/**
 * Waits for an ioredis connection's first 'ready'; rejects as soon as it closes or ends first (a
 * refused connection: with the driver's error, e.g. ECONNREFUSED) instead of waiting for the
 * reconnections.
 */
function firstReady(client: IoredisLike, lastError: () => Error | undefined, what: string): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    client.on('ready', () => resolve());
    const down = (): void => reject(lastError() ?? new Error(`${what} closed before it was ready`));
    client.on('close', down);
    client.on('end', down);
  });
}

/** An ioredis client we own: QUIT, waited for at most `timeoutMs`, then the socket is dropped (ended, destroyed if the peer does not close). */
async function closeIoredis(client: IoredisLike, timeoutMs: number): Promise<void> {
  // QUIT only makes sense on a connection that answers; otherwise it would wait, queue or fail.
  if (client.status === undefined || client.status === 'ready') await settleWithin(client.quit(), timeoutMs);
  if (client.status !== 'end') client.disconnect();
}

/** A node-redis client we own: close() (or quit()), waited for at most `timeoutMs`, then destroy(). */
async function closeNodeRedis(client: NodeRedisLike, timeoutMs: number): Promise<void> {
  let closing: Promise<unknown> | undefined;
  try {
    closing = client.close?.() ?? client.quit?.();
  } catch {
    // not open: nothing to say goodbye to
  }
  await settleWithin(closing, timeoutMs);
  try {
    client.destroy?.(); // a close() that did not finish in time is cut short; after one that did, nothing happens
  } catch {
    // already closed (older node-redis throws ClientClosedError)
  }
}

function ioredisConn(client: IoredisLike, owned: boolean): Conn {
  let everReady = client.status === 'ready';
  /** Callers waiting for the first connection (one shared promise, settled by the listeners below). */
  let waiting: { promise: Promise<void>; resolve: () => void; reject: (error: Error) => void } | undefined;
  /**
   * The driver's last connection error (ECONNREFUSED, ECONNRESET…) since the connection was last
   * ready, to tell callers why it is down. Only on connections we opened: an 'error' listener on a
   * user's client would silence ioredis's own report of unhandled errors.
   */
  let lastError: Error | undefined;
  const down = (status: string): Error => lastError ?? new Error(`connection is ${status}`);
  const settleWaiting = (error?: Error): void => {
    const w = waiting;
    waiting = undefined;
    if (w && error) w.reject(error);
    else w?.resolve();
  };
  if (owned) {
    quiet(client);
    client.on('error', (error: Error) => (lastError = error));
  }
  client.on('ready', () => {
    everReady = true;
    lastError = undefined;
    settleWaiting();
  });
  // The first connection was refused or dropped before it was ready: its waiters fail now, not at their deadline.
  client.on('close', () => settleWaiting(down('closed')));
  client.on('end', () => settleWaiting(down('ended')));

  /**
   * Before the first connection, waits for it (bounded by the caller's deadline) unless it is
   * refused or closed (then fails at once, with the driver's error); after that, a connection that
   * is not ready fails at once.
   */
  const ready = (): Promise<void> | undefined => {
    const status = client.status;
    if (status === undefined || status === 'ready') return undefined;
    if (status === 'end' || status === 'close' || status === 'reconnecting' || everReady) return Promise.reject(down(status));
    if (!waiting) {
      let resolve!: () => void;
      let reject!: (error: Error) => void;
      const promise = new Promise<void>((res, rej) => {
        resolve = res;
        reject = rej;
      });
      waiting = { promise, resolve, reject };
    }
    return waiting.promise;
  };

  /**
   * With maxRetriesPerRequest 0 (CLIENT_DEFAULTS), ioredis rejects the commands in flight when the
   * socket closes with a MaxRetriesPerRequestError, which says nothing of the connection: name the
   * loss and keep the driver's error (ECONNRESET…) as the cause.
   */
  const explain = (error: unknown): unknown => {
    if (!hasErrorClass(error, 'MaxRetriesPerRequestError')) return error;
    const why = lastError;
    return new Error(`connection closed with the call in flight${why ? `: ${why.message}` : ' (Connection is closed.)'}`, { cause: why ?? error });
  };
  const explained = (error: unknown): never => {
    throw explain(error);
  };

  const conn: Conn = {
    isCluster: client.isCluster === true,
    command(args) {
      return conn.send(args[0]!, args.slice(1)).catch(explained);
    },
    send(name, args) {
      const gate = ready();
      // ioredis flattens an array argument: one call, no spread of the arguments.
      if (!gate) return client.call(name, args as never);
      return gate.then(() => client.call(name, args as never));
    },
    explain,
    async subscribe(channel, onMessage, timeoutMs, signal) {
      // ioredis resubscribes by itself after a reconnection, but leaves a refused SUBSCRIBE (an ACL
      // change: NOPERM) as an unhandled rejection. On a single node we resubscribe ourselves instead;
      // until that succeeds the subscriber is not ready (waiters poll).
      const own = client.isCluster !== true;
      const sub = own ? client.duplicate({ autoResubscribe: false }) : client.duplicate();
      quiet(sub);
      let subError: Error | undefined;
      sub.on('error', (error: Error) => (subError = error));
      let isReady = false;
      let subscribed = false;
      sub.on('message', ((ch: string, message: string) => {
        if (ch === channel) onMessage(message);
      }) as never);
      sub.on('ready', () => {
        if (!own || !subscribed) isReady = true;
        else sub.subscribe(channel).then(() => (isReady = true), () => {});
      });
      sub.on('close', () => (isReady = false));
      try {
        const opening = (sub.status === 'ready' ? Promise.resolve() : firstReady(sub, () => subError, 'subscriber connection')).then(() => sub.subscribe(channel));
        await within(opening, timeoutMs, signal, 'subscribe');
        subscribed = true;
        isReady = true;
      } catch (error) {
        sub.disconnect();
        throw error;
      }
      return {
        get ready() {
          return isReady;
        },
        close: (closeTimeoutMs = CLOSE_TIMEOUT_MS) => closeIoredis(sub, closeTimeoutMs),
      };
    },
    scanTargets() {
      if (client.isCluster && typeof client.nodes === 'function') return client.nodes('master').map((n) => ioredisConn(n, false));
      return [conn];
    },
    async close(timeoutMs = CLOSE_TIMEOUT_MS) {
      if (!owned) return;
      await closeIoredis(client, timeoutMs);
    },
  };
  return conn;
}

function nodeRedisConn(client: NodeRedisLike, owned: boolean): Conn {
  if (owned) quiet(client);
  const conn: Conn = {
    isCluster: false,
    command(args) {
      if (!client.isReady) return Promise.reject(new Error('node-redis client is not ready'));
      return client.sendCommand([...args]);
    },
    send(name, args) {
      if (!client.isReady) return Promise.reject(new Error('node-redis client is not ready'));
      return client.sendCommand([name, ...args]);
    },
    explain: (error) => error,
    async subscribe(channel, onMessage, timeoutMs, signal) {
      const sub = client.duplicate();
      quiet(sub);
      let isReady = false;
      sub.on('ready', () => (isReady = true));
      sub.on('end', () => (isReady = false));
      sub.on('error', () => (isReady = false));
      try {
        await within(
          sub.connect().then(() => sub.subscribe(channel, (message) => onMessage(message))),
          timeoutMs, signal, 'subscribe',
        );
      } catch (error) {
        try {
          sub.destroy?.();
        } catch {
          // never opened
        }
        throw error;
      }
      isReady = true;
      return {
        get ready() {
          return isReady && sub.isReady;
        },
        close: (closeTimeoutMs = CLOSE_TIMEOUT_MS) => closeNodeRedis(sub, closeTimeoutMs),
      };
    },
    scanTargets: () => [conn],
    async close(timeoutMs = CLOSE_TIMEOUT_MS) {
      if (!owned) return;
      await closeNodeRedis(client, timeoutMs);
    },
  };
  return conn;
}

/**
 * A Lua script with its SHA1, run with EVALSHA and, when the server does not have it yet
 * (`NOSCRIPT`, the protocol's error code), with EVAL (which also caches it for next time).
 */
export class LuaScript {
  readonly sha: string;
  constructor(
    readonly name: string,
    readonly source: string,
  ) {
    this.sha = createHash('sha1').update(source).digest('hex');
  }

  async run(conn: Conn, keys: readonly string[], args: readonly string[]): Promise<unknown> {
    const tail = [String(keys.length), ...keys, ...args];
    try {
      return await conn.command(['EVALSHA', this.sha, ...tail]);
    } catch (error) {
      if (replyCode(error) !== 'NOSCRIPT') throw error;
      return conn.command(['EVAL', this.source, ...tail]);
    }
  }
}

/**
 * Runs several operations of a {@link LuaLibrary} in one call, in order, each isolated: an error
 * raised by one (a `redis.call` refused, a bug) becomes that operation's error reply and the others
 * go on. ARGV: count, then per operation its name, number of keys, number of arguments and the
 * arguments; KEYS: the keys of all operations, in order.
 */
const BATCH_LUA = `
local function op_batch(KEYS, ARGV)
  local out = {}
  local ki, ai = 1, 2
  -- one KEYS and one ARGV table for all operations, refilled (the rest cleared) for each
  local k, a, kn, an = {}, {}, 0, 0
  for i = 1, tonumber(ARGV[1]) do
    local f, nk, na = OPS[ARGV[ai]], tonumber(ARGV[ai + 1]), tonumber(ARGV[ai + 2])
    for j = 1, nk do k[j] = KEYS[ki + j - 1] end
    for j = nk + 1, kn do k[j] = nil end
    for j = 1, na do a[j] = ARGV[ai + 2 + j] end
    for j = na + 1, an do a[j] = nil end
    kn, an = nk, na
    ki, ai = ki + nk, ai + 3 + na
    local ok, r = pcall(f, k, a)
    if not ok then
      -- a refused redis.call comes as its error reply ('WRONGTYPE …'; a table on newer servers): keep its code
      if type(r) == 'table' and r.err then r = r.err end
      r = tostring(r)
      if not string.find(r, '^%u[%u_]*%s') then r = 'ERR ' .. r end
      r = { err = r }
    elseif r == nil then
      r = false
    end
    out[i] = r
  end
  return out
end`;

/**
 * The Lua operations of a backend, shipped two ways from the same text:
 * - as one Redis Functions library (Redis 7+): `FUNCTION LOAD` once per server, then `FCALL`. The
 *   shared helpers are built when the library loads, not again on every call as in a script;
 * - as one script per operation, run with EVALSHA (EVAL on NOSCRIPT), where the server has no
 *   Functions, refuses FUNCTION, or is a Redis Cluster (a library would have to be loaded on every
 *   master).
 * Each operation is the body of a Lua function of (KEYS, ARGV). The library and function names carry
 * a digest of the source, so two leasehold versions on one server never call each other's code.
 * A `batch` operation runs several operations in one call (see {@link LuaRunner}).
 */
export class LuaLibrary {
  /** Library name: `<base>_<digest of the source>`. */
  readonly name: string;
  /** The text given to FUNCTION LOAD. */
  readonly source: string;
  readonly #functions = new Map<string, string>();
  readonly #scripts = new Map<string, LuaScript>();

  constructor(base: string, prelude: string, operations: Readonly<Record<string, string>>) {
    const names = Object.keys(operations);
    for (const op of [...names, base]) {
      if (!/^[a-z][a-z0-9_]*$/.test(op)) throw new TypeError(`LuaLibrary: bad name ${JSON.stringify(op)}`);
    }
    const defs = names.map((op) => `local function op_${op}(KEYS, ARGV)\n${operations[op]}\nend`).join('\n');
    const table = `local OPS = { ${names.map((op) => `${op} = op_${op}`).join(', ')} }`;
    const version = createHash('sha1').update(`${prelude}\n${defs}\n${table}\n${BATCH_LUA}`).digest('hex').slice(0, 12);
    this.name = `${base}_${version}`;
    const registrations = [...names, 'batch'].map((op) => {
      const fn = `${this.name}_${op}`;
      this.#functions.set(op, fn);
      return `redis.register_function('${fn}', op_${op})`;
    });
    this.source = `#!lua name=${this.name}\n${prelude}\n${defs}\n${table}\n${BATCH_LUA}\n${registrations.join('\n')}\n`;
    for (const op of names) {
      this.#scripts.set(op, new LuaScript(op, `${prelude}\nlocal function op_${op}(KEYS, ARGV)\n${operations[op]}\nend\nreturn op_${op}(KEYS, ARGV)\n`));
    }
    this.#scripts.set('batch', new LuaScript('batch', `${prelude}\n${defs}\n${table}\n${BATCH_LUA}\nreturn op_batch(KEYS, ARGV)\n`));
  }

  /** The FCALL name of an operation. */
  functionName(op: string): string {
    const fn = this.#functions.get(op);
    if (fn === undefined) throw new TypeError(`LuaLibrary ${this.name}: no operation ${op}`);
    return fn;
  }

  /** The script of an operation (the fallback where Functions are not used). */
  script(op: string): LuaScript {
    const script = this.#scripts.get(op);
    if (script === undefined) throw new TypeError(`LuaLibrary ${this.name}: no operation ${op}`);
    return script;
  }
}

/** One operation of a {@link LuaRunner}: its request, its caller's promise and its deadline. */
interface Op extends Watched {
  readonly name: string;
  readonly keys: readonly string[];
  readonly args: readonly string[];
  readonly resolve: (value: unknown) => void;
  readonly onLate: ((value: unknown) => void) | undefined;
  /** Turns the reply into the caller's result (run inside the settling, no further promise); may throw. */
  readonly map: ((value: unknown) => unknown) | undefined;
}

/**
 * Runs a {@link LuaLibrary}'s operations on one connection, each bounded by a deadline (as
 * {@link deadline}, without a second promise per call).
 *
 * - Functions first (single node): FCALL. An `ERR` reply (no such function: a server restarted
 *   empty, a `FUNCTION FLUSH`; or a Redis without Functions) makes it look the library up
 *   (`FUNCTION LIST`), load it if missing and try the call once more; a server that refuses
 *   FUNCTION (Redis < 7, ACL) switches this connection to scripts for good. Nothing ran when the
 *   function was missing, and every operation is safe to run twice (the same owner asks again).
 * - Batching, only when the connection is busy: a call goes out on its own while fewer than
 *   {@link BATCH_SIZE} are in flight (a sequential caller, or a few concurrent ones, never wait for
 *   anything). Beyond that, calls are queued and sent together as one `batch` call — one command,
 *   one write and one reply for all of them, executed in the order they were made — as soon as
 *   {@link BATCH_SIZE} are queued, the rest at the end of the current tick. Small batches sent
 *   early keep Redis working on one while the next is being made; waiting for the end of the tick
 *   instead turned 64 concurrent callers into lockstep waves (one batch of 64 in flight, Node and
 *   Redis taking turns, about 40 % slower), and batching from the first call in flight made 4
 *   concurrent callers a third slower than no batching at all. Off on a Cluster (the keys of a
 *   batch would span slots).
 */
export class LuaRunner {
  readonly #conn: Conn;
  readonly #lib: LuaLibrary;
  readonly #batching: boolean;
  readonly #timeoutMs: number;
  readonly #backend: string;
  #functions: boolean;
  #loading: Promise<void> | undefined;
  #inFlight = 0;
  #queue: Op[] = [];
  #scheduled = false;

  constructor(conn: Conn, lib: LuaLibrary, options: { batching: boolean; timeoutMs: number; backend: string }) {
    this.#conn = conn;
    this.#lib = lib;
    this.#functions = !conn.isCluster;
    this.#batching = options.batching && !conn.isCluster;
    this.#timeoutMs = options.timeoutMs;
    this.#backend = options.backend;
  }

  /** True while operations go through FCALL (false after falling back to scripts). */
  get usesFunctions(): boolean {
    return this.#functions;
  }

  /**
   * Runs one operation. Resolves with `map(reply)` (the reply itself without `map`); rejects with a
   * LeaseholdError ({@link mapRedisError}; also what `map` throws), or BackendUnavailableError after
   * the deadline; an answer after that goes to `onLate`.
   */
  run<T = unknown, R = T>(name: string, keys: readonly string[], args: readonly string[], what: string, onLate?: (value: T) => void, map?: (value: T) => R): Promise<R> {
    return new Promise<R>((resolve, reject) => {
      const op: Op = {
        at: performance.now() + this.#timeoutMs, list: watchList(this.#timeoutMs), backend: this.#backend, what, reject, live: true,
        prev: undefined, next: undefined, name, keys, args, resolve: resolve as (value: unknown) => void, onLate: onLate as ((value: unknown) => void) | undefined,
        map: map as ((value: unknown) => unknown) | undefined,
      };
      watch(op);
      if (!this.#batching || (this.#inFlight < BATCH_SIZE && this.#queue.length === 0)) {
        this.#one(op);
        return;
      }
      const queue = this.#queue;
      queue.push(op);
      if (queue.length >= BATCH_SIZE) {
        this.#queue = [];
        this.#batch(queue);
      } else if (!this.#scheduled) {
        this.#scheduled = true;
        process.nextTick(this.#flush);
      }
    });
  }

  readonly #flush = (): void => {
    this.#scheduled = false;
    const queue = this.#queue;
    if (queue.length === 0) return;
    this.#queue = [];
    this.#batch(queue);
  };

  #one(op: Op): void {
    this.#inFlight++;
    this.#send(op.name, op.keys, op.args).then(
      (value) => {
        this.#inFlight--;
        settle(op, value);
      },
      (error: unknown) => {
        this.#inFlight--;
        this.#recover(error, op.name, op.keys, op.args).then(
          (value) => settle(op, value),
          (e: unknown) => fail(op, e),
        );
      },
    );
  }

  #batch(ops: Op[]): void {
    if (ops.length === 1) return this.#one(ops[0]!);
    const keys: string[] = [];
    const args: string[] = [String(ops.length)];
    for (const op of ops) {
      args.push(op.name, String(op.keys.length), String(op.args.length));
      for (const k of op.keys) keys.push(k);
      for (const a of op.args) args.push(a);
    }
    const answer = (replies: unknown): void => {
      const all = Array.isArray(replies) ? replies : [];
      for (let i = 0; i < ops.length; i++) {
        const r: unknown = all[i];
        if (r instanceof Error) fail(ops[i]!, r);
        else if (i < all.length) settle(ops[i]!, r);
        else fail(ops[i]!, new Error(`batch: ${all.length} replies for ${ops.length} operations`));
      }
    };
    const failAll = (error: unknown): void => {
      for (const op of ops) fail(op, error);
    };
    this.#inFlight++;
    this.#send('batch', keys, args).then(
      (replies) => {
        this.#inFlight--;
        answer(replies);
      },
      (error: unknown) => {
        this.#inFlight--;
        this.#recover(error, 'batch', keys, args).then(answer, failAll);
      },
    );
  }

  /** Never throws: a failure to send (a driver throwing, an unknown operation) is a rejection like any other. */
  #send(name: string, keys: readonly string[], args: readonly string[]): Promise<unknown> {
    try {
      if (!this.#functions) return this.#lib.script(name).run(this.#conn, keys, args);
      return this.#conn.send('FCALL', [this.#lib.functionName(name), String(keys.length)].concat(keys, args));
    } catch (error) {
      return Promise.reject(error);
    }
  }

  /** The failure path of a call: reload the library or switch to scripts and try again, or fail (with the connection's error, {@link Conn.explain}). */
  async #recover(error: unknown, name: string, keys: readonly string[], args: readonly string[]): Promise<unknown> {
    try {
      if (!this.#functions) throw error;
      const code = replyCode(error);
      if (code === 'NOPERM') this.#functions = false; // FCALL itself refused by an ACL: scripts may be allowed
      else if (code === 'ERR') await (this.#loading ??= this.#load().finally(() => (this.#loading = undefined)));
      else throw error;
      return await this.#send(name, keys, args);
    } catch (e) {
      throw this.#conn.explain(e);
    }
  }

  /** Loads the library if the server does not have it; a server that refuses FUNCTION gets scripts instead. */
  async #load(): Promise<void> {
    try {
      const listed = await this.#conn.send('FUNCTION', ['LIST', 'LIBRARYNAME', this.#lib.name]);
      if (Array.isArray(listed) && listed.length > 0) return;
      await this.#conn.send('FUNCTION', ['LOAD', 'REPLACE', this.#lib.source]);
    } catch (error) {
      // A reply (unknown command, NOPERM, a read-only replica…) means FUNCTION is not for us; anything else is the connection's trouble.
      if (replyCode(error) === undefined) throw error;
      this.#functions = false;
    }
  }
}

/**
 * Calls go out one by one while fewer than this many are in flight; beyond that they are batched,
 * and a batch is sent as soon as it has this many operations. Measured on a 2-core machine with
 * 4, 8, 16 and 64 concurrent acquire+release loops, thresholds of 1, 4, 8 and 16: 4 was the best
 * or close to it everywhere (4 loops: +40 % over batching from the first call in flight; 64 loops:
 * 63–69k pairs/s, about 1.6× end-of-tick batches). It also bounds how long one batch, which runs
 * atomically, holds the server.
 */
export const BATCH_SIZE = 4;

function settle(op: Op, value: unknown): void {
  if (!op.live) op.onLate?.(value);
  else {
    unwatch(op);
    if (op.map === undefined) op.resolve(value);
    else {
      let result: unknown;
      try {
        result = op.map(value);
      } catch (error) {
        op.reject(mapRedisError(op.backend, op.what, error));
        return;
      }
      op.resolve(result);
    }
  }
}

function fail(op: Op, error: unknown): void {
  if (op.live) {
    unwatch(op);
    op.reject(mapRedisError(op.backend, op.what, error));
  }
}

/**
 * True when `error` is an instance of a class named one of `names` (found on its prototype chain):
 * how driver errors are told apart without importing the drivers (their `name` cannot be relied
 * on: node-redis leaves it at 'Error').
 */
export function hasErrorClass(error: unknown, ...names: string[]): boolean {
  if (!(error instanceof Error)) return false;
  for (let p: unknown = Object.getPrototypeOf(error); p !== null && p !== Error.prototype; p = Object.getPrototypeOf(p)) {
    const name = (p as { constructor?: { name?: unknown } }).constructor?.name;
    if (typeof name === 'string' && names.includes(name)) return true;
  }
  return false;
}

/**
 * The error code of a Redis error reply: its first word (`NOSCRIPT`, `WRONGTYPE`, `CROSSSLOT`…),
 * which the protocol defines as the error's kind. Undefined for errors that are not replies
 * (connection loss, timeouts), whatever their message says. A reply error is an ioredis
 * `ReplyError` (redis-errors) or a node-redis `ErrorReply` (v4+; v5's `SimpleError` and
 * `BlobError` extend it); error elements inside an array reply (a batch) are the same classes.
 * The one place replies are classified.
 */
export function replyCode(error: unknown): string | undefined {
  if (!hasErrorClass(error, 'ReplyError', 'ErrorReply')) return undefined;
  return /^([A-Z][A-Z_]*)(?:\s|$)/.exec((error as Error).message)?.[1];
}

/** Maps a driver error to a LeaseholdError: data of another type at our key → InvalidArgumentError, the rest → BackendUnavailableError. */
export function mapRedisError(backend: string, what: string, error: unknown): LeaseholdError {
  if (error instanceof LeaseholdError) return error;
  const message = error instanceof Error ? error.message : String(error);
  switch (replyCode(error)) {
    case 'WRONGTYPE':
      return new InvalidArgumentError('key', `${what}: a Redis key leasehold uses holds a value of another type (is the prefix shared with other data?): ${message}`, { cause: error });
    case 'CROSSSLOT':
      return new InvalidArgumentError('options.sessions', `${what}: keys of different cluster slots in one script; sessions need a single Redis node (pass sessions: false on Redis Cluster): ${message}`, { cause: error });
    default:
      return new BackendUnavailableError(backend, `${what} failed: ${message}`, { cause: error });
  }
}

/**
 * Bounds a Redis call: after `ms` it rejects with BackendUnavailableError (a dead or half-open
 * connection must not hang a caller). A late answer goes to `onLate` (e.g. give back a grant).
 * One shared, unref'd sweep timer watches every call in flight (cheaper than a timer per call);
 * a call is timed out between `ms` and `ms` + the sweep interval after it started.
 *
 * Calls in flight are kept in one doubly linked list per timeout value, in start order, so a
 * settled call unlinks itself in O(1) and the sweep only looks at the oldest ones. (A Set of
 * entries did the same job but, under 64 concurrent callers, made every young-generation GC
 * copy and scan far more: 3–17 ms per scavenge instead of about 1 ms.)
 */
export function deadline<T>(promise: Promise<T>, ms: number, backend: string, what: string, onLate?: (value: T) => void): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const entry: Watched = { at: performance.now() + ms, list: watchList(ms), backend, what, reject, live: true, prev: undefined, next: undefined };
    watch(entry);
    promise.then(
      (value) => {
        if (!entry.live) onLate?.(value);
        else {
          unwatch(entry);
          resolve(value);
        }
      },
      (error: unknown) => {
        if (entry.live) {
          unwatch(entry);
          reject(mapRedisError(backend, what, error));
        }
      },
    );
  });
}

/** A call watched for its deadline; `live` turns false when it settles or times out. */
interface Watched {
  readonly at: number;
  readonly list: WatchList;
  readonly backend: string;
  readonly what: string;
  readonly reject: (error: unknown) => void;
  live: boolean;
  prev: Watched | undefined;
  next: Watched | undefined;
}

interface WatchList {
  readonly ms: number;
  head: Watched | undefined;
  tail: Watched | undefined;
}

const lists = new Map<number, WatchList>();
let watching = 0;
let sweeper: ReturnType<typeof setInterval> | undefined;
let sweepEvery = Infinity;

function watchList(ms: number): WatchList {
  let list = lists.get(ms);
  if (!list) lists.set(ms, (list = { ms, head: undefined, tail: undefined }));
  return list;
}

function watch(entry: Watched): void {
  const list = entry.list;
  entry.prev = list.tail;
  if (list.tail) list.tail.next = entry;
  else list.head = entry;
  list.tail = entry;
  watching++;
  // Sweep at a tenth of the shortest deadline in use (at least every 5 ms, at most every 100 ms).
  const every = Math.min(100, Math.max(5, Math.floor(list.ms / 10)));
  if (!sweeper || every < sweepEvery) {
    if (sweeper) clearInterval(sweeper);
    sweepEvery = every;
    sweeper = setInterval(sweep, every);
    sweeper.unref();
  }
}

function unwatch(entry: Watched): void {
  entry.live = false;
  const list = entry.list;
  if (entry.prev) entry.prev.next = entry.next;
  else list.head = entry.next;
  if (entry.next) entry.next.prev = entry.prev;
  else list.tail = entry.prev;
  entry.prev = entry.next = undefined;
  watching--;
}

function sweep(): void {
  const now = performance.now();
  for (const list of lists.values()) {
    // Entries of one list started in order and share one timeout: the expired ones are at the head.
    while (list.head && list.head.at <= now) {
      const entry = list.head;
      unwatch(entry);
      entry.reject(new BackendUnavailableError(entry.backend, `${entry.what} got no answer within ${list.ms} ms`));
    }
  }
  if (watching === 0 && sweeper) {
    clearInterval(sweeper);
    sweeper = undefined;
    sweepEvery = Infinity;
  }
}

/**
 * Lock keys carry the user's key inside a hash tag, `{…}`, so every key of one lock lands in one
 * Redis Cluster slot. `}` and `%` are percent-encoded so the tag always ends where we put it;
 * the mapping is character-wise, so a prefix of the key encodes to a prefix of its encoding.
 */
export function encodeKey(key: string): string {
  if (!key.includes('%') && !key.includes('}')) return key;
  return key.replace(/[%}]/g, (c) => (c === '%' ? '%25' : '%7D'));
}

export function decodeKey(encoded: string): string {
  return encoded.replace(/%25|%7D/g, (m) => (m === '%25' ? '%' : '}'));
}

/** Escapes a literal for a SCAN MATCH glob. */
export function globEscape(literal: string): string {
  return literal.replace(/[*?[\]\\]/g, '\\$&');
}

/** A key prefix: printable, at most 100 characters, without `{` or `}` (they would move the hash tag). */
export function checkKeyPrefix(value: unknown, argument: string): string {
  if (typeof value !== 'string' || value.length > 100 || /[{}\x00-\x1f\x7f]/.test(value)) {
    throw new InvalidArgumentError(argument, `expected up to 100 printable characters without { or }, got ${describe(value)}`);
  }
  return value;
}

/** Reads an integer reply element (a number or a decimal string). */
export function int(value: unknown): number {
  return typeof value === 'number' ? value : Number(value);
}

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
  duplicate(): IoredisLike;
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

/** The few methods leasehold calls on a node-redis (v4, v5) client, typed structurally. */
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
  close(): Promise<void>;
}

/** One Redis connection as the backends see it: raw commands, a subscriber, SCAN targets. */
export interface Conn {
  /** Sends one command; rejects with the driver's error. Fails fast when the connection is down. */
  command(args: readonly string[]): Promise<unknown>;
  /** Opens a second connection subscribed to `channel`; messages go to `onMessage`. */
  subscribe(channel: string, onMessage: (message: string) => void): Promise<Subscriber>;
  /** Where SCAN must run to see every key: the masters of a cluster, or this connection. */
  scanTargets(): Conn[];
  readonly isCluster: boolean;
  /** Closes the connection if we opened it; a user's client is left alone. */
  close(): Promise<void>;
}

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
  enableAutoPipelining: false,
  connectTimeout: 2_000,
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

function ioredisConn(client: IoredisLike, owned: boolean): Conn {
  let everReady = client.status === 'ready';
  let waiting: Promise<void> | undefined;
  if (owned) quiet(client);
  client.on('ready', () => {
    everReady = true;
  });

  /** Before the first connection, waits for it (bounded by the caller's deadline); after that, a down connection fails at once. */
  const ready = (): Promise<void> | undefined => {
    const status = client.status;
    if (status === undefined || status === 'ready') return undefined;
    if (status === 'end' || status === 'close') return Promise.reject(new Error(`connection is ${status}`));
    if (everReady || status === 'reconnecting') return Promise.reject(new Error(`connection is ${status}`));
    return (waiting ??= new Promise<void>((resolve, reject) => {
      client.on('ready', () => {
        waiting = undefined;
        resolve();
      });
      client.on('end', () => reject(new Error('connection ended')));
    }));
  };

  const conn: Conn = {
    isCluster: client.isCluster === true,
    command(args) {
      const gate = ready();
      const [name, ...rest] = args as [string, ...string[]];
      if (!gate) return client.call(name, ...rest);
      return gate.then(() => client.call(name, ...rest));
    },
    async subscribe(channel, onMessage) {
      const sub = client.duplicate();
      quiet(sub);
      let isReady = false;
      sub.on('message', ((ch: string, message: string) => {
        if (ch === channel) onMessage(message);
      }) as never);
      sub.on('ready', () => (isReady = true));
      sub.on('close', () => (isReady = false));
      try {
        if (sub.status !== 'ready') {
          await new Promise<void>((resolve, reject) => {
            sub.on('ready', () => resolve());
            sub.on('end', () => reject(new Error('subscriber connection ended')));
          });
        }
        await sub.subscribe(channel);
        isReady = true;
      } catch (error) {
        sub.disconnect();
        throw error;
      }
      return {
        get ready() {
          return isReady;
        },
        async close() {
          await sub.quit().catch(() => sub.disconnect());
        },
      };
    },
    scanTargets() {
      if (client.isCluster && typeof client.nodes === 'function') return client.nodes('master').map((n) => ioredisConn(n, false));
      return [conn];
    },
    async close() {
      if (!owned) return;
      await client.quit().catch(() => {});
      client.disconnect();
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
    async subscribe(channel, onMessage) {
      const sub = client.duplicate();
      quiet(sub);
      let isReady = false;
      sub.on('ready', () => (isReady = true));
      sub.on('end', () => (isReady = false));
      sub.on('error', () => (isReady = false));
      await sub.connect();
      await sub.subscribe(channel, (message) => onMessage(message));
      isReady = true;
      return {
        get ready() {
          return isReady && sub.isReady;
        },
        async close() {
          try {
            if (sub.close) await sub.close();
            else if (sub.quit) await sub.quit();
          } catch {
            sub.destroy?.();
          }
        },
      };
    },
    scanTargets: () => [conn],
    async close() {
      if (!owned) return;
      await (client.close?.() ?? client.quit?.())?.catch(() => {});
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
 * The error code of a Redis error reply: its first word (`NOSCRIPT`, `WRONGTYPE`, `CROSSSLOT`…),
 * which the protocol defines as the error's kind. Undefined for errors that are not replies
 * (connection loss, timeouts).
 */
export function replyCode(error: unknown): string | undefined {
  if (!(error instanceof Error)) return undefined;
  const name = error.name;
  if (name !== 'ReplyError' && name !== 'ErrorReply' && name !== 'SimpleError' && name !== 'BlobError') return undefined;
  return /^([A-Z][A-Z_]*)(?:\s|$)/.exec(error.message)?.[1];
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
 */
export function deadline<T>(promise: Promise<T>, ms: number, backend: string, what: string, onLate?: (value: T) => void): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const entry: Watched = {
      at: performance.now() + ms,
      expire: () => reject(new BackendUnavailableError(backend, `${what} got no answer within ${ms} ms`)),
    };
    watch(entry, ms);
    promise.then(
      (value) => {
        if (!inFlight.delete(entry)) onLate?.(value);
        else resolve(value);
      },
      (error: unknown) => {
        if (inFlight.delete(entry)) reject(mapRedisError(backend, what, error));
      },
    );
  });
}

interface Watched {
  readonly at: number;
  readonly expire: () => void;
}

const inFlight = new Set<Watched>();
let sweeper: ReturnType<typeof setInterval> | undefined;
let sweepEvery = Infinity;

function watch(entry: Watched, ms: number): void {
  inFlight.add(entry);
  // Sweep at a tenth of the shortest deadline in use (at least every 5 ms, at most every 100 ms).
  const every = Math.min(100, Math.max(5, Math.floor(ms / 10)));
  if (sweeper && every >= sweepEvery) return;
  if (sweeper) clearInterval(sweeper);
  sweepEvery = every;
  sweeper = setInterval(sweep, every);
  sweeper.unref();
}

function sweep(): void {
  const now = performance.now();
  for (const entry of inFlight) {
    if (entry.at <= now) {
      inFlight.delete(entry);
      entry.expire();
    }
  }
  if (inFlight.size === 0 && sweeper) {
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

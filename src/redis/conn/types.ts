/**
 * What the Redis backends and the fence need of a connection, and the two client shapes a user may
 * pass in. The adapters are `conn/ioredis.ts` and `conn/node-redis.ts`; `conn/open.ts` picks one.
 */

/**
 * The few methods leasehold calls on an ioredis client (`Redis` or `Cluster`), typed structurally
 * so any compatible client fits. Nothing is called through `instanceof`.
 */
export interface IoredisLike {
  call(command: string, ...args: (string | number)[]): Promise<unknown>;
  /** `Redis` takes option overrides (leasehold passes `{ autoResubscribe: false }`); a `Cluster` is duplicated without arguments. */
  // biome-ignore lint/suspicious/noExplicitAny: Redis takes options here, Cluster its startup nodes
  duplicate(override?: any): IoredisLike;
  // biome-ignore lint/suspicious/noExplicitAny: matches ioredis's EventEmitter typing
  on(event: string, listener: (...args: any[]) => void): unknown;
  subscribe(...channels: string[]): Promise<unknown>;
  unsubscribe(...channels: string[]): Promise<unknown>;
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
  unsubscribe(channel: string): Promise<unknown>;
  // biome-ignore lint/suspicious/noExplicitAny: matches node-redis's EventEmitter typing
  on(event: string, listener: (...args: any[]) => void): unknown;
  readonly isReady: boolean;
  quit?(): Promise<unknown>;
  close?(): Promise<unknown>;
  destroy?(): void;
}

/** A Redis client the user already has: ioredis (Redis or Cluster) or node-redis. */
export type RedisClientLike = IoredisLike | NodeRedisLike;

/** A subscription connection of our own: the channel it was opened with, and others added later. */
export interface Subscriber {
  readonly ready: boolean;
  /** Subscribes one more channel on this connection (its messages go to the same `onMessage`); kept across reconnections. */
  add(channel: string): Promise<void>;
  /** Unsubscribes a channel added with `add`; never rejects (a connection that is down has no subscription to end). */
  remove(channel: string): Promise<void>;
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
   * Opens a second connection subscribed to `channel`; messages (of it and of channels added later)
   * go to `onMessage` with their channel. Bounded: when it is not subscribed within `timeoutMs`, or
   * `signal` aborts first, the connection is dropped and the promise rejects.
   */
  subscribe(channel: string, onMessage: (message: string, channel: string) => void, timeoutMs: number, signal?: AbortSignal): Promise<Subscriber>;
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

import { randomBytes } from 'node:crypto';
import type { Backend } from '../core/backend.js';
import { BackendUnavailableError, InvalidArgumentError } from '../core/errors.js';
import { checkBoolean, checkInteger, checkKnownOptions, checkObject, MAX_DURATION_MS } from '../core/validate.js';
import { connectUrl, wrapClient } from './conn/open.js';
import type { RedisClientLike } from './conn/types.js';
import { Deadlines } from './deadline.js';
import { checkKeyPrefix, lockKeyOf } from './keys.js';
import { LuaRunner } from './lua/runner.js';
import { acquire } from './ops/acquire.js';
import { cancelWait } from './ops/cancel.js';
import type { OpContext } from './ops/context.js';
import { inspect } from './ops/inspect.js';
import { REDIS_LIBRARY } from './ops/library.js';
import { release } from './ops/release.js';
import { renew } from './ops/renew.js';
import { sessionSupport } from './ops/sessions.js';
import { KeyWatches } from './ops/watch.js';
import { isWakeCursor, WakeHub } from './wake-hub.js';

export { REDIS_LIBRARY };

export interface RedisBackendOptions {
  /**
   * `redis://…` or `rediss://…`; leasehold opens (and closes) its own ioredis connections. Give this
   * or `client`. A database in the path (`/N`) or in `?db=N` must be a number, and the server must
   * have it: checked on first use (InvalidArgumentError), since Redis would otherwise carry on in
   * database 0.
   */
  url?: string;
  /**
   * An ioredis (`Redis` or `Cluster`) or node-redis client you already have; it stays yours (never
   * closed). Leave ioredis's `enableAutoPipelining` off on it: leasehold batches concurrent calls
   * itself, and auto-pipelining only adds a tick and a pipeline object to each call (measured:
   * about 40 % slower in sequence, and slower with 64 concurrent callers too).
   */
  client?: RedisClientLike;
  /** Prepended to every Redis key and channel leasehold uses; must not contain `{` or `}`. @default 'leasehold:' */
  prefix?: string;
  /**
   * One keep-alive per client keeps all its leases (a session key each lock refers to). Sessions
   * need a single Redis node: a lock and its holder's session live in different cluster slots.
   * @default true, false on a Redis Cluster client
   */
  sessions?: boolean;
  /**
   * The time limit of a call: each call of this backend (acquire, renew, release, a session's
   * keep-alive, giving up a place) is one Redis round trip, and fails with BackendUnavailableError
   * "<call> got no answer within N ms" when this passes without an answer (an answer that comes
   * later is dealt with here: a late grant is given back). A queued acquire that first opens this
   * client's wake-up subscriber waits for it at most this long too; inspect is bounded per SCAN page
   * and per key; close() waits this long for QUIT, then drops the sockets.
   *
   * This is the one bound a Redis call meets. `Locks` also bounds every backend call, for backends
   * without a limit of their own (`operationTimeoutMs`, 5 s); keep this below that (the default
   * is), and core's bound never fires on Redis; set above it, core's fires first instead.
   * @default 2000
   */
  commandTimeoutMs?: number;
  /**
   * How long an idle lock's token counter is kept after its last holder, waiter and lock-delay are
   * gone. Past it the key is garbage-collected and the next token comes from the server clock
   * floor alone (see {@link redisBackend}). @default 3600000 (1 hour)
   */
  retainMs?: number;
}

/** Defaults, each with its reason. */
export const REDIS_DEFAULTS = Object.freeze({
  prefix: 'leasehold:',
  /**
   * 2 s: far above a healthy round trip, well below any sane ttl, and below core's 5 s operation
   * bound, so it is the limit a Redis call meets and the number its error names.
   */
  commandTimeoutMs: 2_000,
  /** 1 h: a clock step back shorter than this cannot bring tokens back even for a key idle that long. */
  retainMs: 3_600_000,
});

/**
 * Leases on one Redis server (or one Redis Cluster, without sessions).
 *
 * - One round trip per acquire, renew, release and session keep-alive: one call each, to a function
 *   of the leasehold Functions library (FCALL; loaded on first use, and again if the server lost
 *   it), or to a script (EVALSHA, EVAL on NOSCRIPT) where the server has no Functions or refuses
 *   them, and on a Cluster. Calls made while others are in flight go out together in batches
 *   (see `lua/runner.ts`). Expiry is judged inside the calls by the server's TIME (I7); key TTLs
 *   are garbage collection only. Release is compare-and-delete on owner and token (I4). Each
 *   operation's script, with its KEYS, ARGV and reply, is in its module under `ops/`.
 * - Tokens: a grant's token is max(counter + 1, server TIME in µs), raised in the grant's script
 *   (I1, I2). Assumption, stated exactly: when the counter is lost (a restart without
 *   persistence, a failover to a replica that missed the last writes, or a key idle longer than
 *   `retainMs`), the next token is still larger than every earlier one provided the clock of the
 *   server that issues it reads later than the clock of the server that issued the key's previous
 *   grant read at that grant. After a restart that is one machine's clock, which must not step
 *   back across the loss by more than the time since that grant; after a failover it compares the
 *   new primary's clock with the old primary's, so the replica's clock may lag the old primary's
 *   by less than the time from that grant to the first grant after the failover. (A counter only
 *   runs ahead of TIME when one key is granted more than once per microsecond, which one script
 *   per grant cannot do.)
 * - Waiting without polling: a waiter is enqueued by its busy answer with this client's channel;
 *   release, cancel and shared grants serve the head waiter only (no herd): one that asked with a
 *   session is granted the key in that same call and its message carries the grant (see
 *   `Backend.subscribe`), so a hand-off is one hop; any other is told to ask. FIFO, and a releaser
 *   or a `tryAcquire` cannot barge past waiters. Expiry has no event in Redis: the busy answer's
 *   `retryInMs` and core's bounded re-check cover it and lost messages.
 * - Sessions: one keep-alive per client and ttl keeps all of its leases (a lock refers to its
 *   session; a lock whose session is gone is free). Single node only (see `sessions`).
 * - Semaphore permits: the holder record carries the limit; the grant's script checks it, the
 *   count and the queue (the first limit − holders permit waiters), and release hands a freed
 *   permit to the head permit waiter (see `ops/acquire.ts`, `ops/queue.ts`).
 * - Watches (`watch`): a watched key's operations PUBLISH its changes; unwatched keys cost nothing
 *   (see `ops/watch.ts`).
 *
 * The closed state and inspect's order are core's (`guardBackend`): used directly, a closed
 * backend's calls fail on its closed connection.
 */
export function redisBackend(options: RedisBackendOptions): Backend {
  return openRedisBackend(options, 'options.url');
}

/** The backend of a `redis://` URL given to `createLocks({ url })` (or LEASEHOLD_URL): errors about the URL name `url`. */
export function redisBackendFromUrl(url: string): Backend {
  return openRedisBackend({ url }, 'url');
}

function openRedisBackend(options: RedisBackendOptions, urlArgument: string): Backend {
  const o = checkObject(options, 'options');
  checkKnownOptions(o, ['url', 'client', 'prefix', 'sessions', 'commandTimeoutMs', 'retainMs'], 'options');
  if ((o.url === undefined) === (o.client === undefined)) throw new InvalidArgumentError('options', 'give exactly one of url or client');
  const prefix = o.prefix === undefined ? REDIS_DEFAULTS.prefix : checkKeyPrefix(o.prefix, 'options.prefix');
  const commandTimeoutMs =
    o.commandTimeoutMs === undefined ? REDIS_DEFAULTS.commandTimeoutMs : checkInteger(o.commandTimeoutMs, 'options.commandTimeoutMs', 1, MAX_DURATION_MS);
  const retainMs = o.retainMs === undefined ? REDIS_DEFAULTS.retainMs : checkInteger(o.retainMs, 'options.retainMs', 60_000, MAX_DURATION_MS);
  const conn = o.url !== undefined ? connectUrl(o.url, urlArgument) : wrapClient(o.client, 'options.client');
  const withSessions = o.sessions === undefined ? !conn.isCluster : checkBoolean(o.sessions, 'options.sessions');

  const deadlines = new Deadlines(commandTimeoutMs, 'redis');
  const ctx: OpContext = {
    conn,
    runner: new LuaRunner(conn, REDIS_LIBRARY, { deadlines, backend: 'redis', batching: true }),
    deadlines,
    prefix,
    sessionPrefix: `${prefix}session:`,
    retain: String(retainMs),
    lockKey: (key) => lockKeyOf(prefix, key),
  };
  const wakes = new WakeHub(conn, { channel: `${prefix}wake:${randomBytes(12).toString('hex')}`, timeoutMs: commandTimeoutMs });
  const watches = new KeyWatches(ctx, wakes);
  /** Stops close() from closing twice (core's guard does that too; a direct user may not have it). */
  let closed = false;

  const backend: Backend = {
    name: 'redis',
    capabilities: Object.freeze({ fair: true, minTtlMs: 0, keepablePlaces: 'without-session' }),

    acquire(req) {
      if (!req.queue) return acquire(ctx, req, undefined);
      // Queued waiters are told on this client's channel, once it is subscribed (the first time: wait for it).
      const ready = wakes.ready();
      if (typeof ready === 'boolean') return acquire(ctx, req, ready ? wakes : undefined);
      return ready.then((ok) => acquire(ctx, req, ok ? wakes : undefined));
    },

    renew: (req) => renew(ctx, req),
    release: (req) => release(ctx, req),
    cancelWait: (req) => cancelWait(ctx, wakes, req),

    async subscribe(_key, onChange, cursor) {
      // Only queued waiters are told (the head, on its own channel); others poll with backoff.
      if (!isWakeCursor(cursor)) throw new BackendUnavailableError('redis', 'wake-ups are sent to queued (fair) waiters only; polling instead');
      return wakes.register(cursor.wake, onChange);
    },

    inspect: (prefixOfKeys) => inspect(ctx, prefixOfKeys),

    watch: watches.watch,

    /**
     * Bounded even against a server that accepts connections and never answers: QUIT on each of our
     * connections (this one and the wake-up subscriber) is waited for at most `commandTimeoutMs`,
     * then the sockets are dropped. A client passed in stays open.
     */
    async close() {
      if (closed) return;
      closed = true;
      watches.close();
      await Promise.all([wakes.close(), conn.close(commandTimeoutMs)]);
    },
  };
  if (withSessions) backend.sessions = sessionSupport(ctx);
  return backend;
}

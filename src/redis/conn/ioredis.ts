import { Redis, type RedisOptions } from '../driver.js';
import { InvalidArgumentError } from '../../core/errors.js';
import { hasErrorClass, replyCode } from '../errors.js';
import { quiet, settleWithin, within } from './bounded.js';
import { CLOSE_TIMEOUT_MS, type Conn, type IoredisLike } from './types.js';

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

/**
 * An ioredis client of our own for `url` ({@link CLIENT_DEFAULTS}). `db` is the database the URL
 * selects: when it is not 0 the connection asks for it once more before its first command (see
 * {@link ioredisConn}); `argument` names the URL in errors.
 */
export function openIoredis(url: string, db: number, argument: string): Conn {
  let client: Redis;
  try {
    client = new Redis(url, { ...CLIENT_DEFAULTS });
  } catch (cause) {
    throw new InvalidArgumentError(argument, `cannot use ${JSON.stringify(url)}: ${(cause as Error).message}`, { cause });
  }
  return ioredisConn(client as unknown as IoredisLike, true, db > 0 ? { db, argument } : undefined);
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

/**
 * Redis answers a SELECT of a database it does not have (beyond its `databases` setting, 16 by
 * default) with an error that ioredis only emits as an event, and then runs every command in
 * database 0. So a connection of ours whose URL names a database asks for it once more, itself,
 * before its first command: an error reply is the URL's fault (InvalidArgumentError naming
 * `argument`, not retried, and every later call fails the same way); a connection that fails
 * instead is the server's trouble (the call fails as any other would, and the next one asks again).
 */
function databaseCheck(client: IoredisLike, db: number, argument: string): () => Promise<void> | undefined {
  let refused: InvalidArgumentError | undefined;
  let passed = false;
  let checking: Promise<void> | undefined;
  return () => {
    if (passed) return undefined;
    if (refused) return Promise.reject(refused);
    return (checking ??= client.call('SELECT', String(db)).then(
      () => {
        passed = true;
        checking = undefined;
      },
      (error: unknown) => {
        checking = undefined;
        if (replyCode(error) === undefined) throw error;
        refused = new InvalidArgumentError(argument, `it selects database ${db}, which the server refuses: ${(error as Error).message}`, { cause: error });
        throw refused;
      },
    ));
  };
}

/** A {@link Conn} over an ioredis client; `owned`: we opened it (and close it); `select`: the database its URL names (checked on first use). */
export function ioredisConn(client: IoredisLike, owned: boolean, select?: { db: number; argument: string }): Conn {
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
  const checkDatabase = select === undefined ? () => undefined : databaseCheck(client, select.db, select.argument);

  /**
   * Before the first connection, waits for it (bounded by the caller's deadline) unless it is
   * refused or closed (then fails at once, with the driver's error); after that, a connection that
   * is not ready fails at once. Until the database check passed, it comes first.
   */
  const ready = (): Promise<void> | undefined => {
    const status = client.status;
    if (status === undefined || status === 'ready') return checkDatabase();
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
    return select === undefined ? waiting.promise : waiting.promise.then(checkDatabase);
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
      /** Every channel of this connection: the first, and those added since. */
      const channels = new Set([channel]);
      sub.on('message', ((ch: string, message: string) => {
        if (channels.has(ch)) onMessage(message, ch);
      }) as never);
      sub.on('ready', () => {
        if (!own || !subscribed) isReady = true;
        else
          sub.subscribe(...channels).then(
            () => (isReady = true),
            () => {},
          );
      });
      sub.on('close', () => (isReady = false));
      try {
        const opening = (sub.status === 'ready' ? Promise.resolve() : firstReady(sub, () => subError, 'subscriber connection')).then(() =>
          sub.subscribe(channel),
        );
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
        async add(ch) {
          channels.add(ch);
          await sub.subscribe(ch);
        },
        async remove(ch) {
          if (ch === channel || !channels.delete(ch)) return;
          if (sub.status === 'ready') await sub.unsubscribe(ch).catch(() => {});
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

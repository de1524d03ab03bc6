import { settleWithin } from '../core/call.js';
import { quotePg } from './util.js';

/** One connection that can LISTEN: a dedicated pg `Client`, or a client checked out of a pool and never returned. */
export interface ListenConnection {
  /** The server process id from the connection's BackendKeyData (pg's `Client#processID`); a pooler sends one of its own. */
  readonly processID?: number | null;
  query(text: string): Promise<unknown>;
  on(event: 'notification', listener: (message: { channel: string; payload?: string }) => void): unknown;
  on(event: 'error', listener: (error: Error) => void): unknown;
  on(event: 'end', listener: () => void): unknown;
  removeAllListeners(event?: string): unknown;
}

export interface ListenerOptions {
  /** Opens the connection (never from a transaction-mode pooler: LISTEN needs a session of its own). */
  connect(): Promise<ListenConnection>;
  /** Ends a connection opened by `connect`; `broken` when it failed. Must not throw. */
  dispose(connection: ListenConnection, broken: boolean): Promise<void>;
  channel: string;
}

/** The pid in the answer to `SELECT pg_backend_pid() AS pid`, alone or last of a multi-statement query. */
function backendPid(result: unknown): number | undefined {
  const last = Array.isArray(result) ? result[result.length - 1] : result;
  const pid = (last as { rows?: { pid?: unknown }[] } | undefined)?.rows?.[0]?.pid;
  return typeof pid === 'number' ? pid : undefined;
}

interface Subscriber {
  readonly onChange: () => void;
  readonly seq: bigint | undefined;
}

/** How long the connection stays open with nobody waiting (so short waits back to back share it). */
const IDLE_CLOSE_MS = 10_000;
/** Reconnection after the connection dropped while someone waits: full backoff from 100 ms up to 2 s. */
const RECONNECT_BASE_MS = 100;
const RECONNECT_CAP_MS = 2_000;
/** close() waits at most this long for a connection still opening (it is dropped when it opens, or fails by its timeouts). */
const CLOSE_WAIT_MS = 2_000;

/**
 * The backend's single LISTEN connection, shared by every waiter of this backend instance. It is
 * opened on the first `add`, closed after IDLE_CLOSE_MS without subscribers, and reopened in the
 * background when it drops while someone waits; after a reconnection every subscriber is called
 * once, since notifications sent while it was down are lost.
 */
export class Listener {
  readonly #options: ListenerOptions;
  readonly #subscribers = new Map<string, Set<Subscriber>>();
  #connection: ListenConnection | undefined;
  #connecting: Promise<ListenConnection> | undefined;
  #idleTimer: ReturnType<typeof setTimeout> | undefined;
  #reconnectTimer: ReturnType<typeof setTimeout> | undefined;
  #reconnectAttempt = 0;
  #closed = false;
  /** Server process that executed LISTEN; a different one answering later means a transaction pooler sits in between. */
  #listenPid: number | undefined;
  #verifying = false;
  /**
   * The LISTEN connection is a session of PostgreSQL itself: the process that ran LISTEN is the one
   * named in the connection's BackendKeyData. A transaction pooler hands out keys of its own (it
   * cannot give a multiplexed client one server's key), so then no check is needed on later adds.
   */
  #direct = false;
  /** Set once LISTEN was seen not to stick (PgBouncer in transaction mode): from then on `add` rejects and core polls. */
  #pooled = false;

  constructor(options: ListenerOptions) {
    this.#options = options;
  }

  /**
   * Resolves once LISTEN is active and `onChange` registered for `key`, with a function that ends
   * it. `seq` is the caller's place in the key's queue, if it has one: it is then woken only by
   * notifications that reach its place (seqs only grow, so an old seq errs towards waking).
   * Without `seq` (a watcher) it hears every notification of the key, including the `0:` of a grant
   * that no queued waiter needs to hear of.
   */
  async add(key: string, onChange: () => void, seq?: bigint): Promise<() => void> {
    this.#clearIdle();
    await this.#ensure();
    let set = this.#subscribers.get(key);
    if (!set) this.#subscribers.set(key, (set = new Set()));
    const subscriber: Subscriber = { onChange, seq };
    set.add(subscriber);
    this.#verify();
    let removed = false;
    return () => {
      if (removed) return;
      removed = true;
      set.delete(subscriber);
      if (set.size === 0 && this.#subscribers.get(key) === set) this.#subscribers.delete(key);
      if (this.#subscribers.size === 0) this.#armIdle();
    };
  }

  /** Calls every subscriber (the backend is closing, or notifications may have been missed). */
  wakeAll(): void {
    for (const set of [...this.#subscribers.values()]) for (const s of [...set]) s.onChange();
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#clearIdle();
    if (this.#reconnectTimer) clearTimeout(this.#reconnectTimer);
    this.wakeAll();
    this.#subscribers.clear();
    const pending = this.#connecting;
    this.#connecting = undefined;
    const connection = this.#connection;
    this.#connection = undefined;
    if (connection) await this.#drop(connection, false);
    // A connection still opening drops itself when it is done (#open sees #closed); it is waited
    // for only a while: against a server that never answers it ends by its own timeouts.
    else if (pending) await settleWithin(pending, CLOSE_WAIT_MS);
  }

  #ensure(): Promise<ListenConnection> {
    if (this.#closed) return Promise.reject(new Error('listener closed'));
    if (this.#pooled) {
      return Promise.reject(
        new Error(
          'LISTEN does not stay on this connection (a transaction-mode pooler such as PgBouncer?); give listenConnectionString pointing at PostgreSQL itself',
        ),
      );
    }
    if (this.#connection) return Promise.resolve(this.#connection);
    this.#connecting ??= this.#open().finally(() => {
      this.#connecting = undefined;
    });
    return this.#connecting;
  }

  async #open(): Promise<ListenConnection> {
    const connection = await this.#options.connect();
    let failed = false;
    const onLoss = (): void => {
      if (failed) return;
      failed = true;
      this.#lost(connection);
    };
    // An 'error' without a listener would crash the process; a dropped connection is handled here.
    connection.on('error', onLoss);
    connection.on('end', onLoss);
    connection.on('notification', (message) => {
      if (message.channel !== this.#options.channel || message.payload === undefined) return;
      const colon = message.payload.indexOf(':');
      const set = this.#subscribers.get(message.payload.slice(colon + 1));
      if (!set) return;
      const head = message.payload.slice(0, colon);
      const upto = /^[0-9]+$/.test(head) ? BigInt(head) : undefined;
      for (const s of [...set]) if (upto === undefined || s.seq === undefined || s.seq <= upto) s.onChange();
    });
    try {
      // One simple query, so a pooler runs both on the same server connection.
      const results = await connection.query(`LISTEN ${quotePg(this.#options.channel)}; SELECT pg_backend_pid() AS pid`);
      this.#listenPid = backendPid(results);
      this.#direct = this.#listenPid !== undefined && connection.processID === this.#listenPid;
    } catch (error) {
      failed = true;
      await this.#drop(connection, true);
      throw error;
    }
    if (this.#closed || failed) {
      if (!failed) await this.#drop(connection, false);
      throw new Error(this.#closed ? 'listener closed' : 'LISTEN connection dropped while opening');
    }
    this.#connection = connection;
    this.#reconnectAttempt = 0;
    if (this.#subscribers.size === 0) this.#armIdle();
    return connection;
  }

  /**
   * Asks the LISTEN connection which server process answers. Behind PgBouncer in transaction mode
   * LISTEN stays on whichever server connection ran it, and notifications are lost: as soon as
   * another process answers, stop listening (subscribers re-check, later waits poll with backoff,
   * which beats waiting for the fallback poll). A heuristic: an idle pooler may keep handing out
   * the same server connection, and then waiters rely on core's fallback poll. Skipped on a
   * connection known to be direct (see #direct): there the answer cannot change.
   */
  #verify(): void {
    const connection = this.#connection;
    if (this.#direct || this.#verifying || !connection || this.#listenPid === undefined) return;
    this.#verifying = true;
    connection
      .query('SELECT pg_backend_pid() AS pid')
      .then((result) => {
        const pid = backendPid(result);
        if (pid === undefined || pid === this.#listenPid || this.#connection !== connection) return;
        this.#pooled = true;
        this.#connection = undefined;
        void this.#drop(connection, false);
        this.wakeAll();
      })
      .catch(() => {}) // a broken connection is handled by its 'error'/'end' listeners
      .finally(() => {
        this.#verifying = false;
      });
  }

  #lost(connection: ListenConnection): void {
    if (this.#connection === connection) this.#connection = undefined;
    void this.#drop(connection, true);
    if (!this.#closed && this.#subscribers.size > 0) this.#scheduleReconnect();
  }

  #scheduleReconnect(): void {
    if (this.#reconnectTimer || this.#closed) return;
    const ceiling = Math.min(RECONNECT_CAP_MS, RECONNECT_BASE_MS * 2 ** Math.min(this.#reconnectAttempt++, 10));
    this.#reconnectTimer = setTimeout(
      () => {
        this.#reconnectTimer = undefined;
        if (this.#closed || this.#subscribers.size === 0 || this.#connection) return;
        this.#ensure().then(
          () => this.wakeAll(), // notifications sent while we were away are gone: everyone re-checks
          () => this.#scheduleReconnect(),
        );
      },
      ceiling * (0.5 + Math.random() / 2),
    );
    this.#reconnectTimer.unref();
  }

  async #drop(connection: ListenConnection, broken: boolean): Promise<void> {
    connection.removeAllListeners('notification');
    connection.removeAllListeners('end');
    // Keep an 'error' listener: a late socket error after we let go must not crash the process.
    connection.removeAllListeners('error');
    connection.on('error', () => {});
    await this.#options.dispose(connection, broken).catch(() => {});
  }

  #armIdle(): void {
    if (this.#idleTimer || this.#closed) return;
    this.#idleTimer = setTimeout(() => {
      this.#idleTimer = undefined;
      if (this.#subscribers.size > 0 || !this.#connection) return;
      const connection = this.#connection;
      this.#connection = undefined;
      void this.#drop(connection, false);
    }, IDLE_CLOSE_MS);
    this.#idleTimer.unref();
  }

  #clearIdle(): void {
    if (this.#idleTimer) clearTimeout(this.#idleTimer);
    this.#idleTimer = undefined;
  }
}

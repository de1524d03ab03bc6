/**
 * Wake-ups without push notifications: MySQL and MariaDB have no LISTEN/NOTIFY, so one poller per
 * backend instance reads the change counters of the keys its waiters and watchers follow, in one
 * statement per round, and calls back for the keys that moved.
 *
 * - A waiter (`Backend.subscribe`) follows the key's `version`, which the procedures raise
 *   whenever a waiter may be able to go (a holder or a queue place went, a shared grant). Its
 *   starting point is the busy answer's cursor, so a change between that answer and the
 *   subscription is told at the next round: no lost wake-ups.
 * - A queued waiter (its busy answer gave its place, `seq`) is woken only when the queue lets it go
 *   now: each round also reads `upto`, the last place that could be granted (the head exclusive
 *   waiter's, or the end of the run of shared waiters at the head; everyone when nobody is queued),
 *   as PostgreSQL's `<upto>:<key>` notifications do. Without this every waiting instance's waiter
 *   asked again on every release (a write transaction each, 8.6 CALLs per hand-off with 8 waiting
 *   processes) and one was granted. A waiter passed over remembers the key's last token: when its
 *   place is reached later without a change of version (a place ahead ran out, which writes
 *   nothing) and without a grant (last token unchanged), it is woken then.
 *   Changes made through this instance (below) are judged by the same rule, from the queue's head
 *   their call answers with.
 * - A watcher (`Backend.watch`) follows the key's last token and its number of live holders by the
 *   server's clock: every grant raises the one, every release or expiry without a grant lowers the
 *   other (an expiry writes nothing, so it is seen by the count, within one round of the instant).
 * - Changes made through this backend instance are told to its own subscribers and watchers of
 *   the key at once, without waiting for the next round (see `changed`).
 *
 * The poller runs only while someone follows a key: rounds every `pollMs` while a waiter waits,
 * every `watchPollMs` while only watchers follow keys; nothing at all otherwise. Its timer is
 * unref'd: it never keeps a process alive.
 */

/** What one round reads of a key (a key without a row reads as never granted). */
export interface PolledKey {
  readonly version: bigint;
  readonly lastToken: string;
  readonly live: number;
  /** The last queue place that could be granted now; null when nobody is queued (everyone may ask). */
  readonly upto: bigint | null;
}

export interface KeyPollerOptions {
  /** Rounds while someone waits. */
  readonly pollMs: number;
  /** Rounds while only watchers follow keys (an observer can wait longer than a queued waiter). */
  readonly watchPollMs: number;
  /** A round that failed (the server unreachable) is tried again this soon. */
  readonly retryMs: number;
  /** Reads the keys' states (one statement, or a few for very many keys); a key missing from the answer has no row. */
  read(keys: readonly string[]): Promise<Map<string, PolledKey>>;
}

interface Subscriber {
  readonly onChange: () => void;
  /** The key's version this waiter last heard of; undefined until the first look. */
  since: bigint | undefined;
  /** The waiter's place in the key's queue (its busy answer's); undefined: woken by every change. */
  readonly seq: bigint | undefined;
  /** The key's last token when a round last passed this waiter over (its place not reached). */
  passedOver: string | undefined;
  /** An exclusive waiter: it can be granted only when the key has no live holder. */
  readonly exclusive: boolean;
  /** A change reached this exclusive waiter while the key was held (someone ahead was granted since): it waits for the key to be free. */
  blocked: boolean;
}

interface Watcher {
  readonly onChange: () => void;
  /** `lastToken:live` of the last look. */
  seen: string | undefined;
}

interface Followed {
  readonly subscribers: Set<Subscriber>;
  readonly watchers: Set<Watcher>;
}

const NEVER_GRANTED: PolledKey = Object.freeze({ version: 0n, lastToken: '0', live: 0, upto: null });

export class KeyPoller {
  readonly #options: KeyPollerOptions;
  readonly #keys = new Map<string, Followed>();
  #timer: ReturnType<typeof setTimeout> | undefined;
  /** The delay the timer was armed with (a watcher's round is brought forward when a waiter comes). */
  #armedMs = 0;
  #polling = false;
  /** A round was asked for while one ran: run the next one at once. */
  #again = false;
  #lastWatchRound = -Infinity;
  #closed = false;

  constructor(options: KeyPollerOptions) {
    this.#options = options;
  }

  /**
   * Follows the key for a waiter. `since` is the version in the waiter's busy answer: any higher
   * version seen from now on wakes it (once the queue's head has reached `seq`, its place, if it
   * has one). Without it, the key's current version is read first (the subscription is active
   * once this resolves).
   */
  async subscribe(key: string, onChange: () => void, since: bigint | undefined, seq?: bigint, exclusive = false): Promise<() => void> {
    const sub: Subscriber = { onChange, since, seq, passedOver: undefined, exclusive, blocked: false };
    if (since === undefined) sub.since = (await this.#look(key)).version;
    const followed = this.#follow(key);
    followed.subscribers.add(sub);
    this.#start(true);
    return () => {
      followed.subscribers.delete(sub);
      this.#unfollow(key, followed);
    };
  }

  /** Follows the key for an observer; resolves once its state was read, so any change after that is told. */
  async watch(key: string, onChange: () => void): Promise<() => void> {
    const state = await this.#look(key);
    const watcher: Watcher = { onChange: () => onChange(), seen: signature(state) };
    const followed = this.#follow(key);
    followed.watchers.add(watcher);
    this.#start(false);
    return () => {
      followed.watchers.delete(watcher);
      this.#unfollow(key, followed);
    };
  }

  /**
   * A change of the key made through this instance: its waiters that have not yet heard of
   * `version` are woken now if they have no queue place, or if `upto` (the last place that could
   * be granted now, null: nobody queued, as a round reads it) reaches theirs; queued waiters whose
   * place it does not reach are left to the next round (which judges them as any round does), and
   * without `upto` a round is run now for them. Its watchers are told when `holders` moved (a
   * grant, a release).
   */
  changed(key: string, version: bigint | undefined, holders: boolean, upto?: bigint | null): void {
    const followed = this.#keys.get(key);
    if (!followed) return;
    if (version !== undefined) {
      let unknown = false;
      for (const sub of [...followed.subscribers]) {
        if (sub.since !== undefined && sub.since >= version) continue;
        if (sub.seq !== undefined && upto === undefined) {
          unknown = true;
          continue;
        }
        if (sub.seq !== undefined && upto !== null && sub.seq > (upto as bigint)) continue;
        sub.since = version;
        sub.passedOver = undefined;
        sub.blocked = false;
        call(sub.onChange);
      }
      if (unknown) this.#roundNow();
    }
    if (holders) for (const w of [...followed.watchers]) call(w.onChange);
  }

  /** Stops every round and forgets every key; nobody is called any more. */
  close(): void {
    this.#closed = true;
    clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#keys.clear();
  }

  async #look(key: string): Promise<PolledKey> {
    return (await this.#options.read([key])).get(key) ?? NEVER_GRANTED;
  }

  #follow(key: string): Followed {
    let followed = this.#keys.get(key);
    if (!followed) this.#keys.set(key, (followed = { subscribers: new Set(), watchers: new Set() }));
    return followed;
  }

  #unfollow(key: string, followed: Followed): void {
    if (followed.subscribers.size > 0 || followed.watchers.size > 0 || this.#keys.get(key) !== followed) return;
    this.#keys.delete(key);
    if (this.#keys.size === 0) {
      clearTimeout(this.#timer);
      this.#timer = undefined;
    }
  }

  /** Starts the rounds if they are not running; a new waiter brings the next round forward to `pollMs`. */
  #start(waiter: boolean): void {
    if (this.#closed || this.#polling) return;
    const ms = waiter ? this.#options.pollMs : this.#options.watchPollMs;
    if (this.#timer && this.#armedMs <= ms) return;
    this.#arm(ms);
  }

  /** The next round at once (after the one running, if any). */
  #roundNow(): void {
    if (this.#closed) return;
    if (this.#polling) this.#again = true;
    else this.#arm(0);
  }

  #arm(ms: number): void {
    clearTimeout(this.#timer);
    this.#armedMs = ms;
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      void this.#round();
    }, ms);
    this.#timer.unref?.();
  }

  async #round(): Promise<void> {
    if (this.#closed || this.#keys.size === 0) return;
    this.#polling = true;
    const watchDue = performance.now() - this.#lastWatchRound >= this.#options.watchPollMs;
    if (watchDue) this.#lastWatchRound = performance.now();
    const keys = [...this.#keys].filter(([, f]) => f.subscribers.size > 0 || (watchDue && f.watchers.size > 0)).map(([key]) => key);
    let failed = false;
    try {
      if (keys.length > 0) {
        const states = await this.#options.read(keys);
        if (!this.#closed) for (const key of keys) this.#apply(key, states.get(key) ?? NEVER_GRANTED);
      }
    } catch {
      failed = true; // the server is unreachable: waiters fall back to core's own re-checks meanwhile
      if (watchDue) this.#lastWatchRound = -Infinity;
    } finally {
      this.#polling = false;
    }
    if (this.#closed || this.#keys.size === 0) return;
    const waiting = [...this.#keys.values()].some((f) => f.subscribers.size > 0);
    const next = waiting ? this.#options.pollMs : this.#options.watchPollMs;
    const again = this.#again && !failed;
    this.#again = false;
    this.#arm(again ? 0 : failed ? Math.max(next, this.#options.retryMs) : next);
  }

  #apply(key: string, state: PolledKey): void {
    const followed = this.#keys.get(key);
    if (!followed) return;
    for (const sub of [...followed.subscribers]) if (wakes(sub, state)) call(sub.onChange);
    const sig = signature(state);
    for (const w of [...followed.watchers]) {
      if (w.seen === sig) continue;
      w.seen = sig;
      call(w.onChange);
    }
  }
}

/**
 * Whether a round's state of the key wakes the waiter (updating what it has heard of). A change it
 * has not heard of wakes it if its place is reached (or it has none); else it is passed over, and
 * the key's last token noted. A waiter passed over whose place is reached with no change since is
 * woken if nobody was granted meanwhile: a place ahead of it ran out (no write moves the version
 * then); if someone was granted (an exclusive grant, which moves no version), the next release will.
 *
 * An exclusive waiter whose place is reached while the key has live holders cannot be granted now:
 * rounds sample the key, so one can see, in one snapshot, the change meant for the waiter ahead
 * (its place reached, the version moved) and that waiter's grant (its place gone, the key held).
 * It is not woken then but marked blocked: the holder's release moves the version and wakes it; an
 * expiry (which writes nothing) shows as no live holder at a later round, and wakes it then.
 */
function wakes(sub: Subscriber, state: PolledKey): boolean {
  const reached = sub.seq === undefined || state.upto === null || sub.seq <= state.upto;
  if (sub.since === undefined || state.version > sub.since) {
    sub.since = state.version;
    sub.passedOver = reached ? undefined : state.lastToken;
    sub.blocked = reached && sub.exclusive && state.live > 0;
    return reached && !sub.blocked;
  }
  if (!reached) {
    sub.passedOver = state.lastToken;
    sub.blocked = false;
    return false;
  }
  if (sub.blocked) {
    sub.blocked = state.live > 0;
    return !sub.blocked;
  }
  const ranOut = sub.passedOver !== undefined && sub.passedOver === state.lastToken;
  sub.passedOver = undefined;
  return ranOut;
}

function signature(state: PolledKey): string {
  return `${state.lastToken}:${state.live}`;
}

/** A callback that throws is its owner's business: the others are still told, and nothing throws into the poller. */
function call(fn: () => void): void {
  try {
    fn();
  } catch {
    // ignored on purpose
  }
}

import type { HandOff } from '../core/backend.js';
import { within } from './conn/bounded.js';
import type { Conn, Subscriber } from './conn/types.js';
import { wakeIdOf } from './ops/queue.js';

/** A subscriber connection that failed is tried again after this long (meanwhile waiters poll). */
const SUBSCRIBER_RETRY_MS = 1_000;
/** Wake-ups that arrived before their waiter subscribed are kept this long, then dropped. */
const PENDING_WAKE_MS = 30_000;

/** What a busy answer hands to `subscribe`: the waiter's name in wake messages. */
export interface WakeCursor {
  readonly wake: string;
}

export function isWakeCursor(value: unknown): value is WakeCursor {
  return typeof value === 'object' && value !== null && typeof (value as WakeCursor).wake === 'string' && (value as WakeCursor).wake !== '';
}

/**
 * This client's wake-up channel: one SUBSCRIBE per backend (on a second connection), messages
 * naming the waiter (`wakeId`, see `ops/queue.ts`), or handing it the key (`wakeId|token|session`).
 * A message that arrives before its waiter subscribed is kept, so the subscription fires at once (no
 * lost wake-up between the busy answer and the subscription). Other channels (the keys' watch
 * channels, `ops/watch.ts`) are added to the same connection with {@link WakeHub.listen}.
 *
 * Time: opening the subscriber and its QUIT at close are each bounded by the backend's
 * `commandTimeoutMs` (given here as `timeoutMs`), like every other Redis call of the backend.
 */
export class WakeHub {
  readonly #conn: Conn;
  readonly channel: string;
  readonly #timeoutMs: number;
  /** Aborted by close(): a subscriber still connecting is dropped at once. */
  readonly #closing = new AbortController();
  readonly #handlers = new Map<string, Set<(handOff?: HandOff) => void>>();
  readonly #pending = new Map<string, { at: number; handOff: HandOff | undefined }>();
  /** Channels other than the wake-up channel, each with its one listener. */
  readonly #others = new Map<string, () => void>();
  #sub: Promise<Subscriber> | undefined;
  #subscriber: Subscriber | undefined;
  #failedAt = -Infinity;
  #closed = false;

  constructor(conn: Conn, options: { readonly channel: string; readonly timeoutMs: number }) {
    this.#conn = conn;
    this.channel = options.channel;
    this.#timeoutMs = options.timeoutMs;
  }

  /** True when wake-ups can be delivered now (subscribes on first use, and only then answers later). */
  ready(): boolean | Promise<boolean> {
    if (this.#closed) return false;
    if (this.#subscriber) return this.#subscriber.ready;
    return this.#open();
  }

  async #open(): Promise<boolean> {
    if (!this.#sub) {
      if (performance.now() - this.#failedAt < SUBSCRIBER_RETRY_MS) return false;
      const opening = this.#conn.subscribe(
        this.channel,
        (message, channel) => (channel === this.channel ? this.#deliver(message) : this.#others.get(channel)?.()),
        this.#timeoutMs,
        this.#closing.signal,
      );
      this.#sub = opening;
      opening.catch(() => {
        this.#failedAt = performance.now();
        if (this.#sub === opening) this.#sub = undefined;
      });
    }
    try {
      const sub = await this.#sub;
      if (this.#closed) return false;
      this.#subscriber = sub;
      return sub.ready;
    } catch {
      return false;
    }
  }

  #deliver(message: string): void {
    const [wake = '', token, session] = message.split('|', 3);
    const handOff = token !== undefined && session !== undefined && /^\d{1,20}$/.test(token) ? { token: BigInt(token), session } : undefined;
    const handlers = this.#handlers.get(wake);
    if (handlers) {
      for (const fn of [...handlers]) fn(handOff);
      return;
    }
    const now = performance.now();
    this.#pending.set(wake, { at: now, handOff });
    if (this.#pending.size > 1_000) {
      for (const [w, p] of this.#pending) if (now - p.at > PENDING_WAKE_MS) this.#pending.delete(w);
    }
  }

  register(wake: string, onChange: (handOff?: HandOff) => void): () => void {
    let set = this.#handlers.get(wake);
    if (!set) this.#handlers.set(wake, (set = new Set()));
    set.add(onChange);
    const pending = this.#pending.get(wake);
    if (pending) {
      this.#pending.delete(wake);
      queueMicrotask(() => onChange(pending.handOff));
    }
    return () => {
      set.delete(onChange);
      if (set.size === 0 && this.#handlers.get(wake) === set) this.#handlers.delete(wake);
    };
  }

  /**
   * Delivers the messages of `channel` to `onMessage` too, on this client's subscriber connection
   * (opened now if it is not yet); resolves once subscribed, with a function that unsubscribes.
   * One listener per channel. Rejects when the subscriber cannot be opened or the SUBSCRIBE gets no
   * answer within the command timeout.
   */
  async listen(channel: string, onMessage: () => void): Promise<() => void> {
    if (this.#others.has(channel)) throw new TypeError(`WakeHub: ${channel} has a listener already`);
    if (!(await this.ready()) || !this.#subscriber) throw new Error('the subscriber connection is not ready');
    const sub = this.#subscriber;
    this.#others.set(channel, onMessage);
    try {
      await within(sub.add(channel), this.#timeoutMs, this.#closing.signal, 'subscribe');
    } catch (error) {
      this.#others.delete(channel);
      void sub.remove(channel);
      throw error;
    }
    return () => {
      if (this.#others.get(channel) !== onMessage) return;
      this.#others.delete(channel);
      if (this.#subscriber === sub) void sub.remove(channel);
    };
  }

  /** Drops a wake-up kept for this owner's waiter (it was granted, or gave up). */
  forgetOwner(owner: string): void {
    if (this.#pending.size > 0) this.#pending.delete(wakeIdOf(owner));
  }

  /** Bounded: a subscriber still connecting is dropped now, an open one gets QUIT for at most the command timeout. */
  async close(): Promise<void> {
    this.#closed = true;
    this.#closing.abort();
    for (const set of this.#handlers.values()) for (const fn of set) fn();
    this.#handlers.clear();
    this.#pending.clear();
    this.#others.clear();
    const sub = this.#sub;
    this.#sub = undefined;
    this.#subscriber = undefined;
    if (sub) await sub.then((s) => s.close(this.#timeoutMs)).catch(() => {});
  }
}

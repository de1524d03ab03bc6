import { createHash } from 'node:crypto';
import { IdempotencyMismatchError, InvalidArgumentError } from './errors.js';
import type { Lease } from './lease.js';
import { checkKey, checkKnownOptions, checkObject, checkWait, checkTtl, checkInteger, describe, MAX_DURATION_MS } from './validate.js';

/**
 * What an idempotency store keeps per key: the attempt in progress (its claim) or the completed
 * result, each written under the token of the lease that claimed the key, through a fence: a write
 * under an older token than the last one is refused (StaleTokenError), so a zombie attempt cannot
 * overwrite the result of the attempt that took over from it.
 */
export interface IdempotencyRecord {
  readonly state: 'in-progress' | 'completed';
  /** The token of the attempt that wrote the record. */
  readonly token: bigint;
  /** A stable hash of the request's payload (see `payloadHash`); '' when the call gave none. */
  readonly payloadHash: string;
  /** The result as JSON (completed records). */
  readonly value?: string;
}

/**
 * Where records live: one store per database (sqliteIdempotencyStore, postgresIdempotencyStore,
 * redisIdempotencyStore). `Tx` is what `transact` hands the effect (the database's transaction
 * handle); `unknown` for stores without it (every store is an `IdempotencyStore`).
 */
export interface IdempotencyStore<Tx = unknown> {
  /** The record of `key`, or undefined (none, or a completed one whose keepMs ran out by the store's clock). */
  get(key: string): Promise<IdempotencyRecord | undefined>;
  /**
   * Writes `record` (or deletes the key's record, with undefined) under `token`, fenced: refused
   * with StaleTokenError when a newer token already wrote for the key; nothing changed then.
   * `keepMs` is how long a completed record lives, counted by the store's own clock.
   */
  put(key: string, token: bigint, record: IdempotencyRecord | undefined, keepMs: number): Promise<void>;
  /**
   * Claims the key for `token` in one atomic step: when the key holds a completed record that has
   * not expired, returns it and writes nothing; otherwise writes the in-progress `record` under
   * `token`, fenced as `put`, and returns undefined. Atomic, so a completion that lands between a
   * takeover's read and its claim is replayed, never overwritten (and `fn` never runs twice).
   */
  claim(key: string, token: bigint, record: IdempotencyRecord, keepMs: number): Promise<IdempotencyRecord | undefined>;
  /**
   * Optional, for stores in the database the effect writes to (`runInTransaction`): runs
   * `effect(tx)` in one transaction of that database and writes `complete(result)` in the same
   * transaction under `token`, fenced: when a newer token wrote for the key, StaleTokenError and
   * nothing of the transaction (the effect included) is committed. `effect` or `complete`
   * throwing rolls it back too, and the error reaches the caller unchanged.
   */
  transact?<R>(key: string, token: bigint, effect: (tx: Tx) => R | Promise<R>, complete: (result: R) => IdempotencyRecord, keepMs: number): Promise<R>;
}

/** A store with `transact` (sqliteIdempotencyStore, postgresIdempotencyStore): what `runInTransaction` needs. */
export interface TransactionalIdempotencyStore<Tx> extends IdempotencyStore<Tx> {
  transact<R>(key: string, token: bigint, effect: (tx: Tx) => R | Promise<R>, complete: (result: R) => IdempotencyRecord, keepMs: number): Promise<R>;
}

export interface IdempotencyOptions<Tx = unknown> {
  /** The client whose leases claim the keys (the lock key is `idempotency:<key>`). */
  locks: { acquire(key: string, options: Record<string, unknown>): Promise<Lease> };
  store: IdempotencyStore<Tx>;
  /** The claim's lease ttl: how long a crashed attempt keeps the key before another may take over. @default 30000 */
  ttlMs?: number;
  /** How long a completed result is replayed. @default 86400000 (24 h) */
  keepMs?: number;
  /** How long a call waits for an attempt in progress (then AcquireTimeoutError). @default 10000 */
  waitMs?: number;
}

export const IDEMPOTENCY_DEFAULTS = Object.freeze({
  /** 30 s: as a lease's default; an attempt that pauses longer is taken over (and its late completion refused). */
  ttlMs: 30_000,
  /** 24 h: Stripe keeps idempotency keys for at least 24 hours; a retry after that runs again. */
  keepMs: 86_400_000,
  /** 10 s: a retry while the first attempt runs waits this long for its outcome. */
  waitMs: 10_000,
});

/** The outcome of `run`: the value, whether it was replayed, and the token of the attempt that stored it. */
export interface IdempotentResult<T> {
  readonly value: T;
  readonly replayed: boolean;
  readonly token: bigint;
}

/**
 * A stable hash of a JSON-serialisable payload: object keys sorted at every level, so `{a, b}` and
 * `{b, a}` hash alike; sha256, hex. undefined (no payload) hashes to ''.
 */
export function payloadHash(payload: unknown): string {
  if (payload === undefined) return '';
  return createHash('sha256').update(stableJson(payload, 'payload')).digest('hex');
}

function stableJson(value: unknown, what: string): string {
  const seen = new Set<unknown>();
  const walk = (v: unknown): unknown => {
    if (v === null || typeof v !== 'object') {
      if (typeof v === 'bigint' || typeof v === 'function' || typeof v === 'symbol')
        throw new InvalidArgumentError(what, `expected JSON-serialisable data, found a ${typeof v}`);
      if (typeof v === 'number' && !Number.isFinite(v)) throw new InvalidArgumentError(what, `expected JSON-serialisable data, found ${v}`);
      return v;
    }
    if (seen.has(v)) throw new InvalidArgumentError(what, 'expected JSON-serialisable data, found a cycle');
    seen.add(v);
    if (Array.isArray(v)) return v.map(walk);
    const out: Record<string, unknown> = {};
    for (const k of Object.keys(v).sort()) {
      const x = (v as Record<string, unknown>)[k];
      if (x !== undefined) out[k] = walk(x);
    }
    seen.delete(v);
    return out;
  };
  return JSON.stringify(walk(value));
}

/**
 * Run once per key, replay the result, fence the takeover (issue 17). A call claims the key with a
 * lease (`idempotency:<key>`) and writes an in-progress record under the lease's token through the
 * store's fence; runs `fn(lease)`; stores its JSON result as completed under the same token. A later
 * call within keepMs replays it. A call while an attempt runs waits for it (waitMs). When an attempt
 * pauses past its ttl, the next call claims with a higher token, which raises the fence: the first
 * attempt's late completion is refused (StaleTokenError to its caller), and the stored result is the
 * new holder's.
 */
export class Idempotency<Tx = unknown> {
  readonly #locks: IdempotencyOptions['locks'];
  readonly #store: IdempotencyStore<Tx>;
  readonly #ttlMs: number;
  readonly #keepMs: number;
  readonly #waitMs: number;

  constructor(options: IdempotencyOptions<Tx>) {
    const o = checkObject(options, 'options');
    checkKnownOptions(o, ['locks', 'store', 'ttlMs', 'keepMs', 'waitMs'], 'options');
    if (typeof (o.locks as { acquire?: unknown } | undefined)?.acquire !== 'function')
      throw new InvalidArgumentError('locks', `expected a Locks, got ${describe(o.locks)}`);
    const store = o.store as IdempotencyStore<Tx> | undefined;
    if (typeof store?.get !== 'function' || typeof store.put !== 'function' || typeof store.claim !== 'function')
      throw new InvalidArgumentError('store', `expected an idempotency store (get, put, claim), got ${describe(o.store)}`);
    this.#locks = o.locks as IdempotencyOptions['locks'];
    this.#store = store;
    this.#ttlMs = o.ttlMs === undefined ? IDEMPOTENCY_DEFAULTS.ttlMs : checkTtl(o.ttlMs, 'options.ttlMs');
    this.#keepMs = o.keepMs === undefined ? IDEMPOTENCY_DEFAULTS.keepMs : checkInteger(o.keepMs, 'options.keepMs', 1, MAX_DURATION_MS);
    this.#waitMs = o.waitMs === undefined ? IDEMPOTENCY_DEFAULTS.waitMs : checkWait(o.waitMs, 'options.waitMs');
  }

  /**
   * Runs `fn` once for `key` and stores its result; replays it to later calls. `payload` (any JSON)
   * is compared by a stable hash: a key used with another payload is IdempotencyMismatchError.
   * `fn` throwing removes the claim (a retry runs again) and reaches the caller unchanged; a result
   * that is not JSON-serialisable is an InvalidArgumentError (nothing stored).
   */
  async run<T>(key: string, options: { payload?: unknown } | undefined, fn: (lease: Lease) => T | Promise<T>): Promise<IdempotentResult<T>> {
    return this.#attempt(key, options, fn, async (lease, completed) => {
      const value = await fn(lease);
      const record = completed(value);
      // Fenced: when this attempt was taken over, the newer one raised the mark and this is refused.
      await this.#store.put(key, lease.token, record, this.#keepMs);
      return record;
    });
  }

  /**
   * As `run`, with the effect and the result in one transaction (stores with `transact`: SQLite,
   * PostgreSQL): `fn(tx, lease)` writes through the store's transaction `tx`, and its writes commit
   * with the completed record, fenced. An attempt that was taken over is refused whole
   * (StaleTokenError): none of its writes are committed, so the effect happens once even across a
   * takeover. What `fn` does outside `tx` (an HTTP call) is not covered.
   */
  async runInTransaction<T>(
    key: string,
    options: { payload?: unknown } | undefined,
    fn: (tx: Tx, lease: Lease) => T | Promise<T>,
  ): Promise<IdempotentResult<T>> {
    const transact = this.#store.transact?.bind(this.#store);
    if (typeof transact !== 'function')
      throw new InvalidArgumentError('store', 'runInTransaction needs a store with transact (sqliteIdempotencyStore, postgresIdempotencyStore)');
    return this.#attempt(key, options, fn, async (lease, completed) => {
      let record: IdempotencyRecord | undefined;
      await transact<T>(
        key,
        lease.token,
        (tx) => fn(tx, lease),
        (value) => (record = completed(value)),
        this.#keepMs,
      );
      return record as IdempotencyRecord;
    });
  }

  /**
   * Replay, or claim and run `body`, which stores the completed record (`completed` makes it from
   * the value; it throws for a value JSON cannot hold). `body` failing gives the key back.
   */
  async #attempt<T>(
    key: string,
    options: { payload?: unknown } | undefined,
    fn: unknown,
    body: (lease: Lease, completed: (value: T) => IdempotencyRecord) => Promise<IdempotencyRecord>,
  ): Promise<IdempotentResult<T>> {
    checkKey(key, 'key');
    const o = checkObject(options, 'options');
    checkKnownOptions(o, ['payload'], 'options');
    if (typeof fn !== 'function') throw new InvalidArgumentError('fn', `expected a function, got ${describe(fn)}`);
    const hash = payloadHash(o.payload);

    const stored = await this.#replay<T>(key, hash);
    if (stored) return stored;
    const lease = await this.#locks.acquire(`idempotency:${key}`, { ttlMs: this.#ttlMs, waitMs: this.#waitMs });
    try {
      // The attempt we waited for may have completed meanwhile.
      const done = await this.#replay<T>(key, hash);
      if (done) return done;
      const current = await this.#store.get(key);
      if (current && current.payloadHash !== hash) throw new IdempotencyMismatchError(key);
      // A late completion of the attempt we took over may land right up to our claim: the claim
      // then finds it and replays it instead of running fn again.
      // The in-progress record lives the lease's ttl, not keepMs: it never outlives its lease (a
      // renewed lease keeps the key anyway; a record gone early is harmless — the next claim needs
      // the lease, and a late completion with no newer claim in between is the only completion).
      const finished = await this.#store.claim(key, lease.token, { state: 'in-progress', token: lease.token, payloadHash: hash }, this.#ttlMs);
      if (finished) {
        if (finished.payloadHash !== hash) throw new IdempotencyMismatchError(key);
        return { value: JSON.parse(finished.value ?? 'null') as T, replayed: true, token: finished.token };
      }
      const completed = (value: T): IdempotencyRecord => ({
        state: 'completed',
        token: lease.token,
        payloadHash: hash,
        value: stableJson(value === undefined ? null : value, 'result'),
      });
      let record: IdempotencyRecord;
      try {
        record = await body(lease, completed);
      } catch (error) {
        // Give the key back so a retry runs again; a newer attempt's record is not ours to remove.
        // (After a refusal by the fence this put is refused too and changes nothing.)
        await this.#store.put(key, lease.token, undefined, this.#keepMs).catch(() => {});
        throw error;
      }
      return { value: JSON.parse(record.value ?? 'null') as T, replayed: false, token: lease.token };
    } finally {
      await lease.release().catch(() => {});
    }
  }

  async #replay<T>(key: string, hash: string): Promise<IdempotentResult<T> | undefined> {
    const record = await this.#store.get(key);
    if (record?.state !== 'completed') return undefined;
    if (record.payloadHash !== hash) throw new IdempotencyMismatchError(key);
    return { value: JSON.parse(record.value ?? 'null') as T, replayed: true, token: record.token };
  }
}

/** `createIdempotency({ locks, store, ttlMs?, keepMs?, waitMs? })`. */
export function createIdempotency<Tx = unknown>(options: IdempotencyOptions<Tx>): Idempotency<Tx> {
  return new Idempotency(options);
}

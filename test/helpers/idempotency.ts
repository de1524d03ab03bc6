/**
 * The behaviours of test/core/idempotency.test.ts, on a store in a real database with real time
 * (the database's clock judges expiry): replay, concurrency, waitMs, mismatch, fn throwing, a result
 * JSON cannot hold, keepMs expiry and purge, the fence on the store itself, the takeover; and the
 * transactional variant (runInTransaction): effect and record commit together, roll back together,
 * and a taken-over attempt's effect is refused whole. Registered once per store.
 */
import { spawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AcquireTimeoutError, IdempotencyMismatchError, InvalidArgumentError, StaleTokenError } from '../../src/core/errors.js';
import { createIdempotency, type IdempotencyOptions, type IdempotencyStore, type TransactionalIdempotencyStore } from '../../src/core/idempotency.js';
import type { Lease } from '../../src/core/lease.js';
import type { Locks } from '../../src/core/locks.js';
import { sleep, tempDir } from './env.js';

export interface IdempotencyTarget<Tx> {
  /** A store on the shared database (each call may open its own, as another process would). */
  store(): TransactionalIdempotencyStore<Tx>;
  /** A new client of the shared coordinator, closed by cleanup. */
  locks(): Locks;
  /** Writes one effect row inside the store's transaction. */
  effect(tx: Tx, key: string, attempt: string): unknown;
  /** The effect rows of key (attempt names), committed ones only. */
  effects(key: string): Promise<string[]>;
  /** How many of keys have a row in the store's table, expired or not (read on purpose: the purge has no other trace). */
  rows(keys: string[]): Promise<number>;
  /**
   * Whether `effect` may await inside the transaction (PostgreSQL). SQLite runs it synchronously
   * under the database's write lock, so its takeover pauses between the claim and the transaction.
   */
  asyncEffect: boolean;
  cleanup(): Promise<void>;
}

const TTL_MS = 600;

export function idempotencyScenarios<Tx>(name: string, setup: () => Promise<IdempotencyTarget<Tx>>): void {
  describe(`idempotency store: ${name}`, () => {
    let target: IdempotencyTarget<Tx>;
    let store: TransactionalIdempotencyStore<Tx>;
    const clients: Locks[] = [];
    let n = 0;
    /** A key of its own for each test: the tests share the table. */
    const fresh = (what: string): string => `${what}:${++n}:${Math.random().toString(36).slice(2)}`;
    const client = (options: Partial<IdempotencyOptions<Tx>> = {}) => {
      const locks = target.locks();
      clients.push(locks);
      return createIdempotency<Tx>({ locks, store, ttlMs: TTL_MS, keepMs: 60_000, waitMs: 5_000, ...options });
    };
    /** A client whose leases are not renewed: it behaves as a process frozen past its ttl would. */
    const frozen = (options: Partial<IdempotencyOptions<Tx>> = {}) => {
      const locks = target.locks();
      clients.push(locks);
      const noRenew = { acquire: (key: string, o: Record<string, unknown>) => locks.acquire(key, { ...o, autoRenew: false }) };
      return createIdempotency<Tx>({ locks: noRenew, store, ttlMs: TTL_MS, keepMs: 60_000, waitMs: 5_000, ...options });
    };

    /** fn of runInTransaction: writes one effect row, then returns value (awaiting the write where the store's effect is async). */
    const writing =
      <T>(key: string, attempt: string, value: T) =>
      (tx: Tx): T | Promise<T> => {
        const written = target.effect(tx, key, attempt);
        return target.asyncEffect ? Promise.resolve(written).then(() => value) : value;
      };

    beforeAll(async () => {
      target = await setup();
      store = target.store();
    });
    afterAll(async () => {
      await Promise.all(clients.map((c) => c.close()));
      await target.cleanup();
    });

    it('the first call runs fn; a later one replays its value with the token that stored it', async () => {
      const key = fresh('charge');
      const idem = client();
      let runs = 0;
      const first = await idem.run(key, { payload: { amount: 5 } }, () => ({ charged: ++runs }));
      const again = await client().run(key, { payload: { amount: 5 } }, () => ({ charged: ++runs }));
      expect(first).toMatchObject({ value: { charged: 1 }, replayed: false });
      expect(again).toEqual({ value: { charged: 1 }, replayed: true, token: first.token });
      expect(runs).toBe(1);
    });

    it('concurrent calls: fn runs once, the others wait for its outcome', async () => {
      const key = fresh('k');
      let runs = 0;
      const results = await Promise.all(
        [client(), client(), client()].map((idem, i) =>
          idem.run(key, {}, async () => {
            runs++;
            await sleep(200);
            return `done by ${i}`;
          }),
        ),
      );
      expect(runs).toBe(1);
      expect(new Set(results.map((r) => r.value)).size).toBe(1);
      expect(results.filter((r) => !r.replayed)).toHaveLength(1);
    });

    it('a concurrent call waits at most waitMs (AcquireTimeoutError), never running fn at the same time', async () => {
      const key = fresh('k');
      let release!: () => void;
      const first = client().run(key, {}, () => new Promise<string>((r) => (release = () => r('x'))));
      await sleep(100);
      let ran = false;
      const second = await client({ waitMs: 300 })
        .run(key, {}, () => {
          ran = true;
          return 'never';
        })
        .catch((e: unknown) => e);
      expect(second).toBeInstanceOf(AcquireTimeoutError);
      expect(ran).toBe(false);
      release();
      expect((await first).value).toBe('x');
    });

    it('a different payload is refused, never a silent replay of another request', async () => {
      const key = fresh('k');
      const idem = client();
      await idem.run(key, { payload: { amount: 5 } }, () => 'ok');
      await expect(idem.run(key, { payload: { amount: 6 } }, () => 'other')).rejects.toBeInstanceOf(IdempotencyMismatchError);
      await expect(idem.run(key, {}, () => 'other')).rejects.toMatchObject({ code: 'IDEMPOTENCY_MISMATCH' });
      expect(await idem.run(key, { payload: { amount: 5 } }, () => 'again')).toMatchObject({ value: 'ok', replayed: true });
    });

    it('fn throwing gives the key back: the error reaches the caller and a retry runs again', async () => {
      const key = fresh('k');
      const idem = client();
      const boom = new Error('card declined');
      await expect(idem.run(key, {}, () => Promise.reject(boom))).rejects.toBe(boom);
      expect(await store.get(key)).toBeUndefined();
      expect(await idem.run(key, {}, () => 'second try')).toMatchObject({ value: 'second try', replayed: false });
    });

    it('a result that JSON cannot hold is a typed error and nothing is stored', async () => {
      const key = fresh('k');
      const idem = client();
      await expect(idem.run(key, {}, () => ({ big: 1n }))).rejects.toBeInstanceOf(InvalidArgumentError);
      expect(await store.get(key)).toBeUndefined();
      expect(await idem.run(key, {}, () => 'fine')).toMatchObject({ value: 'fine', replayed: false });
    });

    it("completed records expire after keepMs by the database's clock, and later puts purge them", async () => {
      const key = fresh('k');
      const idem = client({ keepMs: 400 });
      await idem.run(key, {}, () => 1);
      expect(await idem.run(key, {}, () => 2)).toMatchObject({ value: 1, replayed: true });
      await sleep(600);
      expect(await store.get(key)).toBeUndefined();
      expect(await idem.run(key, {}, () => 3)).toMatchObject({ value: 3, replayed: false });
      // Expired rows of other keys go with the next put, in batches: no separate job.
      const short = Array.from({ length: 5 }, () => fresh('short'));
      for (const k of short) await client({ keepMs: 200 }).run(k, {}, () => 'x');
      await sleep(400);
      expect(await target.rows(short)).toBeGreaterThan(0);
      await client().run(fresh('k'), {}, () => 'y');
      expect(await target.rows(short)).toBe(0);
    });

    it('the store is fenced: a write under an older token is refused and changes nothing; giving a key back keeps its mark', async () => {
      const key = fresh('k');
      await store.put(key, 10n, { state: 'completed', token: 10n, payloadHash: '', value: '"ten"' }, 60_000);
      const refused = await store.put(key, 9n, { state: 'completed', token: 9n, payloadHash: '', value: '"nine"' }, 60_000).catch((e: unknown) => e);
      expect(refused).toBeInstanceOf(StaleTokenError);
      expect(refused).toMatchObject({ resource: `idempotency:${key}`, token: 9n, highest: 10n });
      expect(await store.get(key)).toEqual({ state: 'completed', token: 10n, payloadHash: '', value: '"ten"' });
      await store.put(key, 10n, undefined, 60_000);
      expect(await store.get(key)).toBeUndefined();
      await expect(store.put(key, 9n, { state: 'in-progress', token: 9n, payloadHash: '' }, 60_000)).rejects.toBeInstanceOf(StaleTokenError);
      expect(await store.get(key)).toBeUndefined();
      await store.put(key, 11n, { state: 'in-progress', token: 11n, payloadHash: 'h' }, 60_000);
      expect(await store.get(key)).toEqual({ state: 'in-progress', token: 11n, payloadHash: 'h' });
    });

    it('takeover: an attempt paused past its ttl is taken over with a higher token; its late completion is refused', async () => {
      const key = fresh('export');
      let resume!: () => void;
      const paused = new Promise<void>((r) => (resume = r));
      let firstToken = 0n;
      const first = frozen()
        .run(key, {}, async (lease: Lease) => {
          firstToken = lease.token;
          await paused;
          return 'first';
        })
        .catch((e: unknown) => e);
      await sleep(TTL_MS + 300);
      const second = await client().run(key, {}, () => 'second');
      expect(second).toMatchObject({ value: 'second', replayed: false });
      expect(second.token).toBeGreaterThan(firstToken);
      resume();
      expect(await first).toBeInstanceOf(StaleTokenError);
      expect(await store.get(key)).toMatchObject({ state: 'completed', token: second.token, value: '"second"' });
      expect(await client().run(key, {}, () => 'third')).toMatchObject({ value: 'second', replayed: true });
    });

    it("a late completion that lands just before the takeover's claim is replayed, not overwritten: fn runs once", async () => {
      const key = fresh('race');
      let resume!: () => void;
      const paused = new Promise<void>((r) => (resume = r));
      const first = frozen().run(key, {}, async () => {
        await paused;
        return 'first';
      });
      await sleep(TTL_MS + 300); // A's lease has run out; its completion has not landed yet
      // B has taken the lease and read the record (in progress); A's completion lands right before B's claim.
      const racing = {
        get: (k: string) => store.get(k),
        put: (...a: Parameters<typeof store.put>) => store.put(...a),
        claim: async (...a: Parameters<typeof store.claim>) => {
          resume();
          await first;
          return store.claim(...a);
        },
      };
      const locks = target.locks();
      clients.push(locks);
      let runs = 0;
      const second = await createIdempotency({ locks, store: racing, ttlMs: TTL_MS, keepMs: 60_000 }).run(key, {}, () => {
        runs++;
        return 'second';
      });
      expect(await first).toMatchObject({ value: 'first', replayed: false });
      expect(second).toMatchObject({ value: 'first', replayed: true });
      expect(runs).toBe(0);
      expect(await store.get(key)).toMatchObject({ state: 'completed', value: '"first"' });
    });

    describe('runInTransaction', () => {
      it('the effect and the completed record commit together; a replay writes nothing', async () => {
        const key = fresh('tx');
        const idem = client();
        const first = await idem.runInTransaction(key, { payload: { n: 1 } }, writing(key, 'first', 'stored'));
        expect(first).toMatchObject({ value: 'stored', replayed: false });
        const again = await client().runInTransaction(key, { payload: { n: 1 } }, writing(key, 'again', 'other'));
        expect(again).toEqual({ value: 'stored', replayed: true, token: first.token });
        expect(await target.effects(key)).toEqual(['first']);
      });

      it('fn throwing rolls the effect back and gives the key back', async () => {
        const key = fresh('tx');
        const boom = new Error('declined');
        const idem = client();
        const failing = (tx: Tx) => {
          const written = target.effect(tx, key, 'failed');
          if (!target.asyncEffect) throw boom;
          return Promise.resolve(written).then(() => Promise.reject(boom));
        };
        await expect(idem.runInTransaction(key, {}, failing)).rejects.toBe(boom);
        expect(await target.effects(key)).toEqual([]);
        expect(await store.get(key)).toBeUndefined();
        expect(await idem.runInTransaction(key, {}, writing(key, 'retry', 'ok'))).toMatchObject({ value: 'ok', replayed: false });
        expect(await target.effects(key)).toEqual(['retry']);
      });

      it('a result JSON cannot hold rolls the effect back (typed error)', async () => {
        const key = fresh('tx');
        const result = client()
          .runInTransaction(key, {}, writing(key, 'bigint', 1n))
          .catch((e: unknown) => e);
        expect(await result).toBeInstanceOf(InvalidArgumentError);
        expect(await target.effects(key)).toEqual([]);
        expect(await store.get(key)).toBeUndefined();
      });

      it("takeover: the paused attempt's transaction is refused whole, its effect row is absent", async () => {
        const key = fresh('tx-export');
        let resume!: () => void;
        const paused = new Promise<void>((r) => (resume = r));
        let reached!: () => void;
        const atPause = new Promise<void>((r) => (reached = r));
        let firstToken = 0n;
        let first: Promise<unknown>;
        if (target.asyncEffect) {
          // The pause falls inside the transaction, after the effect row was written.
          first = frozen().runInTransaction(key, {}, async (tx, lease) => {
            firstToken = lease.token;
            await target.effect(tx, key, 'first');
            reached();
            await paused;
            return 'first';
          });
        } else {
          // SQLite holds its write lock for the whole transaction: the pause falls between the claim and it.
          const late = {
            ...store,
            get: store.get,
            put: store.put,
            transact: async (...args: Parameters<typeof store.transact>) => {
              firstToken = args[1];
              reached();
              await paused;
              return store.transact(...args);
            },
          } as TransactionalIdempotencyStore<Tx>;
          const locks = target.locks();
          clients.push(locks);
          const noRenew = { acquire: (k: string, o: Record<string, unknown>) => locks.acquire(k, { ...o, autoRenew: false }) };
          first = createIdempotency<Tx>({ locks: noRenew, store: late, ttlMs: TTL_MS, waitMs: 5_000 }).runInTransaction(key, {}, (tx) => {
            target.effect(tx, key, 'first');
            return 'first';
          });
        }
        const settled = first.catch((e: unknown) => e);
        await atPause;
        await sleep(TTL_MS + 300);
        const second = await client().runInTransaction(key, {}, writing(key, 'second', 'second'));
        expect(second).toMatchObject({ value: 'second', replayed: false });
        expect(second.token).toBeGreaterThan(firstToken);
        resume();
        expect(await settled).toBeInstanceOf(StaleTokenError);
        expect(await target.effects(key)).toEqual(['second']);
        expect(await store.get(key)).toMatchObject({ state: 'completed', token: second.token, value: '"second"' });
      });

      it('transact under an older token runs nothing and commits nothing', async () => {
        const key = fresh('tx');
        await store.put(key, 20n, { state: 'in-progress', token: 20n, payloadHash: '' }, 60_000);
        const refused = await store
          .transact(key, 19n, writing(key, 'stale', 1), () => ({ state: 'completed', token: 19n, payloadHash: '', value: '1' }), 60_000)
          .catch((e: unknown) => e);
        expect(refused).toBeInstanceOf(StaleTokenError);
        expect(await target.effects(key)).toEqual([]);
        expect(await store.get(key)).toMatchObject({ state: 'in-progress', token: 20n });
      });
    });
  });
}

const worker = new URL('../fixtures/idempotency-worker.mjs', import.meta.url).pathname;

/** What a worker process prints last. */
export interface WorkerOutcome {
  event: 'done' | 'error';
  value?: { by: string };
  replayed?: boolean;
  token?: string;
  code?: string;
  message?: string;
}

/** A running test/fixtures/idempotency-worker.mjs: its JSON lines as they come, and its last one. */
export interface WorkerProcess {
  readonly pid: number;
  /** Resolves when the worker printed `{"event": event}`. */
  reached(event: string): Promise<void>;
  /** Resolves with the last line once the process exited. */
  outcome(): Promise<WorkerOutcome>;
  kill(): void;
}

export function startWorker(options: Record<string, unknown>): WorkerProcess {
  const child = spawn(process.execPath, [worker, JSON.stringify(options)], { stdio: ['ignore', 'pipe', 'pipe'] });
  const lines: Record<string, unknown>[] = [];
  const waiting: { event: string; resolve: () => void }[] = [];
  let stderr = '';
  child.stderr.on('data', (b: Buffer) => (stderr += b.toString()));
  createInterface({ input: child.stdout }).on('line', (line) => {
    const parsed = JSON.parse(line) as Record<string, unknown>;
    lines.push(parsed);
    for (const w of waiting.filter((x) => x.event === parsed.event)) w.resolve();
  });
  const exited = new Promise<number | null>((resolve) => child.on('close', resolve));
  return {
    pid: child.pid ?? 0,
    reached: (event) =>
      lines.some((l) => l.event === event)
        ? Promise.resolve()
        : Promise.race([
            new Promise<void>((resolve) => waiting.push({ event, resolve })),
            exited.then((code) => {
              throw new Error(`worker ${String(options.name)} exited (${code}) before "${event}": ${stderr}`);
            }),
          ]),
    outcome: async () => {
      const code = await exited;
      const last = lines.at(-1);
      if (last?.event !== 'done' && last?.event !== 'error') throw new Error(`worker ${String(options.name)} exited (${code}) with no outcome: ${stderr}`);
      return last as unknown as WorkerOutcome;
    },
    kill: () => {
      if (child.exitCode === null) {
        child.kill('SIGCONT');
        child.kill('SIGKILL');
      }
    },
  };
}

export interface ProcessTarget {
  /** What the worker opens: { db: 'sqlite', path } or { db: 'postgres', url, schema }. */
  readonly connection: Record<string, string>;
  /** The effect rows of key (worker names), committed ones only. */
  effects(key: string): Promise<string[]>;
  /** The idempotency store on the same database, to read the record the workers left. */
  store(): IdempotencyStore;
  /** The control's flag row. */
  flag(key: string): Promise<{ state: string; value: string | null } | undefined>;
  cleanup(): Promise<void>;
}

/** The process ttl: short, so the frozen attempt is past it soon. */
const PROCESS_TTL_MS = 600;

/**
 * Real processes on one database. Two call `run` with one key at once: fn runs once and both get
 * its value. The takeover: process A claims the key, its fn waits; the test SIGSTOPs it past its
 * ttl; process B runs the same key and completes; SIGCONT A. With leasehold A's completion is
 * refused (StaleTokenError) and the stored value is B's (in the transactional variant A's effect
 * row is absent too); with the control (a plain in-progress flag with an expiry) A completes as
 * well, overwriting B's result, and both effects land.
 */
export function processScenarios(name: string, setup: () => Promise<ProcessTarget>): void {
  describe(`idempotency with real processes: ${name}`, () => {
    let target: ProcessTarget;
    const started: WorkerProcess[] = [];
    let dir: { path: string; cleanup: () => void };
    let n = 0;
    const fresh = (what: string): string => `${what}:${++n}:${process.pid}`;
    const start = (options: Record<string, unknown>): WorkerProcess => {
      const w = startWorker({ ...target.connection, ttlMs: PROCESS_TTL_MS, ...options });
      started.push(w);
      return w;
    };

    beforeAll(async () => {
      target = await setup();
      dir = tempDir('leasehold-idem-');
    });
    afterAll(async () => {
      for (const w of started) w.kill();
      dir.cleanup();
      await target.cleanup();
    });

    it('two processes call run with one key at once: fn runs once and both get its value', async () => {
      const key = fresh('charge');
      const startFile = join(dir.path, `${key.replace(/:/g, '_')}.start`);
      const workers = ['P', 'Q'].map((w) => start({ mode: 'run', key, name: w, startFile, workMs: 300 }));
      await Promise.all(workers.map((w) => w.reached('ready')));
      writeFileSync(startFile, '');
      const outcomes = await Promise.all(workers.map((w) => w.outcome()));
      expect(outcomes.map((o) => o.event)).toEqual(['done', 'done']);
      expect(outcomes[0]!.value).toEqual(outcomes[1]!.value);
      expect(outcomes.map((o) => o.replayed).sort()).toEqual([false, true]);
      expect(outcomes[0]!.token).toBe(outcomes[1]!.token);
      expect(await target.effects(key)).toEqual([outcomes[0]!.value!.by]);
    });

    /** A claims and waits; SIGSTOP past its ttl; B runs the key to the end; SIGCONT A. */
    const takeover = async (mode: string) => {
      const key = fresh(mode);
      const goFile = join(dir.path, `${key.replace(/:/g, '_')}.go`);
      const a = start({ mode, key, name: 'A', goFile });
      await a.reached('claimed');
      process.kill(a.pid, 'SIGSTOP');
      try {
        await sleep(PROCESS_TTL_MS + 400); // frozen past its ttl: no renewal, no completion
        const b = await start({ mode, key, name: 'B' }).outcome();
        writeFileSync(goFile, '');
        process.kill(a.pid, 'SIGCONT');
        return { key, a: await a.outcome(), b };
      } finally {
        a.kill();
      }
    };

    it("takeover (run): A's late completion is refused, the stored value is B's", async () => {
      const { key, a, b } = await takeover('run');
      expect(b).toMatchObject({ event: 'done', value: { by: 'B' }, replayed: false });
      expect(a).toMatchObject({ event: 'error', code: 'STALE_TOKEN' });
      expect(await target.store().get(key)).toMatchObject({ state: 'completed', token: BigInt(b.token!), value: '{"by":"B"}' });
      // fn's own writes outside the store are fn's: both attempts made them (the transactional variant is the answer).
      expect((await target.effects(key)).sort()).toEqual(['A', 'B']);
    });

    it("takeover (runInTransaction): A's transaction is refused whole — its effect row is absent, the stored value is B's", async () => {
      const { key, a, b } = await takeover('tx');
      expect(b).toMatchObject({ event: 'done', value: { by: 'B' }, replayed: false });
      expect(a).toMatchObject({ event: 'error', code: 'STALE_TOKEN' });
      expect(await target.store().get(key)).toMatchObject({ state: 'completed', token: BigInt(b.token!), value: '{"by":"B"}' });
      expect(await target.effects(key)).toEqual(['B']);
    });

    it('control (an in-progress flag with an expiry, no lease, no fence): A completes too, overwrites B, both effects land', async () => {
      const { key, a, b } = await takeover('control');
      expect(b).toMatchObject({ event: 'done', value: { by: 'B' }, replayed: false });
      expect(a).toMatchObject({ event: 'done', value: { by: 'A' }, replayed: false });
      expect(await target.flag(key)).toEqual({ state: 'completed', value: '{"by":"A"}' });
      expect((await target.effects(key)).sort()).toEqual(['A', 'B']);
    });

    it('control with the effect and the completion in one transaction: still both effects land', async () => {
      const { key, a, b } = await takeover('control-tx');
      expect(b).toMatchObject({ event: 'done', value: { by: 'B' } });
      expect(a).toMatchObject({ event: 'done', value: { by: 'A' } });
      expect(await target.flag(key)).toEqual({ state: 'completed', value: '{"by":"A"}' });
      expect((await target.effects(key)).sort()).toEqual(['A', 'B']);
    });
  });
}

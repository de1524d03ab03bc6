/**
 * redisIdempotencyStore against the real Redis: the behaviours of test/core/idempotency.test.ts
 * (replay, concurrent calls run fn once, waitMs, payload mismatch, fn throwing, a result that is not
 * JSON, keepMs expiry by the server's clock, the takeover refused), on leases of the Redis backend,
 * and the store's own fence (one script: the mark and the record together), over ioredis and node-redis.
 */
import { Redis } from 'ioredis';
import { createClient } from 'redis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AcquireTimeoutError, IdempotencyMismatchError, InvalidArgumentError, StaleTokenError } from '../../src/core/errors.js';
import { createIdempotency } from '../../src/core/idempotency.js';
import { Locks } from '../../src/core/locks.js';
import type { AcquireOptions } from '../../src/core/options.js';
import { redisBackend, redisIdempotencyStore } from '../../src/redis/index.js';
import { sleep, uniqueName } from '../helpers/env.js';
import { deleteKeys, REDIS_URL } from './servers.js';

const ns = `${uniqueName('lh_idem')}:`;
const io = new Redis(REDIS_URL);
const node = createClient({ url: REDIS_URL });
node.on('error', () => {});
const opened: Locks[] = [];

beforeAll(async () => {
  await node.connect();
});
afterAll(async () => {
  await Promise.all(opened.map((l) => l.close()));
  await deleteKeys(REDIS_URL, ns);
  io.disconnect();
  await node.close();
});

const store = redisIdempotencyStore(io, { prefix: `${ns}idem:` });

/** A client of its own (as another process would have), its leases on the Redis backend. */
function locks(defaults?: Omit<AcquireOptions, 'signal'>): Locks {
  const l = new Locks({ backend: redisBackend({ url: REDIS_URL, prefix: `${ns}lock:` }), ...(defaults ? { defaults } : {}) });
  opened.push(l);
  return l;
}
const client = (options: { keepMs?: number; waitMs?: number; ttlMs?: number; defaults?: Omit<AcquireOptions, 'signal'> } = {}) => {
  const { defaults, ...rest } = options;
  return createIdempotency({ locks: locks(defaults), store, ttlMs: 5_000, keepMs: 60_000, waitMs: 5_000, ...rest });
};
let n = 0;
const fresh = (name: string): string => `${name}:${++n}`;

describe('redisIdempotencyStore: the store', () => {
  for (const [name, c] of [
    ['ioredis', () => io],
    ['node-redis', () => node],
  ] as const) {
    it(`${name}: fenced puts (a lower token is refused and changes nothing), deletes keep the mark, the key expires by PEXPIRE`, async () => {
      const s = redisIdempotencyStore(c(), { prefix: `${ns}${name}:` });
      const key = fresh('fence');
      expect(await s.get(key)).toBeUndefined();
      await s.put(key, 5n, { state: 'in-progress', token: 5n, payloadHash: 'h' }, 60_000);
      expect(await s.get(key)).toEqual({ state: 'in-progress', token: 5n, payloadHash: 'h' });
      const refused = await s.put(key, 4n, { state: 'completed', token: 4n, payloadHash: 'h', value: '"zombie"' }, 60_000).catch((e: unknown) => e);
      expect(refused).toBeInstanceOf(StaleTokenError);
      expect(refused).toMatchObject({ resource: `idempotency:${key}`, token: 4n, highest: 5n });
      expect(await s.get(key)).toEqual({ state: 'in-progress', token: 5n, payloadHash: 'h' });
      // the same token writes again (the same attempt completing)
      await s.put(key, 5n, { state: 'completed', token: 5n, payloadHash: 'h', value: '' }, 60_000);
      expect(await s.get(key)).toEqual({ state: 'completed', token: 5n, payloadHash: 'h', value: '' });
      // a delete removes the record, not the mark: the older token is still refused
      await s.put(key, 6n, undefined, 60_000);
      expect(await s.get(key)).toBeUndefined();
      await expect(s.put(key, 5n, { state: 'in-progress', token: 5n, payloadHash: 'h' }, 60_000)).rejects.toBeInstanceOf(StaleTokenError);
      const ttl = await io.pttl(`${ns}${name}:{${key}}`);
      expect(ttl).toBeGreaterThan(55_000);
      expect(ttl).toBeLessThanOrEqual(60_000);
    });
  }

  it('compares tokens above 2^53 exactly (as decimal strings, not Lua doubles)', async () => {
    const key = fresh('big');
    const high = 2n ** 62n + 1n;
    await store.put(key, high, { state: 'in-progress', token: high, payloadHash: '' }, 60_000);
    await expect(store.put(key, high - 1n, undefined, 60_000)).rejects.toMatchObject({ code: 'STALE_TOKEN', highest: high });
    await store.put(key, high + 1n, undefined, 60_000);
    await expect(store.put(key, 999n, undefined, 60_000)).rejects.toBeInstanceOf(StaleTokenError);
  });

  it('refuses bad arguments by name', () => {
    expect(() => redisIdempotencyStore({} as never)).toThrow(InvalidArgumentError);
    expect(() => redisIdempotencyStore(io, { prefix: 'a{b' })).toThrow(/options\.prefix/);
    expect(() => redisIdempotencyStore(io, { nope: 1 } as never)).toThrow(InvalidArgumentError);
  });
});

describe('redisIdempotencyStore: createIdempotency on Redis', () => {
  it('the first call runs fn; a later one (another client) replays its value with the token that stored it', async () => {
    const key = fresh('charge');
    let runs = 0;
    const first = await client().run(key, { payload: { amount: 5 } }, () => ({ charged: ++runs }));
    const again = await client().run(key, { payload: { amount: 5 } }, () => ({ charged: ++runs }));
    expect(first).toMatchObject({ value: { charged: 1 }, replayed: false });
    expect(again).toEqual({ value: { charged: 1 }, replayed: true, token: first.token });
    expect(runs).toBe(1);
  });

  it('concurrent calls: fn runs once, the others wait for its outcome and replay it', async () => {
    const key = fresh('concurrent');
    let runs = 0;
    const results = await Promise.all(
      Array.from({ length: 5 }, (_, i) =>
        client().run(key, {}, async () => {
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
    const key = fresh('wait');
    let release!: () => void;
    const first = client().run(key, {}, () => new Promise<string>((r) => (release = () => r('x'))));
    await sleep(100);
    const started = performance.now();
    await expect(client({ waitMs: 300 }).run(key, {}, () => 'never')).rejects.toBeInstanceOf(AcquireTimeoutError);
    expect(performance.now() - started).toBeGreaterThanOrEqual(250);
    release();
    expect((await first).value).toBe('x');
  });

  it('a different payload is refused, never a silent replay of another request', async () => {
    const key = fresh('mismatch');
    const idem = client();
    await idem.run(key, { payload: { amount: 5 } }, () => 'ok');
    await expect(idem.run(key, { payload: { amount: 6 } }, () => 'other')).rejects.toBeInstanceOf(IdempotencyMismatchError);
    await expect(client().run(key, {}, () => 'other')).rejects.toMatchObject({ code: 'IDEMPOTENCY_MISMATCH' });
  });

  it('fn throwing gives the key back: the error reaches the caller and a retry runs again', async () => {
    const key = fresh('throws');
    const idem = client();
    const boom = new Error('card declined');
    await expect(idem.run(key, {}, () => Promise.reject(boom))).rejects.toBe(boom);
    expect(await store.get(key)).toBeUndefined();
    expect(await idem.run(key, {}, () => 'second try')).toMatchObject({ value: 'second try', replayed: false });
  });

  it('a result that JSON cannot hold is a typed error and nothing is stored', async () => {
    const key = fresh('json');
    const idem = client();
    await expect(idem.run(key, {}, () => ({ big: 1n }))).rejects.toBeInstanceOf(InvalidArgumentError);
    expect(await store.get(key)).toBeUndefined();
    expect(await idem.run(key, {}, () => 'fine')).toMatchObject({ value: 'fine', replayed: false });
  });

  it('completed records expire after keepMs by the server clock: a call after that runs again', async () => {
    const key = fresh('expiry');
    const idem = client({ keepMs: 400 });
    await idem.run(key, {}, () => 1);
    expect(await idem.run(key, {}, () => 2)).toMatchObject({ value: 1, replayed: true });
    const ttl = await io.pttl(`${ns}idem:{${key}}`);
    expect(ttl).toBeGreaterThan(0);
    expect(ttl).toBeLessThanOrEqual(400);
    await sleep(500);
    expect(await io.exists(`${ns}idem:{${key}}`)).toBe(0); // gone from Redis itself, no purge needed
    expect(await idem.run(key, {}, () => 3)).toMatchObject({ value: 3, replayed: false });
  });

  it('takeover: an attempt whose lease runs out inside fn is taken over with a higher token; its late completion is refused', async () => {
    const key = fresh('export');
    // The first attempt holds a 600 ms lease that is not renewed (a frozen process renews nothing).
    const a = client({ ttlMs: 600, defaults: { autoRenew: false } });
    const b = client();
    let resume!: () => void;
    const paused = new Promise<void>((r) => (resume = r));
    let firstToken = 0n;
    let lostBeforeResume = false;
    const first = a
      .run(key, {}, async (lease) => {
        firstToken = lease.token;
        await paused; // its lease runs out meanwhile
        lostBeforeResume = lease.signal.aborted;
        return 'first';
      })
      .catch((e: unknown) => e);
    await sleep(800);
    const second = await b.run(key, {}, () => 'second');
    expect(second).toMatchObject({ value: 'second', replayed: false });
    expect(second.token).toBeGreaterThan(firstToken);
    resume();
    const late = await first;
    expect(lostBeforeResume).toBe(true);
    expect(late).toBeInstanceOf(StaleTokenError); // its completion was refused by the store's fence
    expect(await store.get(key)).toMatchObject({ state: 'completed', token: second.token, value: '"second"' });
    expect(await a.run(key, {}, () => 'third')).toMatchObject({ value: 'second', replayed: true });
  });
});

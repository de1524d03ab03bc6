/**
 * The idempotency recipe's logic (issue 17) on the memory coordinator and store with an injected
 * clock: first call runs, later calls replay, concurrent calls wait and never run fn twice, a
 * different payload is refused, fn throwing gives the key back, a result that is not JSON is a typed
 * error, records expire after keepMs, and the takeover: an attempt that pauses past its ttl is taken
 * over with a higher token and its late completion is refused; the stored value is the new one's.
 * The same logic runs on the SQLite, PostgreSQL and Redis stores in their own tests.
 */
import { describe, expect, it } from 'vitest';
import { flush, advance as advanceBy } from '../helpers/clock.js';
import type { Backend } from '../../src/core/backend.js';
import { manualClock, type ManualClock } from '../../src/core/clock.js';
import { AcquireTimeoutError, IdempotencyMismatchError, InvalidArgumentError, StaleTokenError } from '../../src/core/errors.js';
import { createIdempotency, payloadHash } from '../../src/core/idempotency.js';
import { Locks } from '../../src/core/locks.js';
import { memoryBackend, memoryIdempotencyStore } from '../../src/memory/index.js';

const advance = (clock: ManualClock, ms: number, step = 50): Promise<void> => advanceBy(clock, ms, step);

function setup() {
  const clock = manualClock(1_000);
  const coordinator = memoryBackend({ clock });
  const own = (): Backend => Object.create(coordinator, { close: { value: async () => {} } }) as Backend;
  const store = memoryIdempotencyStore({ clock });
  const client = () => createIdempotency({ locks: new Locks({ backend: own(), clock }), store, ttlMs: 1_000, keepMs: 60_000, waitMs: 5_000 });
  const locks = () => new Locks({ backend: own(), clock });
  return { clock, store, client, locks };
}

describe('payloadHash', () => {
  it('is stable under key order and refuses what JSON cannot hold', () => {
    expect(payloadHash({ a: 1, b: [1, { c: 2, d: 3 }] })).toBe(payloadHash({ b: [1, { d: 3, c: 2 }], a: 1 }));
    expect(payloadHash({ a: 1 })).not.toBe(payloadHash({ a: 2 }));
    expect(payloadHash(undefined)).toBe('');
    expect(() => payloadHash({ n: 1n })).toThrow(InvalidArgumentError);
  });
});

describe('idempotency', () => {
  it('the first call runs fn; a later one replays its value with the token that stored it', async () => {
    const { client } = setup();
    const idem = client();
    let runs = 0;
    const first = await idem.run('charge:order-17', { payload: { amount: 5 } }, () => ({ charged: ++runs }));
    const again = await idem.run('charge:order-17', { payload: { amount: 5 } }, () => ({ charged: ++runs }));
    expect(first).toMatchObject({ value: { charged: 1 }, replayed: false });
    expect(again).toEqual({ value: { charged: 1 }, replayed: true, token: first.token });
    expect(runs).toBe(1);
  });

  it('concurrent calls: fn runs once, the others wait for its outcome', async () => {
    const { clock, client } = setup();
    const [a, b] = [client(), client()];
    let runs = 0;
    let finish!: () => void;
    const slow = new Promise<void>((r) => (finish = r));
    const first = a.run('k', {}, async () => {
      runs++;
      await slow;
      return 'done';
    });
    await flush();
    const second = b.run('k', {}, () => {
      runs++;
      return 'again';
    });
    await advance(clock, 200);
    finish();
    await advance(clock, 600);
    expect(await first).toMatchObject({ value: 'done', replayed: false });
    expect(await second).toMatchObject({ value: 'done', replayed: true });
    expect(runs).toBe(1);
  });

  it('a concurrent call waits at most waitMs (AcquireTimeoutError), never running fn at the same time', async () => {
    const { clock, client } = setup();
    const a = client();
    let release!: () => void;
    const first = a.run('k', {}, () => new Promise<string>((r) => (release = () => r('x'))));
    await flush();
    const b = client();
    const second = b.run('k', {}, () => 'never').catch((e: unknown) => e);
    await advance(clock, 5_200);
    expect(await second).toBeInstanceOf(AcquireTimeoutError);
    release();
    await advance(clock, 100);
    expect((await first).value).toBe('x');
  });

  it('a different payload is refused, never a silent replay of another request', async () => {
    const { client } = setup();
    const idem = client();
    await idem.run('k', { payload: { amount: 5 } }, () => 'ok');
    await expect(idem.run('k', { payload: { amount: 6 } }, () => 'other')).rejects.toBeInstanceOf(IdempotencyMismatchError);
    await expect(idem.run('k', {}, () => 'other')).rejects.toMatchObject({ code: 'IDEMPOTENCY_MISMATCH' });
  });

  it('fn throwing gives the key back: the error reaches the caller and a retry runs again', async () => {
    const { client } = setup();
    const idem = client();
    const boom = new Error('card declined');
    await expect(idem.run('k', {}, () => Promise.reject(boom))).rejects.toBe(boom);
    expect(await idem.run('k', {}, () => 'second try')).toMatchObject({ value: 'second try', replayed: false });
  });

  it('a result that JSON cannot hold is a typed error and nothing is stored', async () => {
    const { client } = setup();
    const idem = client();
    await expect(idem.run('k', {}, () => ({ big: 1n }))).rejects.toBeInstanceOf(InvalidArgumentError);
    expect(await idem.run('k', {}, () => 'fine')).toMatchObject({ value: 'fine', replayed: false });
  });

  it('completed records expire after keepMs: a call after that runs again', async () => {
    const { clock, client } = setup();
    const idem = client();
    await idem.run('k', {}, () => 1);
    await advance(clock, 59_000, 1_000);
    expect(await idem.run('k', {}, () => 2)).toMatchObject({ value: 1, replayed: true });
    await advance(clock, 2_000, 1_000);
    expect(await idem.run('k', {}, () => 3)).toMatchObject({ value: 3, replayed: false });
  });

  it("a late completion that lands just before the takeover's claim is replayed, not overwritten: fn runs once", async () => {
    const { clock, store, client, locks } = setup();
    const a = client();
    let resume!: () => void;
    const paused = new Promise<void>((r) => (resume = r));
    const first = a.run('race', {}, async () => {
      await paused;
      return 'first';
    });
    await flush();
    clock.jump(1_500); // A's lease runs out while it is "frozen"
    await flush();
    const racing = {
      get: (k: string) => store.get(k),
      put: (...x: Parameters<typeof store.put>) => store.put(...x),
      claim: async (...x: Parameters<typeof store.claim>) => {
        resume(); // A's completion lands between B's read and B's claim
        await first;
        return store.claim(...x);
      },
    };
    const b = createIdempotency({ locks: locks(), store: racing, ttlMs: 1_000 });
    let runs = 0;
    const second = await b.run('race', {}, () => {
      runs++;
      return 'second';
    });
    expect(await first).toMatchObject({ value: 'first', replayed: false });
    expect(second).toMatchObject({ value: 'first', replayed: true });
    expect(runs).toBe(0);
  });

  it('the in-progress record lives the lease ttl, not keepMs (it never outlives its lease)', async () => {
    const { clock, store, client } = setup();
    let finish!: () => void;
    const running = client().run('long', {}, () => new Promise<string>((r) => (finish = () => r('done'))));
    await flush();
    expect(await store.get('long')).toMatchObject({ state: 'in-progress' });
    await advance(clock, 1_100); // the ttl is 1 s: the lease is renewed, the claim record has lapsed
    expect(await store.get('long')).toBeUndefined();
    finish();
    await advance(clock, 100);
    expect(await running).toMatchObject({ value: 'done', replayed: false });
    expect(await store.get('long')).toMatchObject({ state: 'completed' });
  });

  it('takeover: an attempt paused past its ttl is taken over with a higher token; its late completion is refused', async () => {
    const { clock, store, client } = setup();
    const [a, b] = [client(), client()];
    let resume!: () => void;
    const paused = new Promise<void>((r) => (resume = r));
    let firstToken = 0n;
    const first = a
      .run('export:42', {}, async (lease) => {
        firstToken = lease.token;
        await paused; // frozen: its lease runs out meanwhile
        return 'first';
      })
      .catch((e: unknown) => e);
    await flush();
    // Renewals stop while the process is "frozen": stop the first client's clock-driven renewal by
    // letting its validity run out (its lease ttl is 1 s; the manual clock jumps past it).
    clock.jump(1_500);
    await flush();
    const second = await b.run('export:42', {}, () => 'second');
    expect(second).toMatchObject({ value: 'second', replayed: false });
    expect(second.token).toBeGreaterThan(firstToken);
    resume();
    await flush();
    const late = await first;
    expect(late).toBeInstanceOf(StaleTokenError); // its completion was refused by the fence
    expect(await store.get('export:42')).toMatchObject({ state: 'completed', token: second.token, value: '"second"' });
    expect(await a.run('export:42', {}, () => 'third')).toMatchObject({ value: 'second', replayed: true });
  });
});

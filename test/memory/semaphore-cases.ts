import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AcquireRequest, AcquireResult, Backend } from '../../src/core/backend.js';
import { guardBackend } from '../../src/core/guard.js';
import { InvalidArgumentError } from '../../src/core/errors.js';
import type { Lease } from '../../src/core/lease.js';
import { Locks } from '../../src/core/locks.js';
import { eventually, sleep } from '../helpers/env.js';

export interface SemaphoreSetup {
  /** A new client of one coordinator (its own connection where the backend has one), closed by the cases. */
  connect(): Promise<Backend>;
  cleanup(): Promise<void>;
}

let serial = 0;

/**
 * The semaphore contract (`AcquireRequest.limit`, `KeyState.limit`) and `watch`, through the Backend
 * interface of one fair backend, with several clients of one coordinator. Registered by
 * test/{memory,sqlite,postgres}/semaphore.test.ts.
 */
export function semaphoreCases(name: string, setup: () => Promise<SemaphoreSetup>): void {
  describe(`${name}: semaphore permits`, () => {
    let env: SemaphoreSetup;
    const opened: Backend[] = [];
    const connect = async (): Promise<Backend> => {
      const b = guardBackend(await env.connect());
      opened.push(b);
      return b;
    };
    beforeAll(async () => {
      env = await setup();
    });
    afterAll(async () => {
      await Promise.all(opened.map((b) => b.close()));
      await env.cleanup();
    });

    const newKey = (): string => `sem:${process.pid}:${++serial}:${Math.random().toString(36).slice(2, 8)}`;
    const permit = (key: string, owner: string, over: Partial<AcquireRequest> = {}): AcquireRequest => ({
      key,
      owner,
      mode: 'shared',
      ttlMs: 5_000,
      lockDelayMs: 0,
      holder: `label-${owner}`,
      queue: false,
      queueTtlMs: 10_000,
      limit: 3,
      ...over,
    });
    const tokenOf = (r: AcquireResult): bigint => {
      if (!r.granted) throw new Error('expected a grant');
      return r.token;
    };
    const state = async (b: Backend, key: string) => (await b.inspect(key)).find((s) => s.key === key);

    it('with N permits and more contenders, exactly N are granted, each its own increasing token; inspect shows them and the limit', async () => {
      const key = newKey();
      const clients = await Promise.all(Array.from({ length: 4 }, () => connect()));
      const results = await Promise.all(Array.from({ length: 12 }, (_, i) => clients[i % 4]!.acquire(permit(key, `o${i}`))));
      const granted = results.filter((r) => r.granted).map(tokenOf);
      expect(granted).toHaveLength(3);
      expect(new Set(granted).size).toBe(3);
      const s = await state(clients[0]!, key);
      expect(s?.limit).toBe(3);
      expect(s?.holders.map((h) => h.token)).toEqual([...granted].sort((a, b) => (a < b ? -1 : 1)));
      expect(s?.holders.every((h) => h.mode === 'shared')).toBe(true);
      expect(s?.lastToken).toBe(granted.reduce((a, b) => (a > b ? a : b)));
      // one released, the next permit gets a token above every earlier one
      const firstOwner = results.findIndex((r) => r.granted);
      await clients[firstOwner % 4]!.release({ key, owner: `o${firstOwner}`, token: tokenOf(results[firstOwner]!), mode: 'shared' });
      const next = tokenOf(await clients[1]!.acquire(permit(key, 'late')));
      expect(next > s!.lastToken).toBe(true);
      expect((await state(clients[2]!, key))?.holders).toHaveLength(3);
    });

    it('a request naming another limit, or mixing permits with plain shared holders, is refused naming both, and nothing is written', async () => {
      const [a, b] = [await connect(), await connect()];
      const key = newKey();
      tokenOf(await a.acquire(permit(key, 'p1')));
      const before = await state(a, key);
      const refused = (r: Promise<unknown>) => expect(r).rejects.toBeInstanceOf(InvalidArgumentError);

      const other = b.acquire(permit(key, 'p2', { limit: 5, queue: true }));
      await refused(other);
      const error = (await other.catch((e: unknown) => e)) as InvalidArgumentError;
      expect(error.argument).toBe('limit');
      expect(error.message).toContain(`"${key}"`);
      expect(error.message).toMatch(/semaphore of 3 permits.*5 permits/);
      const plain = b.acquire(permit(key, 'p3', { limit: undefined, queue: true }));
      await refused(plain);
      expect(((await plain.catch((e: unknown) => e)) as Error).message).toMatch(/semaphore of 3 permits.*without a limit/);
      const after = await state(b, key);
      expect(after?.lastToken).toBe(before?.lastToken);
      expect(after?.waiters).toBe(0);
      expect(after?.holders).toHaveLength(1);

      const sharedKey = newKey();
      tokenOf(await a.acquire(permit(sharedKey, 's1', { limit: undefined })));
      const onShared = b.acquire(permit(sharedKey, 's2', { limit: 2, queue: true }));
      await refused(onShared);
      expect(((await onShared.catch((e: unknown) => e)) as Error).message).toMatch(/shared holders without a limit.*2 permits/);
      expect((await state(a, sharedKey))?.lastToken).toBe(1n);
      expect((await state(a, sharedKey))?.limit).toBeUndefined();
    });

    it('a waiter asking again with a fresh place is refused, not kept waiting, once the key holds permits of another limit', async () => {
      const [a, b] = [await connect(), await connect()];
      const key = newKey();
      const x = tokenOf(await a.acquire(permit(key, 'x', { mode: 'exclusive', limit: undefined })));
      const p2 = permit(key, 'p2', { limit: 2, queue: true });
      const w = permit(key, 'w', { limit: 3, queue: true });
      expect((await b.acquire(p2)).granted).toBe(false);
      expect((await b.acquire(permit(key, 'e', { mode: 'exclusive', limit: undefined, queue: true }))).granted).toBe(false);
      expect((await b.acquire(w)).granted).toBe(false);
      await a.release({ key, owner: 'x', token: x, mode: 'exclusive' });
      tokenOf(await b.acquire(p2));
      const lastToken = (await state(a, key))?.lastToken;
      await expect(b.acquire(w)).rejects.toThrow(/semaphore of 2 permits.*3 permits/);
      expect((await state(a, key))?.lastToken).toBe(lastToken);
    });

    it('an exclusive request waits for every permit; an exclusive waiter ahead holds back later permits', async () => {
      const [a, b] = [await connect(), await connect()];
      const key = newKey();
      const t1 = tokenOf(await a.acquire(permit(key, 'p1')));
      const t2 = tokenOf(await a.acquire(permit(key, 'p2')));
      const exclusive = permit(key, 'x', { mode: 'exclusive', limit: undefined, queue: true });
      expect((await b.acquire(exclusive)).granted).toBe(false);
      // a place is free, but the exclusive waiter came first
      expect((await b.acquire(permit(key, 'p3', { queue: true }))).granted).toBe(false);
      await a.release({ key, owner: 'p1', token: t1, mode: 'shared' });
      expect((await b.acquire(exclusive)).granted).toBe(false);
      await a.release({ key, owner: 'p2', token: t2, mode: 'shared' });
      const tx = tokenOf(await b.acquire(exclusive));
      expect(tx > t2).toBe(true);
      const s = await state(a, key);
      expect(s?.limit).toBeUndefined();
      expect(s?.holders.map((h) => h.mode)).toEqual(['exclusive']);
    });

    it("a crashed permit holder's permit frees on expiry", async () => {
      const [a, b] = [await connect(), await connect()];
      const key = newKey();
      tokenOf(await a.acquire(permit(key, 'crashed', { limit: 2, ttlMs: 300 })));
      tokenOf(await a.acquire(permit(key, 'alive', { limit: 2 })));
      const waiter = permit(key, 'w', { limit: 2, queue: true });
      expect((await b.acquire(waiter)).granted).toBe(false);
      await sleep(350);
      const t = tokenOf(await b.acquire(waiter));
      const s = await state(b, key);
      expect(s?.holders.map((h) => h.holder).sort()).toEqual(['label-alive', 'label-w']);
      expect(s?.lastToken).toBe(t);
    });

    it('a released permit goes to the first permit waiter (FIFO hand-off)', async () => {
      const [a, b] = [await connect(), await connect()];
      const key = newKey();
      const held = [tokenOf(await a.acquire(permit(key, 'h1', { limit: 2 }))), tokenOf(await a.acquire(permit(key, 'h2', { limit: 2 })))];
      const w = (i: number) => permit(key, `w${i}`, { limit: 2, queue: true });
      for (const i of [1, 2, 3]) expect((await b.acquire(w(i))).granted).toBe(false);
      await a.release({ key, owner: 'h1', token: held[0]!, mode: 'shared' });
      // the later waiters ask first, and still wait for the first
      expect((await b.acquire(w(3))).granted).toBe(false);
      expect((await b.acquire(w(2))).granted).toBe(false);
      const t1 = tokenOf(await b.acquire(w(1)));
      await a.release({ key, owner: 'h2', token: held[1]!, mode: 'shared' });
      expect((await b.acquire(w(3))).granted).toBe(false);
      const t2 = tokenOf(await b.acquire(w(2)));
      expect(t2 > t1).toBe(true);
      expect((await state(a, key))?.waiters).toBe(1);
      // a request that will not wait (tryAcquire) does not pass the waiter either
      expect((await a.acquire(permit(key, 'barger', { limit: 2 }))).granted).toBe(false);
    });

    it('through Locks: eight workers share 3 permits; never more than 3 held leases or holders, tokens increase, a crashed permit expires', async () => {
      const key = newKey();
      const locks = await Promise.all(Array.from({ length: 4 }, async () => new Locks({ backend: await connect() })));
      const live = new Set<Lease>();
      const tokens: bigint[] = [];
      let most = 0;
      let overInspect = 0;
      const end = Date.now() + 1_500;
      const worker = async (l: Locks): Promise<void> => {
        while (Date.now() < end) {
          const lease = await l.acquire(key, { limit: 3, ttlMs: 2_000, waitMs: 5_000 });
          live.add(lease);
          tokens.push(lease.token);
          most = Math.max(most, [...live].filter((x) => x.held).length);
          const s = await state(opened[0]!, key);
          if ((s?.holders.length ?? 0) > 3 || (s && s.limit !== 3)) overInspect++;
          await sleep(5 + Math.random() * 10);
          live.delete(lease);
          await lease.release();
        }
      };
      await Promise.all(Array.from({ length: 8 }, (_, i) => worker(locks[i % 4]!)));
      expect(most).toBeGreaterThan(1);
      expect(most).toBeLessThanOrEqual(3);
      expect(overInspect).toBe(0);
      expect(new Set(tokens).size).toBe(tokens.length);
      // a permit holder that stops renewing frees its place on expiry
      const crashed = await locks[0]!.acquire(key, { limit: 3, ttlMs: 250, autoRenew: false });
      const others = [await locks[1]!.acquire(key, { limit: 3 }), await locks[2]!.acquire(key, { limit: 3 })];
      const started = Date.now();
      const third = await locks[3]!.acquire(key, { limit: 3, waitMs: 3_000 });
      expect(Date.now() - started).toBeGreaterThan(100);
      expect(crashed.held).toBe(false);
      expect(third.token > others[1]!.token).toBe(true);
      expect((await state(opened[0]!, key))?.holders).toHaveLength(3);
      await Promise.all([...others, third].map((x) => x.release()));
    });

    it('watch fires on a grant and on a release, made by this client or another', async () => {
      const [a, b] = [await connect(), await connect()];
      const key = newKey();
      let calls = 0;
      const off = await a.watch!(key, () => calls++);
      try {
        const t = tokenOf(await b.acquire(permit(key, 'g')));
        expect(await eventually(() => calls > 0, 2_000)).toBe(true);
        const afterGrant = calls;
        await b.release({ key, owner: 'g', token: t, mode: 'shared' });
        expect(await eventually(() => calls > afterGrant, 2_000)).toBe(true);
        const afterRelease = calls;
        const own = tokenOf(await a.acquire(permit(key, 'own', { mode: 'exclusive', limit: undefined })));
        expect(await eventually(() => calls > afterRelease, 2_000)).toBe(true);
        const afterOwn = calls;
        await a.release({ key, owner: 'own', token: own, mode: 'exclusive' });
        expect(await eventually(() => calls > afterOwn, 2_000)).toBe(true);
      } finally {
        off();
      }
      const ended = calls;
      await b.acquire(permit(key, 'after'));
      await sleep(100);
      expect(calls).toBe(ended);
    });

    it('watch fires when a holder expires without a release', async () => {
      const [a, b] = [await connect(), await connect()];
      const key = newKey();
      tokenOf(await b.acquire(permit(key, 'short', { mode: 'exclusive', limit: undefined, ttlMs: 300 })));
      let calls = 0;
      const off = await a.watch!(key, () => calls++);
      try {
        await sleep(100);
        const before = calls;
        expect(await eventually(() => calls > before, 2_000)).toBe(true);
      } finally {
        off();
      }
    });
  });
}

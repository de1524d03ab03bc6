/**
 * The backend conformance suite: every backend registers it (this repository's in
 * test/conformance/*.test.ts; a third party's through `leasehold/testing`) and must pass it against
 * its real server. It drives backends through the public client (`Locks`) and, for the ownership
 * rules (I4, I5), through the Backend interface itself.
 *
 * A test whose contract depends on a capability the backend does not declare (`capabilities.fair`,
 * `sessions`) or on something the harness cannot do (`restart`) is reported as skipped, with the
 * reason: never as passed without having checked anything.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { AcquireResult, Backend } from '../core/backend.js';
import { AcquireTimeoutError, ClosedError, InvalidArgumentError, LeaseLostError } from '../core/errors.js';
import { Locks, type LocksOptions } from '../core/locks.js';
import type { Lease } from '../core/lease.js';
import { parseSequencer } from '../core/token.js';
import { counting } from './counting.js';
import { eventually, sleep } from './wait.js';

/** What the suite needs to drive a backend: made once per suite, in `beforeAll`. */
export interface BackendHarness {
  /**
   * A new client of the shared coordinator (each call: as if another process connected). The
   * suite closes what it connects (through `Locks.close()` or `backend.close()`).
   */
  connect(): Promise<Backend>;
  /** Key prefix unique to this run: the coordinator may be shared with other tests. */
  prefix: string;
  /** Base ttl for timing tests; at least the backend's minimum. @default 400 */
  ttlMs?: number;
  /** Restarts the coordinator keeping its data, if the harness can; without it the restart test is skipped. */
  restart?(): Promise<void>;
  /** Called once after the suite (stop servers, drop schemas, delete keys). */
  cleanup(): Promise<void>;
}

type Granted = Extract<AcquireResult, { granted: true }>;

/** The grant, or a failed assertion: the checks that follow need the grant's token. */
function expectGranted(result: AcquireResult): Granted {
  expect(result.granted, 'the coordinator granted the request').toBe(true);
  return result as Granted;
}

export function backendConformance(name: string, make: () => Promise<BackendHarness>): void {
  describe(`backend conformance: ${name}`, () => {
    let h: BackendHarness;
    let T: number;
    let clients: Locks[] = [];
    let n = 0;

    const client = async (options?: Omit<LocksOptions, 'backend'>, backend?: Backend): Promise<Locks> => {
      const locks = new Locks({ ...options, backend: backend ?? (await h.connect()) });
      clients.push(locks);
      return locks;
    };
    /** A fresh key per test, so tests never see each other's state. */
    const key = (label: string): string => `${h.prefix}:${label}:${++n}`;

    beforeAll(async () => {
      h = await make();
      T = h.ttlMs ?? 400;
    });
    afterEach(async () => {
      await Promise.allSettled(clients.map((c) => c.close()));
      clients = [];
    });
    afterAll(async () => {
      await h?.cleanup();
    });

    it('I1/I2: grants of a key get strictly increasing tokens across releases and clients', async () => {
      const k = key('mono');
      const a = await client();
      const b = await client();
      const seen: bigint[] = [];
      for (let i = 0; i < 6; i++) {
        const lease = await (i % 2 ? b : a).acquire(k, { ttlMs: 10 * T });
        seen.push(lease.token);
        await lease.release();
      }
      for (let i = 1; i < seen.length; i++) expect(seen[i]!).toBeGreaterThan(seen[i - 1]!);
      expect(seen[0]!).toBeGreaterThanOrEqual(1n);
    });

    it('an exclusive holder excludes everyone; tryAcquire answers null without waiting', async () => {
      const k = key('excl');
      const a = await client();
      const b = await client();
      const lease = await a.acquire(k, { ttlMs: 10 * T });
      expect(await b.tryAcquire(k, { ttlMs: T })).toBeNull();
      expect(await b.tryAcquire(k, { ttlMs: T, mode: 'shared' })).toBeNull();
      expect(await a.tryAcquire(k, { ttlMs: T })).toBeNull(); // a second lease of the same client is another holder
      await lease.release();
      const next = await b.tryAcquire(k, { ttlMs: T });
      expect(next?.token).toBeGreaterThan(lease.token);
    });

    it('shared holders coexist with distinct tokens; exclusive waits for all of them', async () => {
      const k = key('shared');
      const [a, b, c] = [await client(), await client(), await client()];
      const s1 = await a.acquire(k, { ttlMs: 10 * T, mode: 'shared' });
      const s2 = await b.acquire(k, { ttlMs: 10 * T, mode: 'shared' });
      expect(s1.token).not.toBe(s2.token);
      expect(s2.token).toBeGreaterThan(s1.token);
      expect(s1.mode).toBe('shared');
      expect(parseSequencer(s2.sequencer).mode).toBe('shared');
      expect(await c.tryAcquire(k, { ttlMs: T })).toBeNull();
      const excl = c.acquire(k, { ttlMs: 10 * T, waitMs: 20 * T });
      await sleep(T / 2);
      await s1.release();
      await sleep(T / 2);
      let granted = false;
      void excl.then(() => (granted = true));
      await sleep(T / 4);
      expect(granted).toBe(false); // s2 still holds
      await s2.release();
      const e = await excl;
      expect(e.token).toBeGreaterThan(s2.token);
      // and shared requests wait behind the exclusive holder
      expect(await a.tryAcquire(k, { ttlMs: T, mode: 'shared' })).toBeNull();
    });

    it('I4: only the holder can renew or release; release is idempotent', async () => {
      const k = key('owner');
      const backend = await h.connect();
      try {
        const grant = expectGranted(
          await backend.acquire({ key: k, owner: 'owner-1', mode: 'exclusive', ttlMs: 10 * T, lockDelayMs: 0, holder: 'test', queue: false, queueTtlMs: 2000 }),
        );
        const base = { key: k, mode: 'exclusive' as const };
        expect(await backend.renew({ ...base, owner: 'owner-2', token: grant.token, ttlMs: 10 * T })).toEqual({ renewed: false });
        expect(await backend.renew({ ...base, owner: 'owner-1', token: grant.token + 1n, ttlMs: 10 * T })).toEqual({ renewed: false });
        await backend.release({ ...base, owner: 'owner-2', token: grant.token });
        await backend.release({ ...base, owner: 'owner-1', token: grant.token + 1n });
        const other = await client();
        expect(await other.tryAcquire(k, { ttlMs: T })).toBeNull(); // still held by owner-1
        const renewed = await backend.renew({ ...base, owner: 'owner-1', token: grant.token, ttlMs: 10 * T });
        expect(renewed.renewed).toBe(true);
        await backend.release({ ...base, owner: 'owner-1', token: grant.token });
        await backend.release({ ...base, owner: 'owner-1', token: grant.token }); // idempotent
        const next = await other.tryAcquire(k, { ttlMs: T });
        expect(next).not.toBeNull();
        // the old owner's late release does not remove the new holder
        await backend.release({ ...base, owner: 'owner-1', token: grant.token });
        expect(await (await client()).tryAcquire(k, { ttlMs: T })).toBeNull();
        expect(next!.held).toBe(true);
      } finally {
        await backend.close();
      }
    });

    it('I5: a retried request that gets its own earlier grant back has it renewed from the retry', async () => {
      // Core asks again with the same owner when an answer was lost or late; the coordinator gives
      // back the grant it made then. Core counts the lease's validity from the retry, so the
      // coordinator's expiry must count from the retry too, not from the first request.
      const k = key('retry');
      const backend = await h.connect();
      try {
        const request = {
          key: k,
          owner: 'owner-retry',
          mode: 'exclusive' as const,
          ttlMs: 3 * T,
          lockDelayMs: 0,
          holder: 'test',
          queue: false,
          queueTtlMs: 2000,
        };
        expectGranted(await backend.acquire(request));
        await sleep(2 * T);
        const again = expectGranted(await backend.acquire(request)); // the same grant, or (Redlock) a new one replacing it
        const [state] = await backend.inspect(k);
        expect(state?.holders.map((h) => h.token)).toEqual([again.token]);
        expect(state!.holders[0]!.expiresInMs).toBeGreaterThanOrEqual(again.ttlMs - T);
        await backend.release({ key: k, owner: 'owner-retry', token: again.token, mode: 'exclusive' });
      } finally {
        await backend.close();
      }
    });

    it('background renewal keeps a lease well past its ttl', async () => {
      const k = key('renew');
      const a = await client();
      const b = await client();
      const lease = await a.acquire(k, { ttlMs: T });
      await sleep(3 * T);
      expect(lease.signal.aborted).toBe(false);
      expect(lease.held).toBe(true);
      expect(await b.tryAcquire(k, { ttlMs: T })).toBeNull();
      await lease.renew();
      expect(lease.remainingMs()).toBeGreaterThan(0);
      await lease.release();
      expect(lease.remainingMs()).toBe(0);
      await expect(lease.renew()).rejects.toBeInstanceOf(LeaseLostError);
    });

    it('I5/I6: with autoRenew off the ttl is a hard limit; the holder is told before the next grant', async () => {
      const k = key('expire');
      const a = await client();
      const b = await client();
      const lease = await a.acquire(k, { ttlMs: T, autoRenew: false });
      let abortedAt = Infinity;
      lease.signal.addEventListener('abort', () => (abortedAt = performance.now()));
      const next = await b.acquire(k, { ttlMs: 10 * T, waitMs: 20 * T });
      const grantedAt = performance.now();
      expect(next.token).toBeGreaterThan(lease.token);
      expect(lease.signal.aborted).toBe(true);
      expect(abortedAt).toBeLessThanOrEqual(grantedAt);
      const reason = lease.signal.reason as LeaseLostError;
      expect(reason).toBeInstanceOf(LeaseLostError);
      expect(reason.code).toBe('LEASE_LOST');
      expect(reason.reason).toBe('expired');
      expect(lease.held).toBe(false);
      await lease.release(); // after a loss: resolves, does nothing
      expect(next.held).toBe(true);
      expect(await a.tryAcquire(k, { ttlMs: T })).toBeNull();
    });

    it('I8: an expired lease keeps its key for lockDelayMs; a released one does not', async () => {
      const k = key('delay');
      const a = await client();
      const b = await client();
      const delay = 4 * T;
      const lease = await a.acquire(k, { ttlMs: T, autoRenew: false, lockDelayMs: delay });
      const start = performance.now();
      await eventually(() => lease.signal.aborted, 10 * T);
      await sleep(T); // now well past the coordinator's expiry, well inside the delay
      expect(await b.tryAcquire(k, { ttlMs: T })).toBeNull();
      const [state] = await b.inspect(k);
      expect(state?.holders).toEqual([]);
      expect(state?.lockDelayRemainingMs).toBeGreaterThan(0);
      const next = await b.acquire(k, { ttlMs: T, waitMs: 20 * T });
      expect(performance.now() - start).toBeGreaterThanOrEqual(T + delay - 0.1 * T);
      expect(next.token).toBeGreaterThan(lease.token);
      await next.release();

      const k2 = key('delay-released');
      const released = await a.acquire(k2, { ttlMs: T, lockDelayMs: 10 * T });
      await released.release();
      expect(await b.tryAcquire(k2, { ttlMs: T })).not.toBeNull();
    });

    it('a waiter is granted when the holder releases, long before the ttl', async () => {
      const k = key('wake');
      const a = await client();
      const b = await client();
      const held = await a.acquire(k, { ttlMs: 20 * T });
      const waiting = b.acquire(k, { ttlMs: T, waitMs: 10 * T });
      await sleep(T / 4);
      await held.release();
      const lease = await waiting;
      expect(lease.token).toBeGreaterThan(held.token);
    });

    it('AcquireTimeoutError after waitMs names the holder', async () => {
      const k = key('timeout');
      const a = await client({ holderName: 'worker-a' });
      const b = await client();
      await a.acquire(k, { ttlMs: 20 * T });
      const started = performance.now();
      const error = await b.acquire(k, { ttlMs: T, waitMs: T }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(AcquireTimeoutError);
      const e = error as AcquireTimeoutError;
      expect(e.code).toBe('ACQUIRE_TIMEOUT');
      expect(e.key).toBe(k);
      expect(e.holder).toBe('worker-a');
      expect(e.waitedMs).toBeGreaterThanOrEqual(T - 1);
      expect(performance.now() - started).toBeGreaterThanOrEqual(T - 1);
    });

    it('an aborted wait rejects with the signal reason and leaves no waiter behind', async () => {
      const k = key('abort');
      const a = await client();
      const b = await client();
      const held = await a.acquire(k, { ttlMs: 20 * T });
      const controller = new AbortController();
      const waiting = b.acquire(k, { ttlMs: T, waitMs: 20 * T, signal: controller.signal });
      await sleep(T / 2);
      const reason = new Error('caller gave up');
      controller.abort(reason);
      await expect(waiting).rejects.toBe(reason);
      expect(await eventually(async () => (await a.inspect(k))[0]?.waiters === 0, 5 * T)).toBe(true);
      await held.release();
      expect(await (await client()).tryAcquire(k, { ttlMs: T })).not.toBeNull();
      // an already-aborted signal fails fast
      await expect(b.acquire(key('abort2'), { signal: AbortSignal.abort(reason) })).rejects.toBe(reason);
    });

    it('semaphore: with N permits and more contenders, never more than N holders; each permit its own increasing token', async () => {
      const k = key('semaphore');
      const workers = await Promise.all(Array.from({ length: 6 }, () => client()));
      let inside = 0;
      let most = 0;
      const tokens: bigint[] = [];
      let limitSeen: number | undefined;
      await Promise.all(
        workers.map(async (w) => {
          for (let i = 0; i < 3; i++) {
            const lease = await w.acquire(k, { limit: 3, ttlMs: 20 * T, waitMs: 400 * T });
            inside++;
            most = Math.max(most, inside);
            tokens.push(lease.token);
            expect(lease.mode).toBe('shared');
            const [state] = await w.inspect(k);
            limitSeen ??= state?.limit;
            expect(state!.holders.length).toBeLessThanOrEqual(3);
            await sleep(T / 8);
            inside--;
            await lease.release();
          }
        }),
      );
      expect(most).toBeLessThanOrEqual(3);
      expect(most).toBeGreaterThan(1); // permits really are held at once
      expect(limitSeen).toBe(3);
      expect(new Set(tokens).size).toBe(tokens.length); // I2 for permits
      const [first] = await Promise.all([client()]);
      const next = await first!.acquire(k, { limit: 3, ttlMs: T });
      expect(next.token).toBeGreaterThan(tokens.reduce((m, t) => (t > m ? t : m), 0n)); // I1 for permits
    });

    it('semaphore: a request naming another limit, or plain shared against permits, is refused naming both; nothing is written', async () => {
      const k = key('semaphore-limit');
      const [a, b] = [await client(), await client()];
      const permit = await a.acquire(k, { limit: 3, ttlMs: 20 * T });
      const before = (await a.inspect(k))[0]!.lastToken;
      const other = await b.acquire(k, { limit: 5, ttlMs: T, waitMs: 0 }).catch((e: unknown) => e);
      expect(other).toBeInstanceOf(InvalidArgumentError);
      expect((other as Error).message).toMatch(/\b3\b/);
      expect((other as Error).message).toMatch(/\b5\b/);
      const shared = await b.acquire(k, { mode: 'shared', ttlMs: T, waitMs: 0 }).catch((e: unknown) => e);
      expect(shared).toBeInstanceOf(InvalidArgumentError);
      const [after] = await a.inspect(k);
      expect(after!.lastToken).toBe(before);
      expect(after!.holders.map((x) => x.token)).toEqual([permit.token]);
      expect(after!.waiters).toBe(0);
      await permit.release();
    });

    it('semaphore: an exclusive request waits for every permit; a crashed permit holder frees its permit when it expires', async () => {
      const k = key('semaphore-excl');
      const [a, b, c] = [await client(), await client(), await client()];
      const p1 = await a.acquire(k, { limit: 2, ttlMs: 20 * T });
      const p2 = await b.acquire(k, { limit: 2, ttlMs: T, autoRenew: false }); // "crashes": never renewed
      expect(await c.tryAcquire(k, { limit: 2, ttlMs: T })).toBeNull(); // both permits taken
      const third = c.acquire(k, { limit: 2, ttlMs: 20 * T, waitMs: 40 * T });
      const p3 = await third; // p2 expired: its permit is free again
      expect(p2.held).toBe(false);
      expect(p3.token).toBeGreaterThan(p2.token);
      let exclusiveGranted = false;
      const excl = (await client()).acquire(k, { ttlMs: 20 * T, waitMs: 100 * T }).then((l) => ((exclusiveGranted = true), l));
      await p1.release();
      await sleep(T / 2);
      expect(exclusiveGranted).toBe(false); // p3 still holds a permit
      await p3.release();
      const e = await excl;
      expect(e.mode).toBe('exclusive');
      expect(e.token).toBeGreaterThan(p3.token);
      await e.release();
    });

    it('semaphore (fair backends): a released permit goes to the first permit waiter', async (ctx) => {
      const backend = await h.connect();
      const fair = backend.capabilities.fair;
      await backend.close();
      if (!fair) return ctx.skip('the backend does not declare capabilities.fair: permits are granted to whoever asks next');
      const k = key('semaphore-fifo');
      const c0 = await client();
      const held = [await c0.acquire(k, { limit: 2, ttlMs: 20 * T }), await c0.acquire(k, { limit: 2, ttlMs: 20 * T })];
      const order: number[] = [];
      const waiters: Promise<Lease>[] = [];
      for (let i = 0; i < 3; i++) {
        const c = await client();
        waiters.push(c.acquire(k, { limit: 2, ttlMs: 20 * T, waitMs: 100 * T }).then((l) => (order.push(i), l)));
        await eventually(async () => (await c0.inspect(k))[0]?.waiters === i + 1, 10 * T);
      }
      await held[0]!.release();
      const first = await waiters[0]!;
      expect(await (await client()).tryAcquire(k, { limit: 2, ttlMs: T })).toBeNull(); // no barging past the queue
      await held[1]!.release();
      const second = await waiters[1]!;
      await first.release();
      const third = await waiters[2]!;
      expect(order).toEqual([0, 1, 2]);
      await Promise.all([second, third].map((l) => l.release()));
    });

    it('mutual exclusion under contention: no overlap, tokens increase in grant order', async () => {
      const k = key('contend');
      const workers = await Promise.all([client(), client(), client(), client()]);
      let inside = 0;
      let overlaps = 0;
      const tokens: bigint[] = [];
      await Promise.all(
        workers.map(async (w) => {
          for (let i = 0; i < 8; i++) {
            await w.withLock(k, { ttlMs: 20 * T, waitMs: 200 * T }, async (lease) => {
              if (++inside > 1) overlaps++;
              tokens.push(lease.token);
              await sleep(2);
              inside--;
            });
          }
        }),
      );
      expect(overlaps).toBe(0);
      expect(tokens).toHaveLength(32);
      for (let i = 1; i < tokens.length; i++) expect(tokens[i]!).toBeGreaterThan(tokens[i - 1]!);
    });

    it('keys of any shape round-trip through grants, sequencers and inspect', async () => {
      const c = await client();
      const shapes = ['a:b/c', 'ключ', '🔒 lock', 'a b\tc', '{tag}x', "it's", 'quote"d', 'back\\slash', '100%_*?[', 'x'.repeat(1024 - h.prefix.length - 1)];
      for (const shape of shapes) {
        const k = `${h.prefix}:${shape}`.slice(0, 1024);
        const lease = await c.acquire(k, { ttlMs: 10 * T });
        expect(lease.key).toBe(k);
        expect(parseSequencer(lease.sequencer)).toMatchObject({ key: k, token: lease.token, mode: 'exclusive' });
        const states = await c.inspect(k);
        expect(states.map((s) => s.key)).toContain(k);
        await lease.release();
      }
    });

    it('inspect lists holders, tokens and waiters under a prefix only', async () => {
      const base = key('inspect');
      const a = await client({ holderName: 'inspector-a' });
      const b = await client();
      const l1 = await a.acquire(`${base}/one`, { ttlMs: 10 * T });
      const l2 = await a.acquire(`${base}/two`, { ttlMs: 10 * T, mode: 'shared' });
      await a.acquire(`${base}-other`, { ttlMs: 10 * T });
      const waiting = b.acquire(`${base}/one`, { ttlMs: T, waitMs: 20 * T });
      await eventually(async () => (await a.inspect(`${base}/one`))[0]?.waiters === 1, 5 * T);
      const states = await a.inspect(`${base}/`);
      expect(states.map((s) => s.key).sort()).toEqual([`${base}/one`, `${base}/two`]);
      const one = states.find((s) => s.key.endsWith('/one'))!;
      expect(one.holders).toHaveLength(1);
      expect(one.holders[0]).toMatchObject({ mode: 'exclusive', token: l1.token, holder: 'inspector-a' });
      expect(one.holders[0]!.expiresInMs).toBeGreaterThan(0);
      expect(one.holders[0]!.expiresInMs).toBeLessThanOrEqual(10 * T + 50);
      expect(one.lastToken).toBe(l1.token);
      expect(one.waiters).toBe(1);
      expect(states.find((s) => s.key.endsWith('/two'))!.holders[0]).toMatchObject({ mode: 'shared', token: l2.token });
      await l1.release();
      await waiting;
    });

    it('I1 across client restarts', async () => {
      const k = key('restart');
      const first = await client();
      const t1 = (await first.acquire(k, { ttlMs: 10 * T })).token;
      await first.close(); // releases
      const second = await client();
      const t2 = (await second.acquire(k, { ttlMs: 10 * T })).token;
      expect(t2).toBeGreaterThan(t1);
      await second.close();
    });

    it('I1 across a coordinator restart (harnesses with restart())', async (ctx) => {
      if (!h.restart) return ctx.skip('the harness cannot restart its coordinator (no restart())');
      const k = key('restart-coordinator');
      const before = await client();
      const t1 = (await before.acquire(k, { ttlMs: 10 * T })).token;
      await before.close(); // releases
      await h.restart();
      const after = await client();
      const t2 = (await after.acquire(k, { ttlMs: 10 * T, waitMs: 50 * T })).token;
      expect(t2).toBeGreaterThan(t1);
    });

    it('close releases what the client holds', async () => {
      const k = key('close');
      const a = await client();
      await a.acquire(k, { ttlMs: 20 * T });
      await a.close();
      expect(await (await client()).tryAcquire(k, { ttlMs: T })).not.toBeNull();
      await expect(a.acquire(k)).rejects.toBeInstanceOf(ClosedError);
      await expect(a.inspect(k)).rejects.toMatchObject({ code: 'CLOSED' });
    });

    it('withLock: returns the result, releases, and turns a loss during fn into LeaseLostError', async () => {
      const k = key('withlock');
      const a = await client();
      expect(await a.withLock(k, { ttlMs: 10 * T }, async (lease) => lease.token > 0n)).toBe(true);
      expect(await a.tryAcquire(k, { ttlMs: T })).not.toBeNull();

      const k2 = key('withlock-lost');
      const own = new Error('fn failed after the loss');
      const error = await a
        .withLock(k2, { ttlMs: T, autoRenew: false }, async (lease) => {
          await new Promise((r) => lease.signal.addEventListener('abort', r));
          throw own;
        })
        .catch((e: unknown) => e);
      expect(error).toBeInstanceOf(LeaseLostError);
      expect((error as LeaseLostError).cause).toBe(own);
    });

    it('the fair queue (backends declaring capabilities.fair): waiters are served in arrival order and a newcomer cannot barge', async (ctx) => {
      const backend = await h.connect();
      const fair = backend.capabilities.fair;
      await backend.close();
      if (!fair) return ctx.skip('the backend does not declare capabilities.fair: it promises no arrival order');
      const c0 = await client();
      const k = key('fair');
      const holder = await c0.acquire(k, { ttlMs: 20 * T });
      const order: number[] = [];
      const waiters: Promise<Lease>[] = [];
      for (let i = 0; i < 4; i++) {
        const c = await client();
        waiters.push(
          c.acquire(k, { ttlMs: 20 * T, waitMs: 100 * T }).then((lease) => {
            order.push(i);
            return lease;
          }),
        );
        await eventually(async () => (await c0.inspect(k))[0]?.waiters === i + 1, 10 * T);
      }
      await holder.release();
      for (let i = 0; i < 4; i++) {
        const lease = await waiters[i]!;
        // a newcomer that never queued cannot take the key while others wait
        if (i < 3) expect(await (await client()).tryAcquire(k, { ttlMs: T })).toBeNull();
        await lease.release();
      }
      expect(order).toEqual([0, 1, 2, 3]);
    });

    it('keepable places (backends declaring capabilities.keepablePlaces): a place whose owner stops asking is granted to nobody and kept for its next ask', async (ctx) => {
      const backend = await h.connect();
      try {
        if (!backend.capabilities.keepablePlaces) return ctx.skip('the backend does not declare capabilities.keepablePlaces: a place may be granted by itself');
        const k = key('keep-place');
        const ask = (owner: string, queue: boolean) =>
          backend.acquire({ key: k, owner, mode: 'exclusive', ttlMs: 20 * T, lockDelayMs: 0, holder: owner, queue, queueTtlMs: 30 * T });
        const first = expectGranted(await ask('holder', false));
        expect((await ask('first-waiter', true)).granted).toBe(false);
        expect((await ask('second-waiter', true)).granted).toBe(false);
        await backend.release({ key: k, owner: 'holder', token: first.token, mode: 'exclusive' });
        await sleep(T); // a coordinator that handed the key to the head place would have done it by now
        expect((await backend.inspect(k))[0]?.holders ?? []).toEqual([]);
        expect((await ask('second-waiter', true)).granted).toBe(false); // the first place is still ahead
        const next = expectGranted(await ask('first-waiter', true)); // its owner asks again: it goes
        expect(next.token).toBeGreaterThan(first.token);
        await backend.release({ key: k, owner: 'first-waiter', token: next.token, mode: 'exclusive' });
        const last = expectGranted(await ask('second-waiter', true));
        await backend.release({ key: k, owner: 'second-waiter', token: last.token, mode: 'exclusive' });
      } finally {
        await backend.close();
      }
    });

    it("sessions (backends with sessions): one keep-alive per interval renews all of a client's leases; losing it aborts all", async (ctx) => {
      const probe = counting(await h.connect());
      const sessions = probe.backend.sessions;
      if (!sessions) {
        await probe.backend.close();
        return ctx.skip('the backend has no sessions: it renews each lease, which the renewal tests above cover');
      }
      const c = await client({}, probe.backend);
      const base = key('session');
      const leases = await Promise.all(Array.from({ length: 50 }, (_, i) => c.acquire(`${base}/${i}`, { ttlMs: T })));
      const before = probe.counts['sessions.keepAlive'] ?? 0;
      await sleep(2 * T);
      const keepAlives = (probe.counts['sessions.keepAlive'] ?? 0) - before;
      expect(keepAlives).toBeGreaterThanOrEqual(2);
      expect(keepAlives).toBeLessThanOrEqual(12); // ~6 intervals of ttl/3 (plus retries), not 50 × 6
      expect(probe.counts.renew ?? 0).toBe(0);
      expect(leases.every((l) => l.held)).toBe(true);
      // an operator (or a partition) ends the session behind the client's back
      await sessions.close(probe.sessionIds[0]!);
      expect(await eventually(() => leases.every((l) => l.signal.aborted), 5 * T)).toBe(true);
      for (const l of leases) expect((l.signal.reason as LeaseLostError).reason).toBe('session-lost');
      expect(await (await client()).tryAcquire(`${base}/7`, { ttlMs: T })).not.toBeNull();
      // the client recovers: the next acquire opens a new session
      const again = await c.acquire(`${base}/again`, { ttlMs: T });
      await sleep(T);
      expect(again.held).toBe(true);
    });

    it('bad input is refused at the boundary with InvalidArgumentError', async () => {
      const c = await client();
      await expect(c.acquire('')).rejects.toBeInstanceOf(InvalidArgumentError);
      await expect(c.acquire(key('bad'), { ttlMs: -1 })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'options.ttlMs' });
      await expect(c.acquire(key('bad'), { mode: 'write' as never })).rejects.toMatchObject({ argument: 'options.mode' });
      expect(await c.inspect(key('bad'))).toEqual([]);
    });
  });
}

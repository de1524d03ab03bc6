/**
 * Waiting without polling, FIFO hand-off and its cost, against a redis-server of our own (so the
 * server's command counters are ours alone).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { createClient } from 'redis';
import type { AcquireRequest, Backend, HandOff } from '../../src/core/backend.js';
import { Locks } from '../../src/core/locks.js';
import type { Lease } from '../../src/core/lease.js';
import { redisBackend } from '../../src/redis/index.js';
import { eventually, sleep } from '../helpers/env.js';
import { commandStats, delta, scriptCalls, startRedis, stopAll, type RedisServer } from './servers.js';

let server: RedisServer;
let admin: Redis;
const opened: (Locks | Backend)[] = [];
const locks = (): Locks => {
  const l = new Locks({ backend: redisBackend({ url: server.url }) });
  opened.push(l);
  return l;
};
const backend = (): Backend => {
  const b = redisBackend({ url: server.url });
  opened.push(b);
  return b;
};
const req = (key: string, owner: string, extra: Partial<AcquireRequest> = {}): AcquireRequest => ({
  key,
  owner,
  mode: 'exclusive',
  ttlMs: 10_000,
  lockDelayMs: 0,
  holder: owner,
  queue: true,
  queueTtlMs: 5_000,
  ...extra,
});

beforeAll(async () => {
  server = await startRedis();
  admin = new Redis(server.url);
});
afterAll(async () => {
  await Promise.allSettled(opened.map((x) => x.close()));
  admin?.disconnect();
  await stopAll();
});

describe('redis waiting', () => {
  it('a contended critical section costs 2 commands: busy (enqueued), then the release that hands the key on', async () => {
    const workers = [locks(), locks(), locks(), locks()];
    // warm up: sessions opened, scripts loaded, wake channels subscribed
    await Promise.all(workers.map((w, i) => w.withLock(`warm/${i}`, { ttlMs: 10_000 }, () => {})));
    await Promise.all(workers.map((w) => w.withLock('warm', { ttlMs: 10_000, waitMs: 10_000 }, () => sleep(1))));
    const before = await commandStats(admin);
    let sections = 0;
    let inside = 0;
    let overlaps = 0;
    await Promise.all(
      workers.map(async (w) => {
        for (let i = 0; i < 15; i++) {
          await w.withLock('hot', { ttlMs: 10_000, waitMs: 30_000 }, async () => {
            if (++inside > 1) overlaps++;
            sections++;
            await sleep(2);
            inside--;
          });
        }
      }),
    );
    const d = delta(before, await commandStats(admin));
    const commands = scriptCalls(d); // every client command is one function or script call
    expect(overlaps).toBe(0);
    expect(sections).toBe(60);
    expect(commands / sections).toBeGreaterThanOrEqual(1.9); // the first section of each worker may need no wait
    expect(commands / sections).toBeLessThanOrEqual(2.2); // a stray fallback re-check is allowed, polling is not
    expect(d.publish ?? 0).toBeLessThanOrEqual(sections); // one message per hand-off: no herd
  });

  it('only the head waiter is woken by a release (no herd), then the next on the next release', async () => {
    const holder = backend();
    const waiters = [backend(), backend(), backend()];
    const key = 'herd';
    const g = await holder.acquire(req(key, 'holder'));
    if (!g.granted) throw new Error('not granted');
    const woken: number[] = [];
    for (let i = 0; i < waiters.length; i++) {
      const busy = await waiters[i]!.acquire(req(key, `w${i}`));
      expect(busy.granted).toBe(false);
      if (busy.granted) return;
      expect(busy.cursor).toBeDefined();
      await waiters[i]!.subscribe!(key, () => woken.push(i), busy.cursor);
    }
    await holder.release({ key, owner: 'holder', token: g.token, mode: 'exclusive' });
    expect(await eventually(() => woken.length > 0, 5_000)).toBe(true);
    await sleep(100);
    expect(woken).toEqual([0]);
    // the head takes it; a newcomer cannot barge past w1 and w2
    const g0 = await waiters[0]!.acquire(req(key, 'w0'));
    expect(g0.granted).toBe(true);
    expect((await holder.acquire(req(key, 'newcomer', { queue: false }))).granted).toBe(false);
    if (!g0.granted) return;
    await waiters[0]!.release({ key, owner: 'w0', token: g0.token, mode: 'exclusive' });
    expect(await eventually(() => woken.length > 1, 5_000)).toBe(true);
    await sleep(100);
    expect(woken).toEqual([0, 1]);
  });

  it('a release hands the key to the head waiter bound to a session: the wake-up carries the grant, held with no further command', async () => {
    const holder = backend();
    const waiter = backend();
    const key = 'handoff';
    const g = await holder.acquire(req(key, 'h'));
    if (!g.granted) throw new Error('not granted');
    const { id: session } = await waiter.sessions!.open(10_000);
    const busy = await waiter.acquire(req(key, 'w', { session, holder: 'waiter|label' }));
    if (busy.granted) throw new Error('granted');
    const handed: (HandOff | undefined)[] = [];
    await waiter.subscribe!(key, (h) => handed.push(h), busy.cursor);
    const before = await commandStats(admin);
    await holder.release({ key, owner: 'h', token: g.token, mode: 'exclusive' });
    expect(await eventually(() => handed.length > 0, 5_000)).toBe(true);
    const d = delta(before, await commandStats(admin));
    expect(scriptCalls(d)).toBe(1); // the release alone: the waiter did not ask
    const h = handed[0]!;
    expect(h).toBeDefined();
    expect(h.session).toBe(session);
    expect(h.token).toBeGreaterThan(g.token);
    // the coordinator records the waiter as the holder, bound to its session, under its label
    const [state] = await holder.inspect(key);
    expect(state!.holders.map((x) => [x.token, x.holder])).toEqual([[h.token, 'waiter|label']]);
    expect(state!.waiters).toBe(0);
    expect((await holder.acquire(req('handoff', 'newcomer', { queue: false }))).granted).toBe(false);
    // had the message been lost, asking again gets the same grant back
    const again = await waiter.acquire(req(key, 'w', { session }));
    expect(again).toMatchObject({ granted: true, token: h.token });
    // it lives with the session: ending the session frees the key
    await waiter.sessions!.close(session);
    const next = await holder.acquire(req(key, 'next', { queue: false }));
    expect(next.granted && next.token > h.token).toBe(true);
  });

  it('a hand-off the waiter did not take is given back by cancelWait, and goes on to the next waiter', async () => {
    const holder = backend();
    const [w1, w2] = [backend(), backend()];
    const key = 'handoff-cancel';
    const g = await holder.acquire(req(key, 'h'));
    if (!g.granted) throw new Error('not granted');
    const handed: [number, HandOff | undefined][] = [];
    for (const [i, w] of [w1, w2].entries()) {
      const { id: session } = await w.sessions!.open(10_000);
      const busy = await w.acquire(req(key, `w${i}`, { session }));
      if (busy.granted) throw new Error('granted');
      await w.subscribe!(key, (h) => handed.push([i, h]), busy.cursor);
    }
    await holder.release({ key, owner: 'h', token: g.token, mode: 'exclusive' });
    expect(await eventually(() => handed.length === 1, 5_000)).toBe(true);
    expect(handed[0]![0]).toBe(0);
    // w0 gave up before it took the grant (its wait timed out, say)
    await w1.cancelWait!({ key, owner: 'w0' });
    expect(await eventually(() => handed.length === 2, 5_000)).toBe(true);
    const [i, h] = handed[1]!;
    expect(i).toBe(1);
    expect(h!.token).toBeGreaterThan(handed[0]![1]!.token);
    const [state] = await holder.inspect(key);
    expect(state!.holders.map((x) => x.token)).toEqual([h!.token]);
    expect(state!.waiters).toBe(0);
  });

  it('a hand-off to a waiter whose session has ended is not made: the waiter is only told to ask', async () => {
    const holder = backend();
    const waiter = backend();
    const key = 'handoff-dead-session';
    const g = await holder.acquire(req(key, 'h'));
    if (!g.granted) throw new Error('not granted');
    const { id: session } = await waiter.sessions!.open(10_000);
    const busy = await waiter.acquire(req(key, 'w', { session }));
    if (busy.granted) throw new Error('granted');
    const handed: (HandOff | undefined)[] = [];
    await waiter.subscribe!(key, (h) => handed.push(h), busy.cursor);
    await waiter.sessions!.close(session);
    await holder.release({ key, owner: 'h', token: g.token, mode: 'exclusive' });
    expect(await eventually(() => handed.length > 0, 5_000)).toBe(true);
    expect(handed).toEqual([undefined]);
    const [state] = await holder.inspect(key);
    expect(state?.holders ?? []).toEqual([]);
    expect(state?.waiters).toBe(1); // it keeps its place and asks with a new session
  });

  it('through Locks, a woken waiter takes the handed grant (at most a stray fallback poll besides)', async () => {
    const a = locks();
    const inner = redisBackend({ url: server.url });
    let calls = 0;
    const counted: Backend = { ...inner, capabilities: inner.capabilities, sessions: inner.sessions, acquire: (r) => (calls++, inner.acquire(r)) };
    const b = new Locks({ backend: counted });
    opened.push(b);
    const held = await a.acquire('handoff-locks', { ttlMs: 10_000 });
    const waiting = b.acquire('handoff-locks', { ttlMs: 10_000, waitMs: 20_000 });
    await eventually(async () => (await a.inspect('handoff-locks'))[0]?.waiters === 1, 5_000, 5);
    const asked = calls;
    await held.release();
    const lease = await waiting;
    expect(lease.token).toBeGreaterThan(held.token);
    // the fallback poll (every 500 ms) could add one ask on a slow machine, never a second round
    expect(calls - asked).toBeLessThanOrEqual(1);
    expect((await a.inspect('handoff-locks'))[0]!.holders.map((x) => x.token)).toEqual([lease.token]);
    await lease.release();
  });

  it('a wake-up that arrives before the waiter subscribed is not lost', async () => {
    const holder = backend();
    const waiter = backend();
    const g = await holder.acquire(req('early', 'h'));
    if (!g.granted) throw new Error('not granted');
    const busy = await waiter.acquire(req('early', 'w'));
    if (busy.granted) throw new Error('granted');
    await holder.release({ key: 'early', owner: 'h', token: g.token, mode: 'exclusive' });
    await sleep(50); // the message is delivered before anyone listens
    let fired = false;
    await waiter.subscribe!('early', () => (fired = true), busy.cursor);
    expect(await eventually(() => fired, 1_000)).toBe(true);
  });

  it('a releaser that asks again at once queues behind the waiters (no barging)', async () => {
    const a = locks();
    const b = locks();
    const first = await a.acquire('barge', { ttlMs: 10_000 });
    const waiting = b.acquire('barge', { ttlMs: 10_000, waitMs: 10_000 });
    await eventually(async () => (await a.inspect('barge'))[0]?.waiters === 1, 5_000);
    await first.release();
    const again = a.acquire('barge', { ttlMs: 10_000, waitMs: 10_000 });
    const bLease = await waiting;
    expect(bLease.token).toBeGreaterThan(first.token);
    await sleep(20);
    await bLease.release();
    expect((await again).token).toBeGreaterThan(bLease.token);
  });

  it('shared waiters at the head are handed the key together; the exclusive one behind them waits', async () => {
    const owner = locks();
    const excl = await owner.acquire('mixed', { ttlMs: 10_000 });
    const granted: string[] = [];
    const leases: Promise<Lease>[] = [];
    for (const [name, mode] of [
      ['s1', 'shared'],
      ['s2', 'shared'],
      ['e3', 'exclusive'],
    ] as const) {
      const c = locks();
      leases.push(c.acquire('mixed', { ttlMs: 10_000, waitMs: 20_000, mode }).then((l) => (granted.push(name), l)));
      await eventually(async () => (await owner.inspect('mixed'))[0]?.waiters === leases.length, 5_000);
    }
    await excl.release();
    expect(await eventually(() => granted.length >= 2, 5_000)).toBe(true);
    await sleep(100);
    expect(granted.sort()).toEqual(['s1', 's2']);
    for (const l of await Promise.all(leases.slice(0, 2))) await l.release();
    await (await leases[2]!).release();
    expect(granted).toContain('e3');
  });

  it('storage layout: an aborted waiter leaves no trace in Redis (its queue keys are read)', async () => {
    const a = locks();
    const b = locks();
    const held = await a.acquire('gone', { ttlMs: 10_000 });
    const controller = new AbortController();
    const waiting = b.acquire('gone', { ttlMs: 1_000, waitMs: 20_000, signal: controller.signal });
    await eventually(async () => (await admin.zcard('leasehold:{gone}:q')) === 1, 5_000);
    controller.abort(new Error('no longer needed'));
    await expect(waiting).rejects.toThrow('no longer needed');
    expect(await eventually(async () => (await admin.zcard('leasehold:{gone}:q')) === 0, 5_000)).toBe(true);
    expect(await admin.exists('leasehold:{gone}:w')).toBe(0); // its waiter record
    expect(await admin.hget('leasehold:{gone}', 's')).toBe('1'); // the lock's state hint: one holder, nobody waits
    await held.release();
    // nothing left but the token counter and the queue sequence (kept retainMs for the next grant)
    expect((await admin.hkeys('leasehold:{gone}')).sort()).toEqual(['qs', 't']);
  });

  it('a waiter that crashed cannot block the key: its place expires', async () => {
    const a = locks();
    const crashed = backend();
    const held = await a.acquire('crashy', { ttlMs: 10_000 });
    expect((await crashed.acquire(req('crashy', 'ghost', { queueTtlMs: 300 }))).granted).toBe(false);
    await crashed.close(); // never asks again
    await held.release();
    const next = await locks().acquire('crashy', { ttlMs: 1_000, waitMs: 5_000 });
    expect(next.token).toBeGreaterThan(held.token);
  });

  it('fair: false waiters poll with backoff and still get the key', async () => {
    const a = locks();
    const held = await a.acquire('unfair', { ttlMs: 10_000 });
    const waiting = locks().acquire('unfair', { ttlMs: 1_000, waitMs: 5_000, fair: false });
    await sleep(50);
    await held.release();
    expect((await waiting).token).toBeGreaterThan(held.token);
  });

  for (const driver of ['ioredis', 'node-redis'] as const) {
    it(`${driver}: a lost wake-up (the subscriber connection killed while a waiter waits) is made up for by the fallback poll; the subscriber comes back`, async () => {
      const own = await startRedis();
      const ownAdmin = new Redis(own.url);
      // The waiter's client logs in as a user of its own, so its resubscription can be refused: the wake-up is surely lost.
      await ownAdmin.call('ACL', 'SETUSER', 'waiter', 'on', '>waiter-pw', '~*', '&*', '+@all');
      const holder = new Locks({ backend: redisBackend({ url: own.url }) });
      const waiterUrl = own.url.replace('redis://', 'redis://waiter:waiter-pw@'); // node-redis sends AUTH only with a password
      const nodeClient = driver === 'node-redis' ? createClient({ url: waiterUrl }) : undefined;
      nodeClient?.on('error', () => {});
      await nodeClient?.connect();
      const waiter = new Locks({ backend: nodeClient ? redisBackend({ client: nodeClient }) : redisBackend({ url: waiterUrl }) });
      try {
        const held = await holder.acquire('lost-wake', { ttlMs: 60_000 });
        const waiting = waiter.acquire('lost-wake', { ttlMs: 10_000, waitMs: 60_000 });
        // Subscribers of the waiter's wake-up channel (the holder never waits: it has none). Counted
        // per channel: a RESP3 subscriber (node-redis 5+) is not of CLIENT TYPE pubsub.
        const subscribers = async (): Promise<number> => {
          const channels = (await ownAdmin.call('PUBSUB', 'CHANNELS', 'leasehold:wake:*')) as string[];
          if (channels.length === 0) return 0;
          const counts = (await ownAdmin.call('PUBSUB', 'NUMSUB', ...channels)) as (string | number)[];
          return counts.filter((_, i) => i % 2 === 1).reduce<number>((a, c) => a + Number(c), 0);
        };
        expect(await eventually(async () => (await subscribers()) === 1, 5_000, 20)).toBe(true);
        await ownAdmin.call('ACL', 'SETUSER', 'waiter', 'resetchannels'); // no SUBSCRIBE any more (and Redis 7 disconnects its subscriber)
        await ownAdmin.call('CLIENT', 'KILL', 'TYPE', 'pubsub');
        expect(await eventually(async () => (await subscribers()) === 0, 5_000, 20)).toBe(true);
        const releasedAt = performance.now();
        await held.release(); // its PUBLISH reaches nobody
        const lease = await waiting;
        // Granted by the waiter asking again (every 500 ms while subscribed), long before the holder's
        // 60 s ttl or the waiter's 60 s waitMs; the bound is generous for a noisy machine.
        expect(performance.now() - releasedAt).toBeLessThan(10_000);
        expect(lease.token).toBeGreaterThan(held.token);
        expect(await subscribers()).toBe(0); // still no subscriber: no notification did it
        await lease.release();
        // Allowed again: after its next reconnection the subscriber is back on its channel (resubscribed by us, the refusal above never unhandled).
        await ownAdmin.call('ACL', 'SETUSER', 'waiter', 'allchannels');
        await ownAdmin.call('CLIENT', 'KILL', 'USER', 'waiter');
        expect(await eventually(async () => (await subscribers()) === 1, 10_000, 50)).toBe(true);
      } finally {
        await holder.close();
        await waiter.close();
        await nodeClient?.close().catch(() => {});
        ownAdmin.disconnect();
        await own.kill();
      }
    });
  }
});

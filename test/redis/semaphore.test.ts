/**
 * Semaphore permits (`limit`) on the redis and Redlock backends, and `watch` on redis, against
 * redis-servers of our own (so the server's command counters are ours alone).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { createClient } from 'redis';
import type { AcquireRequest, Backend, HandOff } from '../../src/core/backend.js';
import { BackendUnavailableError, InvalidArgumentError } from '../../src/core/errors.js';
import type { Lease } from '../../src/core/lease.js';
import { Locks } from '../../src/core/locks.js';
import { redisBackend, redlockBackend } from '../../src/redis/index.js';
import { eventually, sleep } from '../helpers/env.js';
import { commandStats, delta, type RedisServer, scriptCalls, startRedis, stopAll } from './servers.js';

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
const permit = (key: string, owner: string, limit: number | undefined, extra: Partial<AcquireRequest> = {}): AcquireRequest => ({
  key,
  owner,
  mode: 'shared',
  ...(limit !== undefined && { limit }),
  ttlMs: 10_000,
  lockDelayMs: 0,
  holder: owner,
  queue: false,
  queueTtlMs: 5_000,
  ...extra,
});
const granted = async (b: Backend, r: AcquireRequest): Promise<bigint> => {
  const g = await b.acquire(r);
  if (!g.granted) throw new Error(`${r.owner} not granted`);
  return g.token;
};

beforeAll(async () => {
  server = await startRedis();
  admin = new Redis(server.url);
});
afterAll(async () => {
  await Promise.allSettled(opened.map((x) => x.close()));
  admin?.disconnect();
  await stopAll();
});

/** The semaphore rules every Redis-based backend keeps; `make` opens one client of the backend under test. */
function coreRules(name: string, make: () => Locks) {
  describe(`${name}: semaphore`, () => {
    it('8 contenders for 3 permits: never more than 3 valid holders; each permit its own increasing token', async () => {
      const key = `sem-${name}`;
      const workers = Array.from({ length: 8 }, make);
      const held = new Set<Lease>();
      let most = 0;
      const tokens: bigint[] = [];
      const deadline = performance.now() + 1_500;
      await Promise.all(
        workers.map(async (w) => {
          while (performance.now() < deadline) {
            const lease = await w.acquire(key, { limit: 3, ttlMs: 5_000, waitMs: 10_000 });
            tokens.push(lease.token);
            held.add(lease);
            // counted by validity, not by who is inside the loop: a lease counts while it is held
            most = Math.max(most, [...held].filter((l) => l.held).length);
            await sleep(3);
            held.delete(lease);
            await lease.release();
          }
        }),
      );
      expect(most).toBeLessThanOrEqual(3);
      expect(most).toBeGreaterThan(1); // permits really are held at once
      expect(new Set(tokens).size).toBe(tokens.length); // I2
      const last = await make().acquire(key, { limit: 3, ttlMs: 1_000 });
      expect(last.token).toBeGreaterThan(tokens.reduce((m, t) => (t > m ? t : m), 0n)); // I1
      const [state] = await make().inspect(key);
      expect(state!.limit).toBe(3);
      expect(state!.holders.map((h) => [h.mode, h.token])).toEqual([['shared', last.token]]);
      await last.release();
    });

    it('a request naming another limit, and plain shared against permits, are refused naming both', async () => {
      const key = `sem-limit-${name}`;
      const [a, b] = [make(), make()];
      const p = await a.acquire(key, { limit: 3, ttlMs: 5_000 });
      const before = (await a.inspect(key))[0]!;
      const other = await b.acquire(key, { limit: 5, ttlMs: 1_000, waitMs: 500 }).catch((e: unknown) => e);
      expect(other).toBeInstanceOf(InvalidArgumentError);
      expect((other as Error).message).toContain('a semaphore of 3 permits');
      expect((other as Error).message).toContain('asks for 5');
      const shared = await b.acquire(key, { mode: 'shared', ttlMs: 1_000, waitMs: 500 }).catch((e: unknown) => e);
      expect(shared).toBeInstanceOf(InvalidArgumentError);
      expect((shared as Error).message).toContain('without a limit');
      const after = (await a.inspect(key))[0]!;
      expect(after.lastToken).toBe(before.lastToken); // no token raised
      expect(after.waiters).toBe(0);
      await p.release();
      // the other way round: a key held by plain shared holders refuses a permit
      const s = await a.acquire(key, { mode: 'shared', ttlMs: 5_000 });
      const refused = await b.acquire(key, { limit: 2, ttlMs: 1_000, waitMs: 500 }).catch((e: unknown) => e);
      expect(refused).toBeInstanceOf(InvalidArgumentError);
      expect((refused as Error).message).toContain('held by shared holders without a limit');
      expect((refused as Error).message).toContain('asks for 2');
      await s.release();
      // free again, any limit goes
      const q = await b.acquire(key, { limit: 5, ttlMs: 1_000 });
      await q.release();
    });

    it('an exclusive request waits for every permit', async () => {
      const key = `sem-excl-${name}`;
      const [a, b, c] = [make(), make(), make()];
      const p1 = await a.acquire(key, { limit: 2, ttlMs: 5_000 });
      const p2 = await b.acquire(key, { limit: 2, ttlMs: 5_000 });
      let got: Lease | undefined;
      const excl = c.acquire(key, { ttlMs: 5_000, waitMs: 10_000 }).then((l) => (got = l));
      await p1.release();
      await sleep(300);
      expect(got).toBeUndefined();
      await p2.release();
      const e = await excl;
      expect(e.mode).toBe('exclusive');
      expect(e.token).toBeGreaterThan(p2.token);
      await e.release();
    });

    it('a crashed permit holder (never renewed, never released) frees its permit when its ttl runs out', async () => {
      const key = `sem-crash-${name}`;
      const [a, b, c] = [make(), make(), make()];
      const kept = await a.acquire(key, { limit: 2, ttlMs: 5_000 });
      const crashed = await b.acquire(key, { limit: 2, ttlMs: 300, autoRenew: false });
      expect(await c.tryAcquire(key, { limit: 2, ttlMs: 1_000 })).toBeNull();
      const t0 = performance.now();
      const next = await c.acquire(key, { limit: 2, ttlMs: 1_000, waitMs: 5_000 });
      expect(performance.now() - t0).toBeGreaterThan(150);
      expect(crashed.held).toBe(false);
      expect(next.token).toBeGreaterThan(crashed.token);
      await Promise.all([kept.release(), next.release()]);
    });
  });
}

coreRules('redis', () => locks());

describe('redis: semaphore', () => {
  it('the permit records its limit with the holder; old records without one read as plain', async () => {
    const b = backend();
    const t = await granted(b, permit('sem-record', 'p1', 4));
    expect(await admin.hget('leasehold:{sem-record}', 'h:p1')).toMatch(new RegExp(`^s4\\|${t}\\|`));
    await b.release({ key: 'sem-record', owner: 'p1', token: t, mode: 'shared' });
    // a plain shared holder's record has no limit: a permit request on it is refused
    const s = await granted(b, permit('sem-record', 's1', undefined));
    expect(await admin.hget('leasehold:{sem-record}', 'h:s1')).toMatch(new RegExp(`^s\\|${s}\\|`));
    await expect(b.acquire(permit('sem-record', 'p2', 4))).rejects.toBeInstanceOf(InvalidArgumentError);
    await b.release({ key: 'sem-record', owner: 's1', token: s, mode: 'shared' });
  });

  it('a refused request writes nothing: no token, no queue place, and a place it had is given up', async () => {
    const b = backend();
    const key = 'sem-nothing';
    // behind an exclusive holder, permits of 3 wait and one of 5 waits too (nobody holds a limit yet)
    const x = await granted(b, { ...permit(key, 'x', undefined), mode: 'exclusive' });
    expect((await b.acquire(permit(key, 'w3', 3, { queue: true }))).granted).toBe(false);
    expect((await b.acquire(permit(key, 'w5', 5, { queue: true }))).granted).toBe(false);
    expect((await b.inspect(key))[0]!.waiters).toBe(2);
    await b.release({ key, owner: 'x', token: x, mode: 'exclusive' });
    // w3 had no channel (it polls): it asks, and gets its permit
    const t3 = await granted(b, permit(key, 'w3', 3, { queue: true }));
    const before = await admin.hgetall(`leasehold:{${key}}`);
    // w5 asks again: refused, its place is gone, the counter is where it was
    await expect(b.acquire(permit(key, 'w5', 5, { queue: true }))).rejects.toThrow(/semaphore of 3 permits; this request asks for 5/);
    const [state] = await b.inspect(key);
    expect(state!.waiters).toBe(0);
    expect(state!.lastToken).toBe(t3);
    expect(await admin.hget(`leasehold:{${key}}`, 't')).toBe(before.t);
    expect(await admin.zcard(`leasehold:{${key}}:q`)).toBe(0);
    await b.release({ key, owner: 'w3', token: t3, mode: 'shared' });
  });

  it('FIFO: a released permit goes to the head permit waiter, in the release call (session-bound waiters)', async () => {
    // a server of its own (its commands are counted): the other tests' clients renew in the background
    const own = await startRedis();
    const ownAdmin = new Redis(own.url);
    const on = (): Backend => {
      const b = redisBackend({ url: own.url });
      opened.push(b);
      return b;
    };
    const holder = on();
    const key = 'sem-fifo';
    const tokens = [await granted(holder, permit(key, 'h0', 2)), await granted(holder, permit(key, 'h1', 2))];
    const handed: [number, HandOff | undefined][] = [];
    const waiters: Backend[] = [];
    for (let i = 0; i < 3; i++) {
      const w = on();
      waiters.push(w);
      const { id: session } = await w.sessions!.open(10_000);
      const busy = await w.acquire(permit(key, `w${i}`, 2, { queue: true, session }));
      if (busy.granted) throw new Error('granted');
      await w.subscribe!(key, (h) => handed.push([i, h]), busy.cursor);
    }
    // a newcomer (tryAcquire) cannot barge past the queue
    expect((await holder.acquire(permit(key, 'newcomer', 2))).granted).toBe(false);
    const before = await commandStats(ownAdmin);
    await holder.release({ key, owner: 'h0', token: tokens[0]!, mode: 'shared' });
    expect(await eventually(() => handed.length === 1, 5_000)).toBe(true);
    expect(scriptCalls(delta(before, await commandStats(ownAdmin)))).toBe(1); // the release alone hands the permit on
    ownAdmin.disconnect();
    expect(handed[0]![0]).toBe(0);
    await sleep(50);
    expect(handed.length).toBe(1); // one permit freed, one waiter served
    await holder.release({ key, owner: 'h1', token: tokens[1]!, mode: 'shared' });
    expect(await eventually(() => handed.length === 2, 5_000)).toBe(true);
    expect(handed.map(([i]) => i)).toEqual([0, 1]);
    const [state] = await holder.inspect(key);
    expect(state!.limit).toBe(2);
    expect(state!.holders.map((h) => h.token)).toEqual(handed.map(([, h]) => h!.token));
    expect(state!.waiters).toBe(1);
    expect(handed[1]![1]!.token).toBeGreaterThan(handed[0]![1]!.token);
  });

  it('FIFO through Locks: permit waiters are served in arrival order, an exclusive waiter ahead blocks later permits', async () => {
    const key = 'sem-fifo-locks';
    const c0 = locks();
    const held = [await c0.acquire(key, { limit: 2, ttlMs: 10_000 }), await c0.acquire(key, { limit: 2, ttlMs: 10_000 })];
    const order: string[] = [];
    const waiting: Promise<Lease>[] = [];
    const enqueue = async (name: string, o: { limit?: number }): Promise<void> => {
      const n = (await c0.inspect(key))[0]!.waiters;
      waiting.push(
        locks()
          .acquire(key, { ...o, ttlMs: 10_000, waitMs: 20_000 })
          .then((l) => (order.push(name), l)),
      );
      await eventually(async () => (await c0.inspect(key))[0]!.waiters === n + 1, 5_000, 5);
    };
    await enqueue('p1', { limit: 2 });
    await enqueue('x', {});
    await enqueue('p2', { limit: 2 });
    await held[0]!.release(); // p1 gets it; x waits for every permit, p2 waits behind x
    const p1 = await waiting[0]!;
    await sleep(100);
    expect(order).toEqual(['p1']);
    await held[1]!.release();
    await sleep(100);
    expect(order).toEqual(['p1']); // p1 still holds: x waits, and so does p2 (behind x)
    await p1.release();
    const x = await waiting[1]!;
    expect(x.mode).toBe('exclusive');
    await x.release();
    const p2 = await waiting[2]!;
    expect(order).toEqual(['p1', 'x', 'p2']);
    await p2.release();
  });

  it('a lone permit holder releases on the fast path: the key is left with its counter only', async () => {
    const b = backend();
    const t = await granted(b, permit('sem-fast', 'p', 3));
    await b.release({ key: 'sem-fast', owner: 'p', token: t, mode: 'shared' });
    expect(Object.keys(await admin.hgetall('leasehold:{sem-fast}'))).toEqual(['t']);
    // a wrong token is refused on that path too (a limit of 1 digit must not pass for a token)
    const t2 = await granted(b, permit('sem-fast', 'p', 2));
    await b.release({ key: 'sem-fast', owner: 'p', token: 2n, mode: 'shared' });
    expect(await admin.hget('leasehold:{sem-fast}', 'h:p')).not.toBeNull();
    await b.release({ key: 'sem-fast', owner: 'p', token: t2, mode: 'shared' });
  });
});

describe('redis: watch', () => {
  it('fires on grant and on release; stops when ended', async () => {
    const watcher = backend();
    const b = backend();
    let fired = 0;
    const stop = await watcher.watch!('watched', () => fired++);
    const t = await granted(b, permit('watched', 'a', 2));
    expect(await eventually(() => fired >= 1, 5_000, 5)).toBe(true);
    const afterGrant = fired;
    await b.release({ key: 'watched', owner: 'a', token: t, mode: 'shared' });
    expect(await eventually(() => fired > afterGrant, 5_000, 5)).toBe(true);
    // the exclusive fast paths (a free key; the only holder) are told too
    const before = fired;
    const x = await granted(b, { ...permit('watched', 'x', undefined), mode: 'exclusive' });
    await b.release({ key: 'watched', owner: 'x', token: x, mode: 'exclusive' });
    expect(await eventually(() => fired >= before + 2, 5_000, 5)).toBe(true);
    stop();
    await sleep(50);
    const ended = fired;
    const y = await granted(b, permit('watched', 'y', undefined));
    await b.release({ key: 'watched', owner: 'y', token: y, mode: 'shared' });
    await sleep(100);
    expect(fired).toBe(ended);
  });

  it('fires when a holder expires with nobody else touching the key (the watch refresh notices it)', async () => {
    const watcher = backend();
    const b = backend();
    const t = await granted(b, permit('watch-expiry', 'a', undefined, { ttlMs: 300 }));
    expect(t).toBeGreaterThan(0n);
    let fired = 0;
    await watcher.watch!('watch-expiry', () => fired++);
    const t0 = performance.now();
    expect(await eventually(() => fired >= 1, 3_000, 5)).toBe(true);
    expect(performance.now() - t0).toBeLessThan(1_000);
    expect(await watcher.inspect('watch-expiry')).toEqual([]);
  });

  it('costs nothing while nobody watches: plain acquire/release are one call each and publish nothing; watched, one PUBLISH per change', async () => {
    // a server of its own: the other tests' clients renew and refresh in the background
    const own = await startRedis();
    const ownAdmin = new Redis(own.url);
    const b = redisBackend({ url: own.url });
    const watcher = redisBackend({ url: own.url });
    opened.push(b, watcher);
    await granted(b, permit('warm', 'w', undefined)); // scripts loaded
    const cycle = async (key: string, owner: string): Promise<void> => {
      const t = await granted(b, { ...permit(key, owner, undefined), mode: 'exclusive' });
      await b.release({ key, owner, token: t, mode: 'exclusive' });
    };
    let before = await commandStats(ownAdmin);
    await cycle('cost', 'a');
    let d = delta(before, await commandStats(ownAdmin));
    expect(scriptCalls(d)).toBe(2);
    expect(d.publish ?? 0).toBe(0);
    await watcher.watch!('cost', () => {});
    before = await commandStats(ownAdmin);
    await cycle('cost', 'b');
    d = delta(before, await commandStats(ownAdmin));
    expect(scriptCalls(d)).toBe(2); // still one call each
    expect(d.publish).toBe(2); // inside the scripts: the grant and the release
    // another key, unwatched, is still free of publishes
    before = await commandStats(ownAdmin);
    await cycle('cost-other', 'c');
    d = delta(before, await commandStats(ownAdmin));
    expect(d.publish ?? 0).toBe(0);
    ownAdmin.disconnect();
  });

  it('two watchers of a key in one client share one subscription; a node-redis client watches too', async () => {
    const watcher = backend();
    const b = backend();
    const seen: string[] = [];
    const stopA = await watcher.watch!('shared-watch', () => seen.push('a'));
    await watcher.watch!('shared-watch', () => seen.push('b'));
    const subs = (await admin.call('PUBSUB', 'NUMSUB', 'leasehold:{shared-watch}:watch')) as [string, number];
    expect(Number(subs[1])).toBe(1);
    const t = await granted(b, permit('shared-watch', 'a', undefined));
    expect(await eventually(() => seen.includes('a') && seen.includes('b'), 5_000, 5)).toBe(true);
    stopA();
    seen.length = 0;
    // a client of the user's own (node-redis) subscribes through its duplicate
    const client = createClient({ url: server.url });
    client.on('error', () => {});
    await client.connect();
    const nr = redisBackend({ client });
    const stopNr = await nr.watch!('shared-watch', () => seen.push('nr'));
    await b.release({ key: 'shared-watch', owner: 'a', token: t, mode: 'shared' });
    expect(await eventually(() => seen.includes('b') && seen.includes('nr'), 5_000, 5)).toBe(true);
    expect(seen).not.toContain('a');
    stopNr();
    await nr.close();
    await client.close();
  });
});

describe('redlock: semaphore', () => {
  let servers: RedisServer[] = [];
  const clients: Locks[] = [];
  const make = (): Locks => {
    const l = new Locks({ backend: redlockBackend({ urls: servers.map((s) => s.url) }) });
    clients.push(l);
    return l;
  };
  beforeAll(async () => {
    servers = await Promise.all([startRedis(), startRedis(), startRedis()]);
  });
  afterAll(async () => {
    await Promise.allSettled(clients.map((c) => c.close()));
  });

  coreRules('redlock', make);

  it('a semaphore of 2 needs every one of 3 servers (a bare majority would admit 3 valid permits); a lock still needs 2', async () => {
    const l = make();
    const p = await l.acquire('quorum', { limit: 2, ttlMs: 5_000 });
    servers[2]!.pause();
    try {
      // the held permit can no longer reach its quorum: its renewal fails
      await expect(p.renew()).rejects.toBeInstanceOf(BackendUnavailableError);
      await expect(make().acquire('quorum-2', { limit: 2, ttlMs: 1_000, waitMs: 0 })).rejects.toBeInstanceOf(BackendUnavailableError);
      const lock = await make().acquire('quorum-1', { limit: 1, ttlMs: 1_000 }); // limit 1: a majority, as a lock
      await lock.release();
    } finally {
      servers[2]!.resume();
    }
    await p.release();
  });
});

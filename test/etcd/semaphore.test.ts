/**
 * Semaphore permits and key watches on etcd, against a real etcd member of the test's own: the
 * limit (never more than N valid holders, each permit its own token), the refusal of another limit
 * or kind with nothing left behind, exclusive requests behind permits, a crashed holder's permit,
 * the hand-off to permit waiters in arrival order, and `watch`.
 */
import { Etcd3 } from 'etcd3';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { AcquireRequest, AcquireResult, Backend, HandOff } from '../../src/core/backend.js';
import { InvalidArgumentError } from '../../src/core/errors.js';
import type { Lease } from '../../src/core/lease.js';
import { Locks } from '../../src/core/locks.js';
import { etcdBackend } from '../../src/etcd/index.js';
import { KeyLayout } from '../../src/etcd/keys.js';
import { startCluster, type Cluster } from '../fixtures/etcd-cluster.mjs';
import { eventually, sleep, uniqueName } from '../helpers/env.js';

describe('etcd semaphore permits', () => {
  let cluster: Cluster;
  let etcd: Etcd3;
  let prefix: string;
  let opened: { close(): Promise<void> }[] = [];
  let n = 0;
  const key = (label: string): string => `${label}:${++n}`;

  const backend = (): Backend => {
    const b = etcdBackend({ hosts: cluster.endpoints, prefix, minTtlMs: 1_000 });
    opened.push(b);
    return b;
  };
  const locks = (): Locks => {
    const l = new Locks({ backend: backend() });
    opened.push(l);
    return l;
  };
  const request = (k: string, owner: string, extra: Partial<AcquireRequest> = {}): AcquireRequest => ({
    key: k,
    owner,
    mode: 'shared',
    ttlMs: 10_000,
    lockDelayMs: 0,
    holder: owner,
    queue: false,
    queueTtlMs: 2_000,
    ...extra,
  });
  /** Everything under our prefix for one lock key, as etcd has it: key (after the lock's base) → create revision. */
  const raw = async (k: string): Promise<Map<string, bigint>> => {
    const base = new KeyLayout(prefix, k).base;
    const kvs = (await etcd.getAll().prefix(base).exec()).kvs;
    return new Map(kvs.map((kv) => [kv.key.toString().slice(base.length), BigInt(kv.create_revision)]));
  };
  const tokenOf = (r: AcquireResult): bigint => {
    if (!r.granted) throw new Error('expected a grant');
    return r.token;
  };

  beforeAll(async () => {
    cluster = await startCluster({ members: 1, heartbeatMs: 50, electionMs: 500 });
    etcd = new Etcd3({ hosts: cluster.endpoints });
    prefix = `${uniqueName('sem')}/`;
  });
  afterEach(async () => {
    await Promise.allSettled(opened.map((o) => o.close()));
    opened = [];
  });
  afterAll(async () => {
    etcd?.close();
    await cluster?.stop();
  });

  it('N permits, more contenders (queued and not): never more than N valid holders, each permit its own increasing token', async () => {
    const k = key('contend');
    const clients = Array.from({ length: 8 }, () => locks());
    let inside = 0;
    let most = 0;
    let overLimit = 0;
    const held = new Set<Lease>();
    const grants: { token: bigint; requestedAfter: bigint }[] = [];
    /** The highest token granted and known when a request was sent: a later grant's token must be above it (I1). */
    let highestDone = 0n;
    const stopAt = performance.now() + 4_000;
    await Promise.all(
      clients.map(async (c, i) => {
        while (performance.now() < stopAt) {
          const requestedAfter = highestDone;
          // half the clients queue (acquire), half only try (tryAcquire: the not-queued, view-guarded grant)
          const lease = i % 2 === 0 ? await c.acquire(k, { limit: 3, ttlMs: 5_000, waitMs: 20_000 }) : await c.tryAcquire(k, { limit: 3, ttlMs: 5_000 });
          if (!lease) {
            await sleep(5);
            continue;
          }
          held.add(lease);
          inside++;
          most = Math.max(most, inside);
          if ([...held].filter((l) => l.held).length > 3) overLimit++;
          grants.push({ token: lease.token, requestedAfter });
          if (lease.token > highestDone) highestDone = lease.token;
          expect(lease.mode).toBe('shared');
          await sleep(5 + (i % 3) * 5);
          inside--;
          held.delete(lease);
          await lease.release();
        }
      }),
    );
    expect(overLimit).toBe(0);
    expect(most).toBeLessThanOrEqual(3);
    expect(most).toBe(3); // the semaphore really admits three at once
    expect(grants.length).toBeGreaterThan(20);
    expect(new Set(grants.map((g) => g.token)).size).toBe(grants.length); // I2
    for (const g of grants) expect(g.token).toBeGreaterThan(g.requestedAfter); // I1
    expect(await raw(k)).toEqual(new Map()); // every permit released, no place left behind
  });

  it('concurrent first requests on a free key (no place, one transaction each): at most N granted', async () => {
    const k = key('race');
    const clients = Array.from({ length: 10 }, () => backend());
    const results = await Promise.all(clients.map((b, i) => b.acquire(request(k, `o${i}`, { limit: 3 }))));
    const granted = results.filter((r) => r.granted);
    expect(granted.length).toBeGreaterThanOrEqual(1);
    expect(granted.length).toBeLessThanOrEqual(3);
    const keys = await raw(k);
    expect([...keys.keys()].every((x) => x.startsWith('q/p/'))).toBe(true);
    expect([...keys.values()].sort()).toEqual(granted.map(tokenOf).sort());
    const [state] = await clients[0]!.inspect(k);
    expect(state).toMatchObject({ key: k, limit: 3, waiters: 0 });
    expect(state!.holders.map((h) => h.mode)).toEqual(granted.map(() => 'shared'));
  });

  it('another limit is refused naming both; nothing is left behind, also for a request that queues (its place is written, then deleted)', async () => {
    const k = key('mismatch');
    const a = backend();
    const b = backend();
    const holder = await a.acquire(request(k, 'holder', { limit: 3 }));
    const before = await raw(k);
    expect(before.size).toBe(1);
    const session = await b.sessions!.open(10_000);
    for (const queue of [false, true]) {
      const refused = await b.acquire(request(k, `five-${queue}`, { limit: 5, queue, session: session.id })).catch((e: unknown) => e);
      expect(refused).toBeInstanceOf(InvalidArgumentError);
      expect((refused as InvalidArgumentError).argument).toBe('limit');
      expect((refused as Error).message).toContain('held as a semaphore of 3 permits; this request asks for 5 permits');
      expect(await raw(k)).toEqual(before);
    }
    // through Locks, waiting: refused at once, not after the wait
    const started = performance.now();
    const viaLocks = await locks()
      .acquire(k, { limit: 4, waitMs: 5_000 })
      .catch((e: unknown) => e);
    expect(viaLocks).toBeInstanceOf(InvalidArgumentError);
    expect(performance.now() - started).toBeLessThan(2_000);
    expect(await raw(k)).toEqual(before);
    // the holder is untouched, and a permit of the same limit still gets in
    const same = await b.acquire(request(k, 'three', { limit: 3, queue: true, session: session.id }));
    expect(tokenOf(same)).toBeGreaterThan(tokenOf(holder));
  });

  it('plain shared and permits refuse each other (either way round); an exclusive request is no conflict, it waits', async () => {
    const k = key('kinds');
    const a = backend();
    const b = backend();
    const permit = await a.acquire(request(k, 'permit', { limit: 2 }));
    expect(permit.granted).toBe(true);
    for (const queue of [false, true]) {
      const plain = await b.acquire(request(k, `plain-${queue}`, { queue })).catch((e: unknown) => e);
      expect(plain).toBeInstanceOf(InvalidArgumentError);
      expect((plain as Error).message).toContain('held as a semaphore of 2 permits; this request asks for a shared lock without a limit');
    }
    expect([...(await raw(k)).keys()]).toHaveLength(1);
    const excl = await b.acquire(request(k, 'excl', { mode: 'exclusive' }));
    expect(excl).toMatchObject({ granted: false });

    const k2 = key('kinds-plain');
    const s = await a.acquire(request(k2, 'shared'));
    expect(s.granted).toBe(true);
    for (const queue of [false, true]) {
      const p = await b.acquire(request(k2, `p-${queue}`, { limit: 3, queue })).catch((e: unknown) => e);
      expect(p).toBeInstanceOf(InvalidArgumentError);
      expect((p as Error).message).toContain('held by shared holders without a limit; this request asks for 3 permits');
    }
    expect([...(await raw(k2)).keys()]).toHaveLength(1);
    const [state] = await a.inspect(k2);
    expect(state?.limit).toBeUndefined();
  });

  it('a waiter of another limit is refused when its turn comes and the key is held as another semaphore; its place goes', async () => {
    const k = key('late-mismatch');
    const l = locks();
    const excl = await l.acquire(k, { ttlMs: 10_000 });
    const three = locks().acquire(k, { limit: 3, ttlMs: 10_000, waitMs: 10_000 });
    await eventually(async () => (await l.inspect(k))[0]?.waiters === 1, 5_000);
    const five = locks()
      .acquire(k, { limit: 5, ttlMs: 10_000, waitMs: 10_000 })
      .catch((e: unknown) => e);
    await eventually(async () => (await l.inspect(k))[0]?.waiters === 2, 5_000);
    await excl.release();
    const p3 = await three;
    const refused = await five;
    expect(refused).toBeInstanceOf(InvalidArgumentError);
    expect((refused as Error).message).toContain('held as a semaphore of 3 permits; this request asks for 5 permits');
    expect(await eventually(async () => (await raw(k)).size === 1, 5_000)).toBe(true);
    await p3.release();
  });

  it('an exclusive request waits for every permit, and permits asked for after it wait behind it (no barging)', async () => {
    const k = key('exclusive');
    const [a, b, c] = [locks(), locks(), locks()];
    const p1 = await a.acquire(k, { limit: 3, ttlMs: 10_000 });
    const p2 = await b.acquire(k, { limit: 3, ttlMs: 10_000 });
    let exclusiveAt = 0;
    const excl = c.acquire(k, { ttlMs: 10_000, waitMs: 10_000 }).then((lease) => ((exclusiveAt = performance.now()), lease));
    await eventually(async () => (await a.inspect(k))[0]?.waiters === 1, 5_000);
    // a free permit, but an exclusive request is ahead
    expect(await locks().tryAcquire(k, { limit: 3, ttlMs: 10_000 })).toBeNull();
    let laterAt = 0;
    const later = locks()
      .acquire(k, { limit: 3, ttlMs: 10_000, waitMs: 10_000 })
      .then((lease) => ((laterAt = performance.now()), lease));
    await eventually(async () => (await a.inspect(k))[0]?.waiters === 2, 5_000);
    await p1.release();
    await sleep(300);
    expect(exclusiveAt).toBe(0);
    const releasedAt = performance.now();
    await p2.release();
    const e = await excl;
    expect(e.token).toBeGreaterThan(p2.token);
    expect(exclusiveAt).toBeGreaterThanOrEqual(releasedAt);
    await sleep(200);
    expect(laterAt).toBe(0);
    await e.release();
    const p3 = await later;
    expect(p3.token).toBeGreaterThan(e.token);
    await p3.release();
  });

  it("a crashed permit holder's permit is freed when its session expires (etcd's lease ttl), and goes to the waiter", async () => {
    const k = key('crash');
    const crashed = backend();
    const alive = backend();
    // The crashed process: its session is never kept alive again.
    const session = await crashed.sessions!.open(2_000);
    const gone = await crashed.acquire(request(k, 'crashed', { limit: 2, session: session.id }));
    const l = locks();
    const other = await l.acquire(k, { limit: 2, ttlMs: 10_000 });
    expect(await alive.acquire(request(k, 'try', { limit: 2 }))).toMatchObject({ granted: false });
    const started = performance.now();
    const third = await l.acquire(k, { limit: 2, ttlMs: 10_000, waitMs: 10_000 });
    const waited = performance.now() - started;
    expect(waited).toBeGreaterThan(1_000);
    expect(waited).toBeLessThan(6_000);
    expect(third.token).toBeGreaterThan(tokenOf(gone));
    const [state] = await l.inspect(k);
    expect(state!.holders.map((h) => h.token).sort()).toEqual([other.token, third.token].sort());
    await Promise.all([other.release(), third.release()]);
  });

  it('permit waiters are handed their permits in arrival order, by the watch (a hand-off without a read)', async () => {
    const k = key('fifo');
    const h = backend();
    const hs = await h.sessions!.open(10_000);
    const holders = [
      tokenOf(await h.acquire(request(k, 'h1', { limit: 2, session: hs.id }))),
      tokenOf(await h.acquire(request(k, 'h2', { limit: 2, session: hs.id }))),
    ];
    const waiters = [backend(), backend(), backend()];
    const handed: (HandOff | undefined)[][] = [[], [], []];
    const places: bigint[] = [];
    for (const [i, w] of waiters.entries()) {
      const ws = await w.sessions!.open(10_000);
      const r = await w.acquire(request(k, `w${i}`, { limit: 2, queue: true, session: ws.id }));
      expect(r.granted).toBe(false);
      if (r.granted) return;
      await w.subscribe!(k, (handOff) => handed[i]!.push(handOff), r.cursor);
      places.push([...(await raw(k)).values()].sort((x, y) => (x < y ? -1 : 1)).at(-1)!);
    }
    // the newest holder goes first (not in arrival order): the first waiter gets its permit, nobody else
    await h.release({ key: k, owner: 'h2', token: holders[1]!, mode: 'shared' });
    expect(await eventually(() => handed[0]!.length > 0, 5_000)).toBe(true);
    expect(handed[0]![0]).toEqual({ token: places[0], session: expect.any(String) });
    await sleep(200);
    expect(handed[1]).toEqual([]);
    expect(handed[2]).toEqual([]);
    await h.release({ key: k, owner: 'h1', token: holders[0]!, mode: 'shared' });
    expect(await eventually(() => handed[1]!.length > 0, 5_000)).toBe(true);
    expect(handed[1]![0]?.token).toBe(places[1]);
    expect(handed[2]).toEqual([]);
    // the handed-off waiters hold: asking again answers their grant
    const again = await waiters[1]!.acquire(request(k, 'w1', { limit: 2, queue: true, session: handed[1]![0]!.session }));
    expect(again).toMatchObject({ granted: true, token: places[1] });
  });

  it('watch fires on a grant, a place, a release and an expiry, and stops when ended', async () => {
    const k = key('watch');
    const b = backend();
    let calls = 0;
    const stop = await b.watch!(k, () => calls++);
    const a = backend();
    const granted = await a.acquire(request(k, 'one', { limit: 2 }));
    expect(await eventually(() => calls >= 1, 5_000)).toBe(true);
    let seen = calls;
    await a.release({ key: k, owner: 'one', token: tokenOf(granted), mode: 'shared' });
    expect(await eventually(() => calls > seen, 5_000)).toBe(true);
    // an expiry: etcd deletes the keys of a session nobody keeps alive
    const session = await a.sessions!.open(1_000);
    await a.acquire(request(k, 'expiring', { mode: 'exclusive', session: session.id }));
    expect(await eventually(() => calls > seen + 1, 5_000)).toBe(true);
    seen = calls;
    expect(await eventually(() => calls > seen, 5_000)).toBe(true);
    expect(await raw(k)).toEqual(new Map());
    // ended: no more calls (the other key's changes never counted)
    stop();
    seen = calls;
    const again = await a.acquire(request(k, 'after', { limit: 2 }));
    await a.acquire(request(key('other'), 'other'));
    await sleep(300);
    expect(calls).toBe(seen);
    await a.release({ key: k, owner: 'after', token: tokenOf(again), mode: 'shared' });
  });

  it('watch shares the lock watch of a waiter of the same client, and both keep working', async () => {
    const k = key('watch-shared');
    const b = backend();
    const l = new Locks({ backend: b });
    opened.push(l);
    let calls = 0;
    const stop = await b.watch!(k, () => calls++);
    const first = await l.acquire(k, { ttlMs: 10_000 });
    const second = l.acquire(k, { ttlMs: 10_000, waitMs: 10_000 });
    await eventually(async () => (await l.inspect(k))[0]?.waiters === 1, 5_000);
    const seen = calls;
    await first.release();
    const lease = await second;
    expect(calls).toBeGreaterThan(seen);
    await lease.release();
    stop();
  });
  it('watch follows again after its stream breaks (the member restarts): told at once, and working afterwards', async () => {
    const k = key('watch-restart');
    const b = backend();
    let calls = 0;
    const stop = await b.watch!(k, () => calls++);
    const [member] = cluster.members;
    await member!.kill('SIGKILL');
    member!.start();
    await cluster.waitHealthy();
    expect(await eventually(() => calls >= 1, 10_000)).toBe(true); // a change may have been missed: said so
    await sleep(2_000); // following again (the retry backs off up to 2 s)
    const seen = calls;
    const a = backend();
    const granted = await a.acquire(request(k, 'after', { limit: 2 }));
    expect(await eventually(() => calls > seen, 5_000)).toBe(true);
    stop();
    await a.release({ key: k, owner: 'after', token: tokenOf(granted), mode: 'shared' });
  });
});

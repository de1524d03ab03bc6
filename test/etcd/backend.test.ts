/**
 * etcd-specific behaviour beyond the conformance suite, against a real etcd member of the test's
 * own: where the token comes from, the key layout, per-waiter queue leases, etcd issue 11456,
 * lock-delay of sessions, shared/exclusive ordering, option checks and outages.
 */
import { Etcd3 } from 'etcd3';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { AcquireRequest, Backend, HandOff } from '../../src/core/backend.js';
import { AcquireTimeoutError, BackendUnavailableError, ClosedError, InvalidArgumentError } from '../../src/core/errors.js';
import { Locks } from '../../src/core/locks.js';
import { etcdBackend, type EtcdClient } from '../../src/etcd/index.js';
import { decodePart, encodePart, KeyLayout, parseKey } from '../../src/etcd/keys.js';
import { startCluster, type Cluster } from '../fixtures/etcd-cluster.mjs';
import { acquireRequest, eventually, sleep, uniqueName } from '../helpers/env.js';

describe('etcd key layout', () => {
  it('encodes any key so that it round-trips, never contains the separator and keeps prefixes', () => {
    const keys = ['a', 'a/b', 'a%2Fb', 'ключ', '🔒 x', '', 'x'.repeat(300), 'a:b.c-d_e~f', '100%'];
    for (const k of keys) {
      const e = encodePart(k);
      expect(decodePart(e)).toBe(k);
      expect(e).not.toContain('/');
      expect(e).toMatch(/^[A-Za-z0-9._~:%-]*$/);
    }
    expect(encodePart('a/b')).not.toBe(encodePart('a%2Fb'));
    for (const [p, k] of [
      ['te', 'test'],
      ['ключ', 'ключи'],
      ['a/', 'a/b'],
      ['🔒', '🔒 x'],
    ] as const) {
      expect(encodePart(k).startsWith(encodePart(p))).toBe(true);
    }
  });

  it('keeps entries and lock-delay markers of different keys apart', () => {
    const a = new KeyLayout('lh/', 'a');
    const ab = new KeyLayout('lh/', 'a/q/e');
    expect(ab.base.startsWith(a.base)).toBe(false);
    expect(parseKey('lh/', a.entry('exclusive', 'o/1'))).toEqual({ kind: 'entry', encKey: 'a', mode: 'exclusive', encOwner: 'o%2F1' });
    expect(parseKey('lh/', a.entry('shared', 'o'))).toMatchObject({ kind: 'entry', mode: 'shared' });
    expect(parseKey('lh/', a.delay('o'))).toEqual({ kind: 'delay', encKey: 'a', encOwner: 'o' });
    expect(parseKey('lh/', 'lh/a/x/y')).toBeUndefined();
    expect(parseKey('lh/', 'other/a/q/e/o')).toBeUndefined();
  });
});

describe('etcd options', () => {
  it('are checked at the boundary', () => {
    expect(() => etcdBackend({} as never)).toThrow(InvalidArgumentError);
    expect(() => etcdBackend({ hosts: ['http://127.0.0.1:1'], client: {} as never })).toThrow(/exactly one/);
    expect(() => etcdBackend({ hosts: ['127.0.0.1'] })).toThrow(expect.objectContaining({ argument: 'hosts' })); // no port (bare host:port is fine)
    expect(() => etcdBackend({ hosts: [] })).toThrow(expect.objectContaining({ argument: 'hosts' }));
    expect(() => etcdBackend({ client: { kv: {} } as never })).toThrow(expect.objectContaining({ argument: 'client' }));
    expect(() => etcdBackend({ hosts: 'http://127.0.0.1:1', minTtlMs: 1500 })).toThrow(expect.objectContaining({ argument: 'minTtlMs' }));
    expect(() => etcdBackend({ hosts: 'http://127.0.0.1:1', prefix: '' })).toThrow(expect.objectContaining({ argument: 'prefix' }));
    expect(() => etcdBackend({ hosts: 'http://127.0.0.1:1', ttl: 1 } as never)).toThrow(InvalidArgumentError);
    expect(() => etcdBackend({ hosts: 'http://127.0.0.1:1', watchLingerMs: -1 })).toThrow(expect.objectContaining({ argument: 'watchLingerMs' }));
    expect(() => etcdBackend({ hosts: 'http://127.0.0.1:1', watchLingerMs: '10s' } as never)).toThrow(expect.objectContaining({ argument: 'watchLingerMs' }));
  });
});

describe('etcd backend (storage layout: these tests read the keys under a lock on purpose)', () => {
  let cluster: Cluster;
  let etcd: Etcd3;
  let prefix: string;
  let opened: { close(): Promise<void> }[] = [];
  let n = 0;
  const key = (label: string): string => `${label}:${++n}`;

  const backend = (options: { requestTimeoutMs?: number; watchLingerMs?: number } = {}): Backend => {
    const b = etcdBackend({ hosts: cluster.endpoints, prefix, minTtlMs: 1_000, ...options });
    opened.push(b);
    return b;
  };
  const locks = (holderName?: string): Locks => {
    const l = new Locks({ backend: backend(), ...(holderName ? { holderName } : {}) });
    opened.push(l);
    return l;
  };
  const request = acquireRequest;
  /** Everything under our prefix for one lock key, as etcd has it. */
  const raw = async (k: string) => (await etcd.getAll().prefix(new KeyLayout(prefix, k).base).exec()).kvs;

  beforeAll(async () => {
    cluster = await startCluster({ members: 1, heartbeatMs: 50, electionMs: 500 });
    etcd = new Etcd3({ hosts: cluster.endpoints });
    prefix = `${uniqueName('lh')}/`;
  });
  afterEach(async () => {
    await Promise.allSettled(opened.map((o) => o.close()));
    opened = [];
  });
  afterAll(async () => {
    etcd?.close();
    await cluster?.stop();
  });

  it("the token is the create revision of the holder's key, on the session's lease", async () => {
    const k = key('token');
    const l = locks();
    const lease = await l.acquire(k, { ttlMs: 2_000 });
    const kvs = await raw(k);
    expect(kvs).toHaveLength(1);
    expect(BigInt(kvs[0]!.create_revision)).toBe(lease.token);
    expect(kvs[0]!.key.toString()).toBe(`${new KeyLayout(prefix, k).base}q/e/${kvs[0]!.key.toString().split('/').pop()}`);
    // attached to a lease (the session's), which etcd reports with this key
    const ttl = await etcd.leaseClient.leaseTimeToLive({ ID: kvs[0]!.lease, keys: true });
    expect(ttl.keys.map((b) => b.toString())).toContain(kvs[0]!.key.toString());
    // the token is a revision: another write anywhere in etcd moves the next token past it
    await etcd.put(`${prefix}unrelated`).value('x');
    await lease.release();
    expect(await raw(k)).toHaveLength(0);
    const next = await l.acquire(k, { ttlMs: 2_000 });
    expect(next.token).toBeGreaterThan(lease.token + 1n);
  });

  it('one session lease carries every lock of a client; autoRenew:false locks get their own, revoked on release', async () => {
    const l = locks();
    const held = await Promise.all([0, 1, 2, 3, 4].map((i) => l.acquire(key(`many${i}`), { ttlMs: 2_000 })));
    const leases = new Set<string>();
    for (const h of held) for (const kv of await raw(h.key)) leases.add(kv.lease);
    expect(leases.size).toBe(1);
    const own = await l.acquire(key('own'), { ttlMs: 2_000, autoRenew: false });
    const [kv] = await raw(own.key);
    expect(leases.has(kv!.lease)).toBe(false);
    await own.release();
    // (revoked in the background: the release itself already deleted the key)
    expect(await eventually(async () => Number((await etcd.leaseClient.leaseTimeToLive({ ID: kv!.lease })).TTL) <= 0, 3_000)).toBe(true);
    await Promise.all(held.map((h) => h.release()));
  });

  it('rounds a ttl up to whole seconds and reports it', async () => {
    const l = locks();
    const a = await l.acquire(key('round'), { ttlMs: 1_500 });
    expect(a.ttlMs).toBe(2_000);
    const b = await l.acquire(key('round'), { ttlMs: 1_200, autoRenew: false });
    expect(b.ttlMs).toBe(2_000);
  });

  it('etcd issue 11456: a waiter whose session expired while it waited is not granted over the next holder', async () => {
    const k = key('11456');
    const h = backend();
    const w = backend();
    const x = backend();
    const hold = await h.acquire(request(k, 'holder'));
    expect(hold.granted).toBe(true);
    const session = await w.sessions!.open(10_000);
    const waiting = await w.acquire(request(k, 'waiter', { queue: true, session: session.id }));
    expect(waiting.granted).toBe(false);
    // the waiter's session ends behind its back (expired during a pause; here: revoked), its entry with it
    await etcd.leaseClient.leaseRevoke({ ID: session.id });
    const xSession = await x.sessions!.open(10_000);
    expect((await x.acquire(request(k, 'x', { queue: true, session: xSession.id }))).granted).toBe(false);
    if (hold.granted) await h.release({ key: k, owner: 'holder', token: hold.token, mode: 'exclusive' });
    const xGrant = await x.acquire(request(k, 'x', { queue: true, session: xSession.id }));
    expect(xGrant.granted).toBe(true);
    // the old waiter asks again: its session is gone, so it is told, not granted
    expect(await w.acquire(request(k, 'waiter', { queue: true, session: session.id }))).toEqual({ granted: false, sessionLost: true });
    // with a new session it queues behind x
    const fresh = await w.sessions!.open(10_000);
    expect((await w.acquire(request(k, 'waiter', { queue: true, session: fresh.id }))).granted).toBe(false);
    if (xGrant.granted) await x.release({ key: k, owner: 'x', token: xGrant.token, mode: 'exclusive' });
    const late = await w.acquire(request(k, 'waiter', { queue: true, session: fresh.id }));
    expect(late.granted).toBe(true);
    if (late.granted && xGrant.granted) expect(late.token).toBeGreaterThan(xGrant.token);
  });

  it("a crashed waiter's place ends with its session; an operator can remove one by hand", async () => {
    const k = key('crashed-waiter');
    const h = backend();
    const w = backend();
    const hold = await h.acquire(request(k, 'holder'));
    // the waiting process crashes: its session (1 s) is no longer kept alive
    const session = await w.sessions!.open(1_000);
    expect((await w.acquire(request(k, 'ghost', { queue: true, session: session.id }))).granted).toBe(false);
    if (hold.granted) await h.release({ key: k, owner: 'holder', token: hold.token, mode: 'exclusive' });
    const other = backend();
    expect((await other.acquire(request(k, 'newcomer'))).granted).toBe(false); // the ghost is first in line
    expect(await eventually(async () => (await other.acquire(request(k, 'newcomer'))).granted, 5_000, 100)).toBe(true);
    // a stuck waiter's entry deleted by an operator: the one behind it is woken and served
    const k2 = key('removed-waiter');
    const hold2 = await h.acquire(request(k2, 'holder'));
    const stuckSession = await w.sessions!.open(30_000);
    expect((await w.acquire(request(k2, 'stuck', { queue: true, session: stuckSession.id }))).granted).toBe(false);
    if (hold2.granted) await h.release({ key: k2, owner: 'holder', token: hold2.token, mode: 'exclusive' });
    const locks2 = locks();
    const next = locks2.acquire(k2, { ttlMs: 1_000, waitMs: 10_000 });
    await eventually(async () => (await locks2.inspect(k2))[0]?.waiters === 1, 5_000);
    const first = (await raw(k2))
      .filter((kv) => kv.key.toString().includes('/q/'))
      .sort((a, b) => Number(BigInt(a.create_revision) - BigInt(b.create_revision)))[0]!;
    await etcd.delete().key(first.key.toString()); // the stuck waiter: first in line
    expect((await next).held).toBe(true);
    await w.sessions!.close(stuckSession.id);
  });

  it('I8 with sessions: a session that expires without release keeps its keys for lockDelayMs', async () => {
    const k = key('session-delay');
    const a = backend();
    const session = await a.sessions!.open(1_000);
    const grant = await a.acquire(request(k, 'a', { session: session.id, ttlMs: 1_000, lockDelayMs: 3_000 }));
    expect(grant.granted).toBe(true);
    // nobody keeps the session alive: it expires after ~1 s (the holder crashed)
    const b = locks();
    const started = performance.now();
    expect(await eventually(async () => (await b.inspect(k))[0]?.holders.length === 0, 5_000, 100)).toBe(true);
    const [state] = await b.inspect(k);
    expect(state?.lockDelayRemainingMs).toBeGreaterThan(0);
    if (grant.granted) expect(state?.lastToken).toBe(grant.token);
    expect(await b.tryAcquire(k, { ttlMs: 1_000 })).toBeNull();
    const next = await b.acquire(k, { ttlMs: 1_000, waitMs: 15_000 });
    expect(performance.now() - started).toBeGreaterThanOrEqual(2_500);
    if (grant.granted) expect(next.token).toBeGreaterThan(grant.token);
  });

  it('I8 with sessions: closing the session on purpose frees its keys at once', async () => {
    const k = key('session-close');
    const a = backend();
    const session = await a.sessions!.open(2_000);
    expect((await a.acquire(request(k, 'a', { session: session.id, lockDelayMs: 30_000 }))).granted).toBe(true);
    await a.sessions!.close(session.id);
    expect(await locks().tryAcquire(k, { ttlMs: 1_000 })).not.toBeNull();
  });

  it('shared holders with lock-delay let other shared requests in; one that expires blocks everyone', async () => {
    const k = key('shared-delay');
    const a = locks();
    const b = locks();
    const c = locks();
    const s1 = await a.acquire(k, { mode: 'shared', ttlMs: 1_000, autoRenew: false, lockDelayMs: 3_000 });
    const s2 = await b.acquire(k, { mode: 'shared', ttlMs: 10_000, lockDelayMs: 3_000 });
    const plain = await locks('plain').acquire(k, { mode: 'shared', ttlMs: 10_000 }); // no lock-delay of its own
    expect(s2.token).toBeGreaterThan(s1.token);
    await eventually(() => s1.signal.aborted, 5_000);
    // s1 expired without release: its marker now blocks new grants, shared ones too
    const blocked = async (): Promise<boolean> => {
      const got = await c.tryAcquire(k, { mode: 'shared', ttlMs: 1_000 });
      await got?.release(); // (granted while s1 had not yet expired on the server)
      return got === null;
    };
    expect(await eventually(blocked, 3_000, 100)).toBe(true);
    expect(s2.held).toBe(true);
    // inspect still tells the two live holders from waiters, next to the expired one's delay
    const [state] = await c.inspect(k);
    expect(state?.holders.map((h) => h.token).sort()).toEqual([s2.token, plain.token].sort());
    expect(state?.waiters).toBe(0);
    expect(state?.lockDelayRemainingMs).toBeGreaterThan(0);
    await plain.release();
    await s2.release();
    const s3 = await c.acquire(k, { mode: 'shared', ttlMs: 1_000, waitMs: 15_000 });
    expect(s3.token).toBeGreaterThan(s2.token);
  });

  it('a shared request waits behind a queued exclusive one (no barging), then shares with the shared ones after it', async () => {
    const k = key('rw');
    const [a, b, c, d] = [locks(), locks(), locks(), locks()];
    const order: string[] = [];
    const s1 = await a.acquire(k, { mode: 'shared', ttlMs: 10_000 });
    const x = b.acquire(k, { ttlMs: 10_000, waitMs: 20_000 }).then((l) => (order.push('x'), l));
    await eventually(async () => (await a.inspect(k))[0]?.waiters === 1, 5_000);
    const s2 = c.acquire(k, { mode: 'shared', ttlMs: 10_000, waitMs: 20_000 }).then((l) => (order.push('s2'), l));
    await eventually(async () => (await a.inspect(k))[0]?.waiters === 2, 5_000);
    const s3 = d.acquire(k, { mode: 'shared', ttlMs: 10_000, waitMs: 20_000 }).then((l) => (order.push('s3'), l));
    await eventually(async () => (await a.inspect(k))[0]?.waiters === 3, 5_000);
    await sleep(200);
    expect(order).toEqual([]);
    await s1.release();
    const xl = await x;
    await sleep(200);
    expect(order).toEqual(['x']);
    await xl.release();
    const [l2, l3] = await Promise.all([s2, s3]);
    expect(l2.held && l3.held).toBe(true);
    expect(l2.token).toBeGreaterThan(xl.token);
    expect(l3.token).toBeGreaterThan(l2.token);
  });

  it('a release wakes the next waiter only (no herd)', async () => {
    const k = key('herd');
    const h = backend();
    const hold = await h.acquire(request(k, 'holder'));
    expect(hold.granted).toBe(true);
    const woken: string[] = [];
    const unsubscribes: (() => void)[] = [];
    for (const name of ['w1', 'w2', 'w3']) {
      const b = backend();
      const session = await b.sessions!.open(10_000);
      const busy = await b.acquire(request(k, name, { queue: true, session: session.id }));
      expect(busy.granted).toBe(false);
      if (!busy.granted) unsubscribes.push(await b.subscribe!(k, () => woken.push(name), busy.cursor));
    }
    expect(woken).toEqual([]);
    if (hold.granted) await h.release({ key: k, owner: 'holder', token: hold.token, mode: 'exclusive' });
    expect(await eventually(() => woken.length > 0, 5_000)).toBe(true);
    await sleep(300);
    expect(woken).toEqual(['w1']);
    for (const u of unsubscribes) u();
  });

  /** A queued waiter on its own backend and session, subscribed; what its wake-up hook is given. */
  const queued = async (k: string, name: string) => {
    const b = backend();
    const session = await b.sessions!.open(10_000);
    const busy = await b.acquire(request(k, name, { queue: true, session: session.id }));
    if (busy.granted) throw new Error(`${name} was granted`);
    const calls: (HandOff | undefined)[] = [];
    const unsubscribe = await b.subscribe!(k, (h) => calls.push(h), busy.cursor);
    // (its entry is the newest under the lock: keys carry the backend's request names, not owners)
    const entry = (await raw(k))
      .filter((kv) => kv.key.toString().includes('/q/'))
      .sort((a, b) => Number(BigInt(b.create_revision) - BigInt(a.create_revision)))[0]!;
    return { b, name, session: session.id, calls, unsubscribe, token: BigInt(entry.create_revision) };
  };

  it('hand-off without a read: the next waiter follows the lock and is handed its grant; the ones behind stay quiet, then the next', async () => {
    const k = key('handoff');
    const h = backend();
    const hold = await h.acquire(request(k, 'holder'));
    if (!hold.granted) throw new Error('not granted');
    const [w1, w2, w3] = [await queued(k, 'w1'), await queued(k, 'w2'), await queued(k, 'w3')];
    await h.release({ key: k, owner: 'holder', token: hold.token, mode: 'exclusive' });
    expect(await eventually(() => w1.calls.length > 0, 5_000)).toBe(true);
    await sleep(200);
    // w1 holds by its place (its entry's create revision is the token, on its session), and is told so
    expect(w1.calls).toEqual([{ token: w1.token, session: w1.session }]);
    expect(w2.calls).toEqual([]);
    expect(w3.calls).toEqual([]);
    expect((await h.inspect(k))[0]!.holders.map((x) => x.token)).toEqual([w1.token]);
    // asking instead (a lost message) gets the same grant
    expect(await w1.b.acquire(request(k, 'w1', { queue: true, session: w1.session }))).toMatchObject({ granted: true, token: w1.token });
    await w1.b.release({ key: k, owner: 'w1', token: w1.token, mode: 'exclusive' });
    expect(await eventually(() => w2.calls.length > 0, 5_000)).toBe(true);
    await sleep(200);
    expect(w2.calls).toEqual([{ token: w2.token, session: w2.session }]);
    expect(w3.calls).toEqual([]);
    for (const w of [w1, w2, w3]) w.unsubscribe();
  });

  it('a waiter that gives up while its call asks again writes no new place after the cancel (its read finds the place gone)', async () => {
    const k = key('cancel-reask');
    const h = backend();
    expect((await h.acquire(request(k, 'holder'))).granted).toBe(true);
    // The waiter's reads are held back on demand, so its cancel's delete lands before its read.
    let slowReads = false;
    const client: EtcdClient = {
      kv: {
        txn: (req, options) => etcd.kv.txn(req, options),
        range: async (req, options) => {
          if (slowReads) await sleep(300);
          return etcd.kv.range(req, options);
        },
      },
      leaseClient: etcd.leaseClient,
      watch: () => etcd.watch(),
    };
    const w = etcdBackend({ client, prefix, minTtlMs: 1_000 });
    opened.push(w);
    const session = await w.sessions!.open(5_000);
    const req = request(k, 'waiter', { queue: true, session: session.id });
    expect((await w.acquire(req)).granted).toBe(false); // a place in the queue
    const puts: string[] = [];
    const watcher = await etcd.watch().prefix(new KeyLayout(prefix, k).base).create();
    watcher.on('put', (kv) => puts.push(kv.key.toString()));
    try {
      slowReads = true;
      const again = w.acquire(req); // woken: asks again, and its read is slow
      await w.cancelWait!({ key: k, owner: 'waiter' }); // gives up meanwhile: the place is deleted
      expect(await again).toMatchObject({ granted: false });
      await sleep(300); // watch events on the wire arrive
      expect(puts).toEqual([]); // no new place written after the cancel
      expect((await raw(k)).map((kv) => BigInt(kv.create_revision))).toHaveLength(1); // the holder's alone
    } finally {
      await watcher.cancel();
    }
  });

  it('hand-off without a read closes the gap: a release before the watch exists is still handed over', async () => {
    const k = key('handoff-gap');
    const h = backend();
    const w = backend();
    const hold = await h.acquire(request(k, 'holder'));
    if (!hold.granted) throw new Error('not granted');
    const session = await w.sessions!.open(10_000);
    const busy = await w.acquire(request(k, 'w', { queue: true, session: session.id }));
    if (busy.granted) throw new Error('granted');
    await h.release({ key: k, owner: 'holder', token: hold.token, mode: 'exclusive' });
    await etcd.put(`${prefix}unrelated`).value('moves the revision on');
    const calls: (HandOff | undefined)[] = [];
    const unsubscribe = await w.subscribe!(k, (x) => calls.push(x), busy.cursor);
    expect(await eventually(() => calls.length > 0, 5_000)).toBe(true);
    const [entry] = await raw(k);
    expect(calls).toEqual([{ token: BigInt(entry!.create_revision), session: session.id }]);
    unsubscribe();
  });

  it('etcd issue 11456 on the watch path: a waiter whose entry went while it waited is told to ask, never handed the key', async () => {
    const k = key('handoff-11456');
    const h = backend();
    const hold = await h.acquire(request(k, 'holder'));
    if (!hold.granted) throw new Error('not granted');
    const w = await queued(k, 'w');
    const behind = await queued(k, 'behind');
    await etcd.leaseClient.leaseRevoke({ ID: w.session }); // its session ends behind its back, its entry with it
    expect(await eventually(() => w.calls.length > 0, 5_000)).toBe(true);
    expect(w.calls).toEqual([undefined]);
    await h.release({ key: k, owner: 'holder', token: hold.token, mode: 'exclusive' });
    expect(await eventually(() => behind.calls.length > 0, 5_000)).toBe(true);
    await sleep(200);
    expect(w.calls).toEqual([undefined]);
    expect(behind.calls).toEqual([{ token: behind.token, session: behind.session }]);
    w.unsubscribe();
    behind.unsubscribe();
  });

  it('a holder that expires with lock-delay is not a hand-off: the waiter is told to ask, and waits out the delay', async () => {
    const k = key('handoff-delay');
    const h = backend();
    const hs = await h.sessions!.open(1_000);
    const hold = await h.acquire(request(k, 'holder', { session: hs.id, lockDelayMs: 2_000 }));
    if (!hold.granted) throw new Error('not granted');
    const w = await queued(k, 'w');
    await etcd.leaseClient.leaseRevoke({ ID: hs.id }); // the holder's session ends without a release: its marker stays
    expect(await eventually(() => w.calls.length > 0, 5_000)).toBe(true);
    expect(w.calls).toEqual([undefined]);
    expect(await w.b.acquire(request(k, 'w', { queue: true, session: w.session }))).toMatchObject({ granted: false });
    w.unsubscribe();
  });

  /** What etcd's own /metrics say: gRPC messages received by method, and the watchers open now. */
  const metrics = async () => {
    const text = await (await fetch(`${cluster.endpoints[0]}/metrics`)).text();
    const received = (method: string): number =>
      text
        .split('\n')
        .filter((l) => l.startsWith('grpc_server_msg_received_total{') && l.includes(`grpc_method="${method}"`))
        .reduce((a, l) => a + Number(l.split(' ').pop()), 0);
    const watchers = Number(/^etcd_debugging_mvcc_watcher_total (\S+)$/m.exec(text)?.[1]);
    return { watch: received('Watch'), range: received('Range'), txn: received('Txn'), watchers };
  };

  /** One round: `h` takes the free key, `w` queues behind and is handed the key when `h` lets go, then lets go itself. */
  const handOffRound = async (h: Backend, w: Backend, k: string, session: string) => {
    const hold = await h.acquire(request(k, 'h'));
    if (!hold.granted) throw new Error('h was not granted');
    const busy = await w.acquire(request(k, 'w', { queue: true, session }));
    if (busy.granted) throw new Error('w was granted');
    const calls: (HandOff | undefined)[] = [];
    const unsubscribe = await w.subscribe!(k, (x) => calls.push(x), busy.cursor);
    await h.release({ key: k, owner: 'h', token: hold.token, mode: 'exclusive' });
    await eventually(() => calls.length > 0, 5_000);
    unsubscribe();
    const handOff = calls[0];
    if (handOff) await w.release({ key: k, owner: 'w', token: handOff.token, mode: 'exclusive' });
    return calls;
  };

  /** Every key created under a lock's directory between two revisions (etcd keeps the history until compaction). */
  const createdKeys = async (k: string, from: bigint): Promise<Set<string>> => {
    const keys = new Set<string>();
    const watcher = await etcd.watch().prefix(new KeyLayout(prefix, k).base).startRevision(String(from)).create();
    let last = performance.now();
    watcher.on('put', (kv) => {
      keys.add(kv.key.toString());
      last = performance.now();
    });
    while (performance.now() - last < 500) await sleep(100);
    await watcher.cancel();
    return keys;
  };

  it('a lock used many times keeps a few keys: a request key is named for reuse, not after its owner', async () => {
    // etcd keeps every deleted key in its index until a compaction, and each grant's guards range
    // over the lock: keys named after each request's owner made a busy lock slower and slower.
    const k = key('names');
    const from = BigInt((await etcd.get(`${prefix}nothing`).exec()).header.revision) + 1n;
    const one = locks();
    const tokens: bigint[] = [];
    for (let i = 0; i < 40; i++) {
      const lease = await one.acquire(k, { ttlMs: 2_000 });
      tokens.push(lease.token);
      await lease.release();
    }
    // four clients, two requests of each in flight at a time, on the same lock
    const clients = [locks(), locks(), locks(), locks()];
    await Promise.all(
      clients.flatMap((c) =>
        [0, 1].map(async () => {
          for (let i = 0; i < 8; i++) {
            const lease = await c.acquire(k, { ttlMs: 2_000, waitMs: 20_000 });
            tokens.push(lease.token);
            await lease.release();
          }
        }),
      ),
    );
    // waits that time out give their names back too (cancelWait deletes the place)
    const holder = await one.acquire(k, { ttlMs: 2_000 });
    const waiter = locks();
    for (let i = 0; i < 10; i++) await expect(waiter.acquire(k, { ttlMs: 2_000, waitMs: 30 })).rejects.toThrow(AcquireTimeoutError);
    tokens.push(holder.token);
    await holder.release();
    const created = await createdKeys(k, from);
    // 40 + 64 + 1 grants and 10 timed-out waits: one name for the first client, at most two for
    // each of the next four, and one (maybe two, while a cancel is in flight) for the waiter
    expect(created.size).toBeGreaterThanOrEqual(2);
    expect(created.size).toBeLessThanOrEqual(1 + 4 * 2 + 2);
    // every grant still got a token of its own
    expect(new Set(tokens).size).toBe(tokens.length);
    expect(await raw(k)).toHaveLength(0);
  });

  it('a name whose grant ended without its release is not used again while its lock-delay marker runs', async () => {
    // Reusing it would make the marker look like the new request's own (dormant) and end the delay early (I8).
    const k = key('retired');
    const l = locks();
    const lease = await l.acquire(k, { ttlMs: 2_000, lockDelayMs: 3_000, autoRenew: false });
    const [entry] = (await raw(k)).filter((kv) => kv.key.toString().includes('/q/'));
    // the grant's own lease is revoked behind the client's back: the entry goes, the marker (on a lease of its own) stays
    await etcd.leaseClient.leaseRevoke({ ID: entry!.lease });
    const revokedAt = performance.now();
    await lease.release(); // finds nothing to release
    const next = await l.acquire(k, { ttlMs: 2_000, waitMs: 15_000 });
    // the marker's lease: the grant's ttl + lockDelayMs + 1 s, from the grant
    expect(performance.now() - revokedAt).toBeGreaterThanOrEqual(3_000);
    expect(next.token).toBeGreaterThan(lease.token);
    const names = (await raw(k)).filter((kv) => kv.key.toString().includes('/q/')).map((kv) => kv.key.toString());
    expect(names).not.toContain(entry!.key.toString());
  });

  it('a client that waits on the same lock again joins the watch it keeps there: no new watch and no read per wait', async () => {
    const k = key('linger');
    const h = backend();
    const w = backend();
    const session = (await w.sessions!.open(10_000)).id;
    expect(await handOffRound(h, w, k, session)).toEqual([expect.objectContaining({ session })]); // opens the lock's watch
    const before = await metrics();
    for (let i = 0; i < 5; i++) expect(await handOffRound(h, w, k, session)).toEqual([expect.objectContaining({ session })]);
    const after = await metrics();
    // Each round is three transactions (h's grant, w's place, w's release: h's release is the
    // fourth) and nothing else: no watch created or cancelled, no read to close a gap.
    expect(after.watch - before.watch).toBe(0);
    expect(after.range - before.range).toBe(0);
    expect(after.txn - before.txn).toBe(5 * 4);
  });

  it('the kept watch closes watchLingerMs after its last waiter; with 0 every wait opens its own', async () => {
    const k = key('linger-end');
    const h = backend();
    const w = backend({ watchLingerMs: 300 });
    const session = (await w.sessions!.open(10_000)).id;
    const base = (await metrics()).watchers;
    await handOffRound(h, w, k, session);
    expect((await metrics()).watchers).toBe(base + 1); // lingering
    expect(await eventually(async () => (await metrics()).watchers === base, 3_000)).toBe(true);

    const once = backend({ watchLingerMs: 0 });
    const s2 = (await once.sessions!.open(10_000)).id;
    const before = await metrics();
    for (let i = 0; i < 3; i++) expect(await handOffRound(h, once, k, s2)).toEqual([expect.objectContaining({ session: s2 })]);
    const after = await metrics();
    expect(after.watch - before.watch).toBeGreaterThanOrEqual(3); // a watch created for every wait
    expect(await eventually(async () => (await metrics()).watchers === base, 3_000)).toBe(true);
  });

  it('no lost wake-up: a release between the busy answer and the subscription fires at once', async () => {
    const k = key('cursor');
    const h = backend();
    const w = backend();
    const hold = await h.acquire(request(k, 'holder'));
    const session = await w.sessions!.open(10_000);
    const busy = await w.acquire(request(k, 'w', { queue: true, session: session.id }));
    if (hold.granted) await h.release({ key: k, owner: 'holder', token: hold.token, mode: 'exclusive' });
    let woken = false;
    if (!busy.granted) await w.subscribe!(k, () => (woken = true), busy.cursor);
    expect(await eventually(() => woken, 5_000)).toBe(true);
  });

  it('an operator revoking the session lease aborts every lease of that session', async () => {
    const l = locks();
    const held = await Promise.all([0, 1, 2].map((i) => l.acquire(key(`revoke${i}`), { ttlMs: 1_000 })));
    const [kv] = await raw(held[0]!.key);
    await etcd.leaseClient.leaseRevoke({ ID: kv!.lease });
    expect(await eventually(() => held.every((h) => h.signal.aborted), 3_000)).toBe(true);
    expect(held.map((h) => (h.signal.reason as { reason: string }).reason)).toEqual(['session-lost', 'session-lost', 'session-lost']);
  });

  it('a key deleted by hand is noticed at the next renewal of a lock with its own lease', async () => {
    const l = locks();
    const lease = await l.acquire(key('deleted'), { ttlMs: 3_000, autoRenew: false });
    await etcd.delete().prefix(new KeyLayout(prefix, lease.key).base);
    await expect(lease.renew()).rejects.toMatchObject({ code: 'LEASE_LOST', reason: 'not-held' });
    expect(lease.signal.aborted).toBe(true);
  });

  it('a client passed in is used and left open', async () => {
    const client = new Etcd3({ hosts: cluster.endpoints });
    try {
      const b = etcdBackend({ client, prefix, minTtlMs: 1_000 });
      const l = new Locks({ backend: b });
      const lease = await l.acquire(key('client'), { ttlMs: 1_000 });
      expect(lease.token).toBeGreaterThan(0n);
      await l.close();
      expect((await client.get(`${prefix}nothing`).exec()).kvs).toEqual([]);
    } finally {
      client.close();
    }
  });

  it('a client passed in that its owner closed: calls reject with ClosedError (CLOSED), not INVALID_ARGUMENT', async () => {
    const client = new Etcd3({ hosts: cluster.endpoints });
    const l = new Locks({ backend: etcdBackend({ client, prefix, minTtlMs: 1_000 }) });
    opened.push(l);
    client.close();
    const error = await l.tryAcquire(key('closed-client'), { ttlMs: 1_000 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ClosedError);
    expect(error).toMatchObject({ code: 'CLOSED', retryable: false, message: 'this etcd client was closed' });
  });
});

describe('etcd backend while etcd is down', () => {
  let cluster: Cluster;
  beforeAll(async () => {
    cluster = await startCluster({ members: 1, heartbeatMs: 50, electionMs: 500 });
  });
  afterAll(async () => {
    await cluster?.stop();
  });

  it('a broken lock watch wakes every waiter that follows on it, to ask again', async () => {
    const h = etcdBackend({ hosts: cluster.endpoints, requestTimeoutMs: 300, minTtlMs: 1_000 });
    const w = etcdBackend({ hosts: cluster.endpoints, requestTimeoutMs: 300, minTtlMs: 1_000 });
    try {
      const k = uniqueName('broken-watch');
      const req = (owner: string, extra: Partial<AcquireRequest> = {}): AcquireRequest => ({
        key: k,
        owner,
        mode: 'exclusive',
        ttlMs: 10_000,
        lockDelayMs: 0,
        holder: owner,
        queue: false,
        queueTtlMs: 2_000,
        ...extra,
      });
      expect((await h.acquire(req('h'))).granted).toBe(true);
      const session = (await w.sessions!.open(10_000)).id;
      const calls: Record<string, (HandOff | undefined)[]> = { w1: [], w2: [] };
      const unsubscribes: (() => void)[] = [];
      for (const owner of ['w1', 'w2']) {
        // two waiters of one client on one lock: they follow on one watch
        const busy = await w.acquire(req(owner, { queue: true, session }));
        if (busy.granted) throw new Error(`${owner} was granted`);
        unsubscribes.push(await w.subscribe!(k, (x) => calls[owner]!.push(x), busy.cursor));
      }
      await sleep(100);
      expect(calls).toEqual({ w1: [], w2: [] });
      await cluster.members[0]!.kill();
      expect(await eventually(() => calls.w1!.length > 0 && calls.w2!.length > 0, 5_000)).toBe(true);
      expect(calls).toEqual({ w1: [undefined], w2: [undefined] }); // told to ask, never handed a grant
      for (const u of unsubscribes) u();
    } finally {
      cluster.members[0]!.start();
      await cluster.waitHealthy();
      await Promise.allSettled([h.close(), w.close()]);
    }
  });

  it('rejects with BackendUnavailableError, and works again once etcd is back', async () => {
    const b = etcdBackend({ hosts: cluster.endpoints, requestTimeoutMs: 300, minTtlMs: 1_000 });
    const locks = new Locks({ backend: b, operationTimeoutMs: 3_000 });
    try {
      const k = uniqueName('down');
      await (await locks.acquire(k, { ttlMs: 1_000 })).release();
      await cluster.members[0]!.kill();
      const error = await b
        .acquire({ key: k, owner: 'o', mode: 'exclusive', ttlMs: 1_000, lockDelayMs: 0, holder: 'h', queue: false, queueTtlMs: 2_000 })
        .catch((e: unknown) => e);
      expect(error).toBeInstanceOf(BackendUnavailableError);
      expect((error as BackendUnavailableError).retryable).toBe(true);
      await expect(locks.tryAcquire(k, { ttlMs: 1_000 })).rejects.toBeInstanceOf(BackendUnavailableError);
      cluster.members[0]!.start();
      await cluster.waitHealthy();
      const lease = await locks.acquire(k, { ttlMs: 1_000, waitMs: 10_000 });
      expect(lease.held).toBe(true);
    } finally {
      await locks.close();
    }
  });
});

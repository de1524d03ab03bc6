/**
 * Wake-ups on MySQL / MariaDB, which cannot push: one poller per backend instance, one statement
 * per round for all the keys its waiters wait for, only while someone waits; changes made through
 * the instance itself told at once; `watch` for observers on the same poller. Some tests count the
 * statements a pool sends (its poll rounds are the subject); one measures a hand-off.
 */
import mysql from 'mysql2/promise';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { AcquireResult, Backend } from '../../src/core/backend.js';
import { Locks } from '../../src/core/locks.js';
import { mysqlBackend } from '../../src/mysql/index.js';
import { acquireRequest, eventually, MYSQL_URL, sleep, uniqueName } from '../helpers/env.js';
import { dropLeaseTables, recordingPool } from './support.js';

const table = uniqueName('lh_watch');
let admin: mysql.Pool;
let opened: { close(): Promise<void> }[] = [];

function track<T extends { close(): Promise<void> }>(thing: T): T {
  opened.push(thing);
  return thing;
}

/** A backend of its own pool (as another process would have), `pollMs` as given. */
const connect = (pollMs?: number): Backend => track(mysqlBackend({ uri: MYSQL_URL, table, poolSize: 2, ...(pollMs !== undefined && { pollMs }) }));

/** A backend on a recording pool: the statements its poller sends can be counted. */
function recorded(pollMs: number): { backend: Backend; polls: () => number; acquires: () => number } {
  const inner = mysql.createPool({ uri: MYSQL_URL, connectionLimit: 2 });
  track({ close: () => inner.end() });
  const { pool, statements } = recordingPool(inner);
  const backend = track(mysqlBackend({ pool, table, pollMs }));
  return {
    backend,
    polls: () => statements.filter((s) => s.includes('AS live')).length,
    acquires: () => statements.filter((s) => s.startsWith('CALL') && s.includes('_acquire')).length,
  };
}

function busyOf(result: AcquireResult): Extract<AcquireResult, { granted: false }> {
  if (result.granted) throw new Error('expected a busy answer');
  return result;
}

function tokenOf(result: AcquireResult): bigint {
  if (!result.granted) throw new Error('expected a grant');
  return result.token;
}

beforeAll(async () => {
  admin = mysql.createPool({ uri: MYSQL_URL, connectionLimit: 2 });
  const setup = mysqlBackend({ uri: MYSQL_URL, table, poolSize: 1 });
  await setup.inspect(''); // creates the tables
  await setup.close();
});

afterEach(async () => {
  await Promise.allSettled(opened.map((o) => o.close()));
  opened = [];
});

afterAll(async () => {
  await admin.end();
  await dropLeaseTables(table);
});

describe('mysql wake-ups: subscribe', () => {
  it('a release through the same instance wakes its own waiter at once, long before the next poll round', async () => {
    const backend = connect(60_000); // no round would come within the test
    const t = tokenOf(await backend.acquire(acquireRequest('local', 'holder')));
    const busy = busyOf(await backend.acquire(acquireRequest('local', 'waiter', { queue: true })));
    let woken = 0;
    const off = await backend.subscribe!('local', () => woken++, busy.cursor);
    await sleep(100);
    expect(woken).toBe(0);
    await backend.release({ key: 'local', owner: 'holder', token: t, mode: 'exclusive' });
    expect(woken).toBe(1);
    off();
  });

  it('a release by another instance wakes the waiter at the next poll round, and only then (control: a poller that never comes)', async () => {
    const holder = connect();
    const fast = connect(10);
    const slow = connect(60_000);
    const t = tokenOf(await holder.acquire(acquireRequest('remote', 'holder')));
    const woken = { fast: 0, slow: 0 };
    const busyFast = busyOf(await fast.acquire(acquireRequest('remote', 'w-fast', { queue: true })));
    const busySlow = busyOf(await slow.acquire(acquireRequest('remote', 'w-slow', { queue: true })));
    const offs = [await fast.subscribe!('remote', () => woken.fast++, busyFast.cursor), await slow.subscribe!('remote', () => woken.slow++, busySlow.cursor)];
    await sleep(100);
    expect(woken).toEqual({ fast: 0, slow: 0 }); // nothing changed: no wake-up
    await holder.release({ key: 'remote', owner: 'holder', token: t, mode: 'exclusive' });
    expect(await eventually(() => woken.fast === 1, 2_000)).toBe(true);
    await sleep(200);
    expect(woken).toEqual({ fast: 1, slow: 0 });
    for (const off of offs) off();
  });

  it('no lost wake-up: a change between the busy answer and the subscription is told at the first round', async () => {
    const holder = connect();
    const waiter = connect(10);
    const t = tokenOf(await holder.acquire(acquireRequest('gap', 'holder')));
    const busy = busyOf(await waiter.acquire(acquireRequest('gap', 'waiter', { queue: true })));
    await holder.release({ key: 'gap', owner: 'holder', token: t, mode: 'exclusive' }); // before the waiter subscribes
    let woken = 0;
    const off = await waiter.subscribe!('gap', () => woken++, busy.cursor);
    expect(await eventually(() => woken === 1, 2_000)).toBe(true);
    off();
  });

  it('no herd: N waiters in N instances; a release wakes only the head, and each is woken once, granted in queue order', async () => {
    const n = 5;
    const holder = connect();
    const t = tokenOf(await holder.acquire(acquireRequest('herd', 'holder')));
    const waiters = Array.from({ length: n }, () => recorded(10));
    const woken = new Array<number>(n).fill(0);
    const order: number[] = [];
    const ask = (i: number) => waiters[i]!.backend.acquire(acquireRequest('herd', `w${i}`, { queue: true, queueTtlMs: 30_000 }));
    const offs: (() => void)[] = [];
    for (let i = 0; i < n; i++) {
      const busy = busyOf(await ask(i));
      offs.push(
        await waiters[i]!.backend.subscribe!(
          'herd',
          () => {
            woken[i]!++;
            void ask(i).then(async (r) => {
              if (!r.granted) return;
              offs[i]!();
              order.push(i);
              await waiters[i]!.backend.release({ key: 'herd', owner: `w${i}`, token: r.token, mode: 'exclusive' });
            });
          },
          busy.cursor,
        ),
      );
    }
    await sleep(100);
    expect(woken).toEqual(new Array(n).fill(0));
    const before = waiters.map((w) => w.acquires());
    await holder.release({ key: 'herd', owner: 'holder', token: t, mode: 'exclusive' });
    expect(await eventually(() => order.length === n, 10_000)).toBe(true);
    await sleep(100); // any late wake-up would show
    expect(order).toEqual([...Array(n).keys()]);
    expect(woken).toEqual(new Array(n).fill(1)); // before: every waiter woken by every release
    // one acquire CALL each for its grant (two if the backend retried it after a deadlock); before: waiter i asked i + 1 times
    const calls = waiters.map((w, i) => w.acquires() - before[i]!);
    expect(calls.every((c) => c >= 1 && c <= 2)).toBe(true);
    expect(calls.reduce((a, b) => a + b, 0)).toBeLessThan(n + n / 2);
    for (const off of offs) off();
  });

  it('no lost wake-up: the head waiter passed over for gave up without a word (its place ran out): the next is woken then', async () => {
    const holder = connect();
    const t = tokenOf(await holder.acquire(acquireRequest('ranout', 'holder')));
    const crashed = connect();
    busyOf(await crashed.acquire(acquireRequest('ranout', 'crashed', { queue: true, queueTtlMs: 600 }))); // never asks again
    const next = connect(10);
    const busy = busyOf(await next.acquire(acquireRequest('ranout', 'next', { queue: true, queueTtlMs: 30_000 })));
    let woken = 0;
    const off = await next.subscribe!('ranout', () => woken++, busy.cursor);
    await holder.release({ key: 'ranout', owner: 'holder', token: t, mode: 'exclusive' });
    await sleep(200);
    expect(woken).toBe(0); // the release lets the head go, not us
    expect(await eventually(() => woken === 1, 3_000)).toBe(true); // its place ran out (nothing written): our turn
    expect(tokenOf(await next.acquire(acquireRequest('ranout', 'next', { queue: true, queueTtlMs: 30_000 })))).toBeGreaterThan(t);
    off();
  });

  it('shared waiters at the head of the queue are woken together, an exclusive one behind them and whoever is behind it are not', async () => {
    const holder = connect();
    const t = tokenOf(await holder.acquire(acquireRequest('run', 'holder')));
    const modes = ['shared', 'shared', 'exclusive', 'shared'] as const;
    const woken = modes.map(() => 0);
    const offs: (() => void)[] = [];
    for (const [i, mode] of modes.entries()) {
      const b = connect(10);
      const busy = busyOf(await b.acquire(acquireRequest('run', `w${i}`, { mode, queue: true, queueTtlMs: 30_000 })));
      offs.push(await b.subscribe!('run', () => woken[i]!++, busy.cursor));
    }
    await holder.release({ key: 'run', owner: 'holder', token: t, mode: 'exclusive' });
    expect(await eventually(() => woken[0] === 1 && woken[1] === 1, 2_000)).toBe(true);
    await sleep(200);
    expect(woken).toEqual([1, 1, 0, 0]);
    for (const off of offs) off();
  });

  it('one statement per round for all the keys an instance waits for; no rounds once nobody waits', async () => {
    const holder = connect();
    const { backend, polls } = recorded(20);
    const keys = Array.from({ length: 5 }, (_, i) => `many-${i}`);
    const offs: (() => void)[] = [];
    for (const k of keys) {
      await holder.acquire(acquireRequest(k, 'holder'));
      const busy = busyOf(await backend.acquire(acquireRequest(k, 'waiter', { queue: true })));
      offs.push(await backend.subscribe!(k, () => {}, busy.cursor));
    }
    const before = polls();
    await sleep(400);
    const rounds = polls() - before;
    expect(rounds).toBeGreaterThan(3); // rounds run (one every 20 ms at best)
    expect(rounds).toBeLessThanOrEqual(21); // one statement each, not one per key (5 keys would make it ~100)
    for (const off of offs) off();
    await sleep(50); // a round in flight ends
    const idle = polls();
    await sleep(300);
    expect(polls()).toBe(idle);
  });

  it('through Locks: a hand-off between two processes takes about pollMs/2 plus round trips (measured, printed)', async () => {
    const a = track(new Locks({ backend: connect() }));
    const b = track(new Locks({ backend: connect() }));
    const handOffs: number[] = [];
    for (let i = 0; i < 25; i++) {
      const held = await a.acquire('hand-off', { ttlMs: 10_000 });
      const waiting = b.acquire('hand-off', { ttlMs: 10_000, waitMs: 10_000 });
      await sleep(40 + Math.random() * 60);
      const released = performance.now();
      await held.release();
      const next = await waiting;
      handOffs.push(performance.now() - released);
      await next.release();
    }
    handOffs.sort((x, y) => x - y);
    const p50 = handOffs[12]!;
    console.log(`mysql hand-off with pollMs 10: p50 ${p50.toFixed(1)} ms, max ${handOffs.at(-1)!.toFixed(1)} ms (release call to grant)`);
    // Core's own fallback re-check of a subscribed waiter comes after 500 ms: well below it, the poller woke the waiter.
    expect(p50).toBeLessThan(250);
  });
});

describe('mysql wake-ups: watch', () => {
  it("a watched key's grant and release by another instance fire watch (the election case)", async () => {
    const watcher = connect();
    const other = connect();
    let calls = 0;
    const stop = await watcher.watch!('leader', () => calls++);
    const t = tokenOf(await other.acquire(acquireRequest('leader', 'a')));
    expect(await eventually(() => calls >= 1, 2_000)).toBe(true);
    const afterGrant = calls;
    await other.release({ key: 'leader', owner: 'a', token: t, mode: 'exclusive' });
    expect(await eventually(() => calls > afterGrant, 2_000)).toBe(true);
    stop();
    const ended = calls;
    await other.acquire(acquireRequest('leader', 'b'));
    await sleep(300);
    expect(calls).toBe(ended);
  });

  it("a holder's expiry is told (the live holder count drops by the server's clock); a renewed holder is not", async () => {
    const watcher = connect();
    const other = connect();
    const t = tokenOf(await other.acquire(acquireRequest('exp', 'a', { ttlMs: 600 })));
    let calls = 0;
    const stop = await watcher.watch!('exp', () => calls++);
    await sleep(400);
    expect((await other.renew({ key: 'exp', owner: 'a', token: t, ttlMs: 1_500, mode: 'exclusive' })).renewed).toBe(true);
    await sleep(500); // past the first expiry: the holder was renewed
    expect(calls).toBe(0);
    expect(await eventually(() => calls >= 1, 3_000)).toBe(true); // it expires for good
    stop();
  });

  it('an idle instance with nobody watching sends nothing; a watcher alone polls at the slower watch cadence', async () => {
    const { backend, polls } = recorded(10);
    await backend.inspect('');
    const idle = polls();
    await sleep(200);
    expect(polls()).toBe(idle);
    const stop = await backend.watch!('quiet', () => {});
    const before = polls();
    await sleep(600);
    const rounds = polls() - before;
    expect(rounds).toBeGreaterThanOrEqual(2);
    expect(rounds).toBeLessThanOrEqual(8); // every 100 ms, not every 10 ms
    stop();
  });

  it('election observe on mysql sees each new leader', async () => {
    const a = track(new Locks({ backend: connect(), holderName: 'a' }));
    const b = track(new Locks({ backend: connect(), holderName: 'b' }));
    const stop = new AbortController();
    const seen: (string | null)[] = [];
    const observing = (async () => {
      for await (const leader of b.election('elect').observe({ signal: stop.signal })) seen.push(leader?.value ?? null);
    })();
    try {
      expect(await eventually(() => seen.length === 1, 2_000)).toBe(true);
      const lease = await a.election('elect').campaign({ value: 'node-a' });
      expect(await eventually(() => seen.at(-1) === 'node-a', 1_500)).toBe(true);
      await lease.release();
      expect(await eventually(() => seen.at(-1) === null, 1_500)).toBe(true);
    } finally {
      stop.abort();
      await observing;
    }
  });
});

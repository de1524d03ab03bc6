import { describe, expect, it } from 'vitest';
import { acquireAs } from '../../src/core/acquire-as.js';
import type { Backend } from '../../src/core/backend.js';
import { AcquireTimeoutError } from '../../src/core/errors.js';
import { memoryBackend } from '../../src/memory/index.js';
import { eventually, sleep, uniqueName } from '../helpers/env.js';
import { acquirePath, http } from './helpers.js';
import { listeningServers, waitersOf } from './listening.js';

const { start, redis, backends } = listeningServers('fifo');

const POLL_MS = 300;

/**
 * A client that waits by short polls, as a script would: the same Idempotency-Key on every poll,
 * the next poll as soon as a 409 comes. Resolves with the grant once it has held it for `holdMs`
 * and released it; counts its polls.
 */
async function pollingWaiter(base: string, key: string, idempotencyKey: string, holdMs: number, polls: { n: number }, body: Record<string, unknown> = {}) {
  for (;;) {
    polls.n++;
    const got = await http(base, 'POST', acquirePath(key), { ttlMs: 30_000, waitMs: POLL_MS, ...body }, { 'idempotency-key': idempotencyKey });
    if (got.status === 409) continue;
    expect(got.status).toBe(200);
    await sleep(holdMs);
    expect((await http(base, 'DELETE', `/v1/leases/${got.body.lease}`)).status).toBe(204);
    return got.body;
  }
}

describe.each(backends)('FIFO across long polls over %s', (name, options) => {
  it('three waiters polling 300 ms at a key held 1.5 s are granted in arrival order, each poll keeping its place', async () => {
    const s = await start(options());
    const key = uniqueName('fifo');
    const held = await http(s.url, 'POST', acquirePath(key), { ttlMs: 30_000, label: 'holder' });
    expect(held.status).toBe(200);
    const order: string[] = [];
    const polls = { A: { n: 0 }, B: { n: 0 }, C: { n: 0 } };
    const run = (who: 'A' | 'B' | 'C') =>
      pollingWaiter(s.url, key, uniqueName(`waiter-${who}`), 400, polls[who]).then((grant) => {
        order.push(who);
        return grant;
      });
    const heldSince = performance.now();
    // Arrivals a third of a poll apart: if each poll's place ended with it, the queue would rotate
    // as the polls end, and which of them is first at the release would be chance.
    const a = run('A');
    expect(await eventually(async () => (await waitersOf(s.url, key)) === 1, 10_000)).toBe(true);
    await sleep(POLL_MS / 3);
    const b = run('B');
    expect(await eventually(async () => (await waitersOf(s.url, key)) === 2, 10_000)).toBe(true);
    await sleep(POLL_MS / 3);
    const c = run('C');
    expect(await eventually(async () => (await waitersOf(s.url, key)) === 3, 10_000)).toBe(true);
    await sleep(Math.max(0, 1_500 - (performance.now() - heldSince)));
    // Released just after A's poll ran out and A asked again: the moment a place given up with each
    // poll would put A behind B and C.
    const seen = polls.A.n;
    expect(await eventually(() => polls.A.n > seen, 10_000, 1)).toBe(true);
    expect((await http(s.url, 'DELETE', `/v1/leases/${held.body.lease}`)).status).toBe(204);
    const grants = await Promise.all([a, b, c]);
    expect(order, `${name}: grants in arrival order`).toEqual(['A', 'B', 'C']);
    // Each asked again after its polls ran out (the test is about that), and the tokens follow the order.
    expect(polls.A.n).toBeGreaterThan(1);
    expect(polls.C.n).toBeGreaterThan(1);
    const tokens = grants.map((g) => BigInt(g.token as string));
    expect(tokens[0]! < tokens[1]! && tokens[1]! < tokens[2]!).toBe(true);
    expect(await waitersOf(s.url, key)).toBe(0);
  });

  it('a waiter polling 300 ms keeps its place ahead of two later ones each waiting in one long poll', async () => {
    const s = await start(options());
    const key = uniqueName('mixed');
    const held = await http(s.url, 'POST', acquirePath(key), { ttlMs: 30_000 });
    const order: string[] = [];
    const polls = { n: 0 };
    const a = pollingWaiter(s.url, key, uniqueName('waiter-A'), 0, polls).then(() => order.push('A'));
    expect(await eventually(async () => (await waitersOf(s.url, key)) === 1, 10_000)).toBe(true);
    const longPoll = (who: string) =>
      http(s.url, 'POST', acquirePath(key), { ttlMs: 30_000, waitMs: 30_000 }, { 'idempotency-key': uniqueName(who) }).then(async (got) => {
        expect(got.status).toBe(200);
        order.push(who);
        await http(s.url, 'DELETE', `/v1/leases/${got.body.lease}`);
      });
    const b = longPoll('B');
    expect(await eventually(async () => (await waitersOf(s.url, key)) === 2, 10_000)).toBe(true);
    const c = longPoll('C');
    expect(await eventually(async () => (await waitersOf(s.url, key)) === 3, 10_000)).toBe(true);
    // A's polls run out (several times) while B and C wait in theirs.
    expect(await eventually(async () => polls.n >= 3, 10_000)).toBe(true);
    expect((await http(s.url, 'DELETE', `/v1/leases/${held.body.lease}`)).status).toBe(204);
    await Promise.all([a, b, c]);
    expect(order).toEqual(['A', 'B', 'C']);
  });

  it('a poll that runs out keeps its place for the next poll of its Idempotency-Key: a newcomer that will not wait is refused meanwhile', async () => {
    const s = await start(options());
    const key = uniqueName('kept');
    const held = await http(s.url, 'POST', acquirePath(key), { ttlMs: 30_000 });
    const idem = uniqueName('waiter');
    expect((await http(s.url, 'POST', acquirePath(key), { waitMs: POLL_MS }, { 'idempotency-key': idem })).status).toBe(409);
    expect((await http(s.url, 'DELETE', `/v1/leases/${held.body.lease}`)).status).toBe(204);
    // The key is free, but the place (alive for the queue ttl, 2 s) is ahead of anyone who does not wait.
    const newcomer = await http(s.url, 'POST', acquirePath(key), {});
    const again = await http(s.url, 'POST', acquirePath(key), { waitMs: 5_000 }, { 'idempotency-key': idem });
    expect(again.status).toBe(200);
    expect(newcomer.status).toBe(409);
  });
});

describe('queue places that are not kept', () => {
  it('a waiter that disconnects gives its place up at once, Idempotency-Key or not', async () => {
    const s = await start({ backend: memoryBackend() });
    const held = await http(s.url, 'POST', acquirePath('k'), {});
    const stop = new AbortController();
    const waiting = http(s.url, 'POST', acquirePath('k'), { waitMs: 30_000 }, { 'idempotency-key': 'gone-1' }, stop.signal).catch((e: unknown) => e);
    expect(await eventually(async () => (await waitersOf(s.url, 'k')) === 1, 10_000)).toBe(true);
    stop.abort();
    expect(await waiting).toBeInstanceOf(Error);
    expect(await eventually(async () => (await waitersOf(s.url, 'k')) === 0, 10_000)).toBe(true);
    await http(s.url, 'DELETE', `/v1/leases/${held.body.lease}`);
    expect((await http(s.url, 'POST', acquirePath('k'), {})).status).toBe(200);
  });

  it('without an Idempotency-Key a poll that runs out leaves no place (nobody could ask again for it)', async () => {
    const s = await start({ backend: memoryBackend() });
    const held = await http(s.url, 'POST', acquirePath('k'), {});
    expect((await http(s.url, 'POST', acquirePath('k'), { waitMs: POLL_MS })).status).toBe(409);
    expect(await waitersOf(s.url, 'k')).toBe(0);
    await http(s.url, 'DELETE', `/v1/leases/${held.body.lease}`);
    expect((await http(s.url, 'POST', acquirePath('k'), {})).status).toBe(200);
  });

  it('Redis: a session waiter’s place ends with its poll, so the key is never handed to the session of a client that gave up', async () => {
    const s = await start({ backend: redis() });
    const key = uniqueName('handoff');
    const held = await http(s.url, 'POST', acquirePath(key), { ttlMs: 30_000 });
    const opened = await http(s.url, 'POST', '/v1/sessions', { ttlMs: 30_000 });
    expect(opened.status).toBe(201);
    const polled = await http(s.url, 'POST', acquirePath(key), { session: opened.body.session, waitMs: POLL_MS }, { 'idempotency-key': uniqueName('w') });
    expect(polled.status).toBe(409);
    expect(await waitersOf(s.url, key)).toBe(0);
    expect((await http(s.url, 'DELETE', `/v1/leases/${held.body.lease}`)).status).toBe(204);
    await sleep(200);
    const state = (await http(s.url, 'GET', `/v1/locks?prefix=${encodeURIComponent(key)}`)).body.locks as { holders: unknown[] }[];
    expect(state.flatMap((k) => k.holders)).toEqual([]);
    expect((await http(s.url, 'DELETE', `/v1/sessions/${opened.body.session}`)).status).toBe(204);
  });

  it('memory with sessions: session waiters keep their places too (no hand-off there), in arrival order', async () => {
    const s = await start({ backend: memoryBackend({ sessions: true }) });
    const key = uniqueName('sessions');
    const held = await http(s.url, 'POST', acquirePath(key), { ttlMs: 30_000 });
    const session = (await http(s.url, 'POST', '/v1/sessions', { ttlMs: 30_000 })).body.session;
    const order: string[] = [];
    const run = (who: string) => pollingWaiter(s.url, key, uniqueName(who), 300, { n: 0 }, { session }).then(() => order.push(who));
    const a = run('A');
    expect(await eventually(async () => (await waitersOf(s.url, key)) === 1, 10_000)).toBe(true);
    const b = run('B');
    expect(await eventually(async () => (await waitersOf(s.url, key)) === 2, 10_000)).toBe(true);
    await sleep(1_000);
    expect((await http(s.url, 'DELETE', `/v1/leases/${held.body.lease}`)).status).toBe(204);
    await Promise.all([a, b]);
    expect(order).toEqual(['A', 'B']);
    await http(s.url, 'DELETE', `/v1/sessions/${session}`);
  });
});

describe('acquireAs: a grant answered after the wait ran out', () => {
  /** A memory backend whose acquire answers come `delayMs` after the request took effect: every grant arrives late. */
  const slowAnswers = (backend: Backend, delayMs: number): Backend => ({
    ...backend,
    acquire: async (req) => {
      const answer = await backend.acquire(req);
      await sleep(delayMs);
      return answer;
    },
  });
  const holdersOf = async (backend: Backend, key: string) => (await backend.inspect(key)).find((k) => k.key === key)?.holders ?? [];

  it('with keepPlaceOnTimeout it is kept for the owner’s next call (same token), held meanwhile for no longer than the queue ttl', async () => {
    const backend = memoryBackend();
    const wait = acquireAs({
      backend: slowAnswers(backend, 600),
      key: 'k',
      owner: 'w',
      holder: 'w',
      keepPlaceOnTimeout: true,
      options: { ttlMs: 30_000, waitMs: 200 },
    });
    await expect(wait).rejects.toBeInstanceOf(AcquireTimeoutError);
    // The grant was made at once; its answer comes 600 ms later, and is kept, its 30 s ttl cut to the queue ttl (2 s).
    expect(
      await eventually(async () => {
        const [h] = await holdersOf(backend, 'k');
        return h !== undefined && h.expiresInMs <= 2_000;
      }, 5_000),
    ).toBe(true);
    const [late] = await holdersOf(backend, 'k');
    const next = await acquireAs({ backend, key: 'k', owner: 'w', holder: 'w', keepPlaceOnTimeout: true, options: { ttlMs: 30_000, waitMs: 200 } });
    expect(next).toMatchObject({ granted: true, token: late!.token });
    expect((await holdersOf(backend, 'k'))[0]!.expiresInMs).toBeGreaterThan(2_000);
    await backend.close();
  });

  it('an owner that never asks again holds it no longer than the queue ttl', async () => {
    const backend = memoryBackend();
    await expect(
      acquireAs({ backend: slowAnswers(backend, 600), key: 'k', owner: 'w', holder: 'w', keepPlaceOnTimeout: true, options: { ttlMs: 30_000, waitMs: 200 } }),
    ).rejects.toBeInstanceOf(AcquireTimeoutError);
    expect(await eventually(async () => (await holdersOf(backend, 'k')).length === 1, 5_000)).toBe(true);
    expect(await eventually(async () => (await holdersOf(backend, 'k')).length === 0, 10_000)).toBe(true);
    await backend.close();
  });

  it.each([
    ['without keepPlaceOnTimeout', { keepPlaceOnTimeout: false }, {}],
    ['with a lock-delay (an expiry would start it)', { keepPlaceOnTimeout: true }, { lockDelayMs: 1_000 }],
  ])('%s it is given back', async (_name, extra, options) => {
    const backend = memoryBackend();
    await expect(
      acquireAs({ backend: slowAnswers(backend, 600), key: 'k', owner: 'w', holder: 'w', ...extra, options: { ttlMs: 30_000, waitMs: 200, ...options } }),
    ).rejects.toBeInstanceOf(AcquireTimeoutError);
    await sleep(700);
    expect(await eventually(async () => (await holdersOf(backend, 'k')).length === 0, 5_000)).toBe(true);
    const state = (await backend.inspect('k')).find((k) => k.key === 'k');
    expect(state?.lockDelayRemainingMs ?? 0).toBe(0); // released, not expired
    await backend.close();
  });
});

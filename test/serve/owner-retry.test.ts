import { describe, expect, it } from 'vitest';
import type { Backend } from '../../src/core/backend.js';
import { memoryBackend } from '../../src/memory/index.js';
import { eventually, sleep, uniqueName } from '../helpers/env.js';
import { acquirePath, http } from './helpers.js';
import { listeningServers } from './listening.js';

const { start, backends } = listeningServers('retry');

type Holders = { token: string; expiresInMs: number }[];
const stateOf = async (base: string, key: string): Promise<{ waiters: number; holders: Holders }> => {
  const locks = (await http(base, 'GET', `/v1/locks?prefix=${encodeURIComponent(key)}`)).body.locks as { key: string; waiters: number; holders: Holders }[];
  return locks.find((k) => k.key === key) ?? { waiters: 0, holders: [] };
};

/** A request whose connection the test can cut, as a client that gave up on it does. */
function cuttable(base: string, key: string, body: Record<string, unknown>, idempotencyKey: string) {
  const cut = new AbortController();
  const answer = http(base, 'POST', acquirePath(key), body, { 'idempotency-key': idempotencyKey }, cut.signal).catch((e: unknown) => e);
  return { answer, cut: () => cut.abort(new Error('the client gave up on this request')) };
}

describe.each(backends)('a retry with the same Idempotency-Key while the first request still waits, over %s', (name, options) => {
  it('takes the wait over: the first ends with 409 SUPERSEDED, its place goes on with the retry, ahead of a later waiter; cutting the first connection then changes nothing', async () => {
    const s = await start(options());
    const key = uniqueName('retry');
    const held = await http(s.url, 'POST', acquirePath(key), { ttlMs: 30_000, label: 'holder' });
    expect(held.status).toBe(200);
    const idem = uniqueName('client-k');
    const first = cuttable(s.url, key, { ttlMs: 30_000, waitMs: 20_000, label: 'k' }, idem);
    expect(await eventually(async () => (await stateOf(s.url, key)).waiters === 1, 10_000)).toBe(true);
    const later = http(s.url, 'POST', acquirePath(key), { ttlMs: 30_000, waitMs: 20_000, label: 'later' }, { 'idempotency-key': uniqueName('client-w') });
    expect(await eventually(async () => (await stateOf(s.url, key)).waiters === 2, 10_000)).toBe(true);
    // The client's retry, its first request still open.
    const retry = http(s.url, 'POST', acquirePath(key), { ttlMs: 30_000, waitMs: 20_000, label: 'k' }, { 'idempotency-key': idem });
    await sleep(300); // the retry waits now (before: beside the first, one owner waiting twice)
    first.cut(); // the client's side of the first request ends: before, its end cancelled the owner's place
    await sleep(300);
    expect((await stateOf(s.url, key)).waiters, `${name}: the owner's place and the later waiter's`).toBe(2);
    expect((await http(s.url, 'DELETE', `/v1/leases/${held.body.lease}`)).status).toBe(204);
    const got = await retry;
    expect(got.status, `${name}: the retry is served first (the first arrival's place)`).toBe(200);
    expect((await stateOf(s.url, key)).holders.map((h) => h.token)).toEqual([got.body.token]);
    expect((await http(s.url, 'DELETE', `/v1/leases/${got.body.lease}`)).status).toBe(204);
    const next = await later;
    expect(next.status).toBe(200);
    expect(BigInt(next.body.token as string)).toBeGreaterThan(BigInt(got.body.token as string));
    const firstAnswer = await first.answer;
    // The first was answered before its connection was cut: 409 SUPERSEDED (a cut before the answer would be an AbortError).
    expect(firstAnswer).toMatchObject({ status: 409, body: { code: 'SUPERSEDED' } });
  });
});

describe('a retry with the same Idempotency-Key while the first request’s backend call is still out', () => {
  it('the first call’s late grant is not given back under the retry: the retry’s lease stays held', async () => {
    const inner = memoryBackend();
    let gate: (() => void) | undefined;
    let gated = 0;
    const backend: Backend = {
      ...inner,
      // The first acquire's answer is held back (a slow coordinator), the others go through.
      acquire: async (req) => {
        if (gated++ === 0) await new Promise<void>((resolve) => (gate = resolve));
        return inner.acquire(req);
      },
    };
    const s = await start({ backend });
    const key = uniqueName('late');
    const idem = uniqueName('client-k');
    const first = cuttable(s.url, key, { ttlMs: 30_000 }, idem);
    expect(await eventually(() => gate !== undefined, 10_000)).toBe(true);
    const retry = http(s.url, 'POST', acquirePath(key), { ttlMs: 30_000 }, { 'idempotency-key': idem });
    await sleep(200);
    first.cut();
    await sleep(200);
    gate!(); // the first call is answered now: the owner is granted (or answered with its grant)
    const got = await retry;
    expect(got.status).toBe(200);
    await sleep(500); // a give-back of the first call's grant would have landed by now
    const [holder] = (await stateOf(s.url, key)).holders;
    expect(holder?.token, 'the retry’s lease is still held').toBe(got.body.token);
    expect(holder!.expiresInMs).toBeGreaterThan(20_000); // with the retry's ttl, not shortened
    const renewed = await http(s.url, 'POST', `/v1/leases/${got.body.lease}/renew`);
    expect(renewed.status).toBe(200);
  });
  it('the same Idempotency-Key on another key is another wait: it does not end the first', async () => {
    const s = await start({ backend: memoryBackend() });
    const [k1, k2] = [uniqueName('one'), uniqueName('two')];
    const held = await http(s.url, 'POST', acquirePath(k1), { ttlMs: 30_000, label: 'holder' });
    const idem = uniqueName('client-k');
    const waiting = http(s.url, 'POST', acquirePath(k1), { ttlMs: 30_000, waitMs: 20_000 }, { 'idempotency-key': idem });
    expect(await eventually(async () => (await stateOf(s.url, k1)).waiters === 1, 10_000)).toBe(true);
    const other = await http(s.url, 'POST', acquirePath(k2), { ttlMs: 30_000 }, { 'idempotency-key': idem });
    expect(other.status).toBe(200);
    expect((await stateOf(s.url, k1)).waiters).toBe(1); // still waiting
    expect((await http(s.url, 'DELETE', `/v1/leases/${held.body.lease}`)).status).toBe(204);
    expect((await waiting).status).toBe(200);
  });
});

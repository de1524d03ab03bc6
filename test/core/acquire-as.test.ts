/**
 * acquireAs: core's waiting loop run for an owner the caller chose (the lock service's acquire),
 * over the memory backend: the grant is the given owner's (the backend renews and releases it for
 * that owner only), a busy key ends with ACQUIRE_TIMEOUT naming the holder, a waiter is woken by a
 * release, an aborted wait leaves no queue place, a retry by the same owner gets the same grant back,
 * and a session the backend no longer knows ends the call with `sessionLost`.
 */
import { describe, expect, it } from 'vitest';
import { acquireAs } from '../../src/core/acquire-as.js';
import type { AcquireRequest, Backend, HandOff } from '../../src/core/backend.js';
import { AcquireTimeoutError, InvalidArgumentError } from '../../src/core/errors.js';
import { TypedEmitter, type LockEvents } from '../../src/core/events.js';
import { memoryBackend } from '../../src/memory/index.js';
import { eventually } from '../helpers/env.js';

const waiters = async (backend: Backend, key: string): Promise<number> => (await backend.inspect(key)).find((s) => s.key === key)?.waiters ?? 0;

describe('acquireAs', () => {
  it('grants to the given owner: the backend renews and releases it for that owner only', async () => {
    const backend = memoryBackend();
    const events = new TypedEmitter<LockEvents>();
    const acquired: LockEvents['acquired'][] = [];
    events.on('acquired', (e) => acquired.push(e));
    const r = await acquireAs({ backend, key: 'k', owner: 'owner-a', holder: 'svc-a', options: { ttlMs: 5_000 }, events });
    expect(r).toMatchObject({ granted: true, token: 1n, ttlMs: 5_000 });
    expect(acquired).toMatchObject([{ key: 'k', token: 1n, mode: 'exclusive', ttlMs: 5_000 }]);
    const [state] = await backend.inspect('k');
    expect(state?.holders).toMatchObject([{ holder: 'svc-a', token: 1n }]);
    expect(await backend.renew({ key: 'k', owner: 'someone-else', token: 1n, mode: 'exclusive', ttlMs: 5_000 })).toEqual({ renewed: false });
    expect(await backend.renew({ key: 'k', owner: 'owner-a', token: 1n, mode: 'exclusive', ttlMs: 5_000 })).toMatchObject({ renewed: true });
    await backend.release({ key: 'k', owner: 'owner-a', token: 1n, mode: 'exclusive' });
    expect((await backend.inspect('k'))[0]?.holders ?? []).toHaveLength(0);
  });

  it('waitMs 0 (the default): one attempt, ACQUIRE_TIMEOUT naming the holder, no queue place', async () => {
    const backend = memoryBackend();
    await acquireAs({ backend, key: 'k', owner: 'a', holder: 'svc-a' });
    const busy = acquireAs({ backend, key: 'k', owner: 'b', holder: 'svc-b' });
    await expect(busy).rejects.toBeInstanceOf(AcquireTimeoutError);
    await expect(busy).rejects.toMatchObject({ holder: 'svc-a' });
    expect(await waiters(backend, 'k')).toBe(0);
  });

  it('a waiter is woken by the holder’s release and gets the next token', async () => {
    const backend = memoryBackend();
    await acquireAs({ backend, key: 'k', owner: 'a', holder: 'svc-a' });
    const waiting = acquireAs({ backend, key: 'k', owner: 'b', holder: 'svc-b', options: { waitMs: 10_000 } });
    expect(await eventually(async () => (await waiters(backend, 'k')) === 1)).toBe(true);
    await backend.release({ key: 'k', owner: 'a', token: 1n, mode: 'exclusive' });
    await expect(waiting).resolves.toMatchObject({ granted: true, token: 2n });
    expect((await backend.inspect('k'))[0]?.holders).toMatchObject([{ holder: 'svc-b', token: 2n }]);
  });

  it('aborting the signal ends the wait with its reason and cancels the queue place', async () => {
    const backend = memoryBackend();
    await acquireAs({ backend, key: 'k', owner: 'a', holder: 'svc-a' });
    const stop = new AbortController();
    const waiting = acquireAs({ backend, key: 'k', owner: 'b', holder: 'svc-b', options: { waitMs: 30_000, signal: stop.signal } });
    expect(await eventually(async () => (await waiters(backend, 'k')) === 1)).toBe(true);
    const reason = new Error('client went away');
    stop.abort(reason);
    await expect(waiting).rejects.toBe(reason);
    expect(await eventually(async () => (await waiters(backend, 'k')) === 0)).toBe(true);
  });

  it('the closing signal ends the wait too', async () => {
    const backend = memoryBackend();
    await acquireAs({ backend, key: 'k', owner: 'a', holder: 'svc-a' });
    const closing = new AbortController();
    const waiting = acquireAs({ backend, key: 'k', owner: 'b', holder: 'svc-b', options: { waitMs: 30_000 }, closing: closing.signal });
    expect(await eventually(async () => (await waiters(backend, 'k')) === 1)).toBe(true);
    closing.abort(new Error('closing'));
    await expect(waiting).rejects.toThrow('closing');
  });

  it('a retry by the same owner gets its own grant back (same token), not a second lease', async () => {
    const backend = memoryBackend();
    const first = await acquireAs({ backend, key: 'k', owner: 'a', holder: 'svc-a' });
    const again = await acquireAs({ backend, key: 'k', owner: 'a', holder: 'svc-a' });
    expect(again).toEqual(first);
    expect((await backend.inspect('k'))[0]?.holders).toHaveLength(1);
  });

  it('with a session: the lease lives by it; a session the backend no longer knows ends the call with sessionLost', async () => {
    const backend = memoryBackend({ sessions: true });
    const { id } = await backend.sessions!.open(5_000);
    const r = await acquireAs({ backend, key: 'k', owner: 'a', holder: 'svc-a', session: id });
    expect(r).toMatchObject({ granted: true, token: 1n });
    await backend.sessions!.close(id);
    expect((await backend.inspect('k'))[0]?.holders ?? []).toHaveLength(0);
    await expect(acquireAs({ backend, key: 'k', owner: 'a', holder: 'svc-a', session: id, options: { waitMs: 5_000 } })).resolves.toEqual({
      granted: false,
      sessionLost: true,
    });
  });

  it('checks its input as the library does, naming the option', async () => {
    const backend = memoryBackend();
    await expect(acquireAs({ backend, key: '', owner: 'a', holder: 'x' })).rejects.toMatchObject({ argument: 'key' });
    await expect(acquireAs({ backend, key: 'k', owner: 'a', holder: 'x', options: { ttlMs: 1 } })).rejects.toMatchObject({ argument: 'options.ttlMs' });
    await expect(acquireAs({ backend, key: 'k', owner: '', holder: 'x' })).rejects.toBeInstanceOf(InvalidArgumentError);
    expect(await backend.inspect('')).toHaveLength(0);
  });
  /** A memory backend with sessions whose wake-ups the test sends itself, handing a grant over as a fair backend with sessions does (Redis, etcd). */
  async function handing() {
    const inner = memoryBackend({ sessions: true });
    const asks: AcquireRequest[] = [];
    let notify: ((handOff?: HandOff) => void) | undefined;
    const backend: Backend = {
      ...inner,
      // Busy answers carry a cursor, as a backend with wake-ups gives: no re-check right after subscribing.
      acquire: async (r) => {
        asks.push(r);
        const answer = await inner.acquire(r);
        return answer.granted ? answer : { ...answer, cursor: 'since-this-answer' };
      },
      subscribe: async (_key, onChange) => {
        notify = onChange;
        return () => (notify = undefined);
      },
    };
    const { id: session } = await inner.sessions!.open(60_000);
    await acquireAs({ backend: inner, key: 'k', owner: 'a', holder: 'svc-a' });
    const waiting = acquireAs({ backend, key: 'k', owner: 'b', holder: 'svc-b', session, options: { waitMs: 10_000 } });
    expect(await eventually(async () => (await waiters(inner, 'k')) === 1 && notify !== undefined)).toBe(true);
    await inner.release({ key: 'k', owner: 'a', token: 1n, mode: 'exclusive' });
    // The coordinator grants the head waiter's place itself and hands the grant to its wake-up.
    const granted = await inner.acquire(asks.at(-1)!);
    if (!granted.granted) throw new Error('expected the head waiter to be granted');
    return { asks, session, waiting, token: granted.token, hand: (h: HandOff) => notify?.(h) };
  }

  it('with a session: a grant the coordinator hands to that session is taken as it comes, without asking again', async () => {
    const h = await handing();
    const before = h.asks.length;
    h.hand({ token: h.token, session: h.session });
    await expect(h.waiting).resolves.toMatchObject({ granted: true, token: 2n });
    expect(h.asks.length).toBe(before); // no further acquire: one coordinator call less per hand-off
  });

  it('a hand-off bound to another session is not taken: the owner asks again and is answered with its grant', async () => {
    const h = await handing();
    const before = h.asks.length;
    h.hand({ token: h.token, session: 'someone-elses-session' });
    await expect(h.waiting).resolves.toMatchObject({ granted: true, token: 2n });
    expect(h.asks.length).toBe(before + 1);
  });
});

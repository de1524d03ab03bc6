/**
 * The ghost-holder scenario of issue 13, against a real server: a waiter whose acquire requests sit
 * in the network (a DelayProxy holds its client → server bytes) gives up when its waitMs runs out;
 * the held requests then reach the server. The key must go to whoever asks next when the holder
 * releases, never to the place of the waiter that gave up (nobody holds a Lease for it).
 */
import { expect } from 'vitest';
import type { Backend } from '../../src/core/backend.js';
import { AcquireTimeoutError } from '../../src/core/errors.js';
import { Locks } from '../../src/core/locks.js';
import { DelayProxy } from '../../src/verify/proxy.js';
import { eventually, sleep, uniqueName } from './env.js';

export interface LateWaiterSetup {
  /** The server the proxy forwards to. */
  readonly target: { host: string; port: number };
  /** A backend talking to the server directly. */
  direct(): Backend;
  /** A backend talking to the server through 127.0.0.1:`port`. */
  through(port: number): Backend;
}

export async function lateWaiterLeavesNoGhost(setup: LateWaiterSetup, options: { landMs: number }): Promise<void> {
  const proxy = await DelayProxy.start(setup.target);
  const holder = new Locks({ backend: setup.direct(), holderName: 'holder' });
  const slow = new Locks({ backend: setup.through(proxy.port), holderName: 'slow-waiter' });
  const third = new Locks({ backend: setup.direct(), holderName: 'third' });
  const key = uniqueName('late-waiter');
  try {
    // The slow client's connections, session and subscriptions are set up while the link is fine.
    await (await slow.acquire(`${key}/warm-up`, { ttlMs: 20_000 })).release();
    const lease = await holder.acquire(key, { ttlMs: 20_000 });

    proxy.hold();
    const error = await slow.acquire(key, { ttlMs: 20_000, waitMs: 1_000 }).catch((e: unknown) => e);
    // Item 6: a wait ends by its waitMs, with the code that says so.
    expect(error).toBeInstanceOf(AcquireTimeoutError);
    expect(proxy.deliver()).toBeGreaterThan(0); // its requests (and its cancel) reach the server now…
    await sleep(options.landMs); // …and land

    await lease.release();
    // The key is free for anyone: not handed to the place of the waiter that gave up.
    const next = await third.tryAcquire(key, { ttlMs: 5_000 });
    const states = await third.inspect(key);
    expect({ granted: next !== null, holders: states.find((s) => s.key === key)?.holders.map((h) => h.holder) ?? [] }).toEqual({
      granted: true,
      holders: ['third'],
    });
    await next!.release();
  } finally {
    await Promise.allSettled([holder.close(), slow.close(), third.close()]);
    await proxy.close();
  }
}

/**
 * Many waiters on one busy key, each giving up after `waitMs` (issue 13, items 1 and 6): every one
 * ends with ACQUIRE_TIMEOUT, however slow the loaded server's answers are, and none leaves a place
 * behind: when the holder releases, a client that asks then gets the key at once.
 */
export async function manyWaitersGiveUpCleanly(setup: Pick<LateWaiterSetup, 'direct'>, options: { waiters: number; waitMs: number }): Promise<void> {
  const holder = new Locks({ backend: setup.direct(), holderName: 'holder' });
  const waiters = [new Locks({ backend: setup.direct(), holderName: 'waiter-a' }), new Locks({ backend: setup.direct(), holderName: 'waiter-b' })];
  const third = new Locks({ backend: setup.direct(), holderName: 'third' });
  const key = uniqueName('many-waiters');
  try {
    const lease = await holder.acquire(key, { ttlMs: 30_000 });
    const outcomes = await Promise.all(
      Array.from({ length: options.waiters }, (_, i) =>
        waiters[i % 2]!.acquire(key, { ttlMs: 30_000, waitMs: options.waitMs }).then(
          () => 'granted',
          (e: unknown) => (e as { code?: string }).code ?? String(e),
        ),
      ),
    );
    const counts: Record<string, number> = {};
    for (const o of outcomes) counts[o] = (counts[o] ?? 0) + 1;
    expect(counts).toEqual({ ACQUIRE_TIMEOUT: options.waiters });
    // Every place is given up: cancels still on the wire land, and a request that was already on
    // its way when its waiter cancelled is deleted when that call ends (bounded by the backend's
    // request deadline, so this wait is too).
    const placesGone = await eventually(async () => ((await third.inspect(key)).find((s) => s.key === key)?.waiters ?? 0) === 0, 10_000, 50);
    expect(placesGone).toBe(true);
    await lease.release();
    const next = await third.tryAcquire(key, { ttlMs: 5_000 });
    const state = (await third.inspect(key)).find((s) => s.key === key);
    expect({ granted: next !== null, holders: state?.holders.map((h) => h.holder) ?? [] }).toEqual({ granted: true, holders: ['third'] });
    await next!.release();
  } finally {
    await Promise.allSettled([holder.close(), ...waiters.map((w) => w.close()), third.close()]);
  }
}

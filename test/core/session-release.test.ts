/**
 * A release that fails for a lease bound to a session (core, every backend with sessions). The
 * holder lives as long as its session, and the session's keep-alive would renew it for as long as
 * the client runs: so the release is retried (backoff, and with every keep-alive) until it gets
 * through, and if it does not within the ttl the session is ended so the key does not stay held.
 * The coordinator is the memory backend with sessions on a manual clock, behind a wrapper whose
 * release (and session close) can be made to fail.
 */
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { Backend } from '../../src/core/backend.js';
import { manualClock, type ManualClock } from '../../src/core/clock.js';
import { BackendUnavailableError, type LeaseLostError } from '../../src/core/errors.js';
import type { LockEvents } from '../../src/core/events.js';
import { Locks } from '../../src/core/locks.js';
import { memoryBackend } from '../../src/memory/index.js';
import { advance, flush } from '../helpers/clock.js';

/** The memory coordinator with sessions; its release fails the first `failReleases` times (Infinity: always). */
function coordinator(clock: ManualClock, sessions = true) {
  const inner = memoryBackend({ clock, sessions });
  const control = {
    failReleases: 0,
    failClose: false,
    /** Keep-alives answer that the session is gone. */
    sessionGone: false,
    releaseCalls: 0,
    keepAlives: 0,
    /** While set, acquires wait for it before they reach the coordinator (an answer held on the wire). */
    acquireGate: undefined as Promise<void> | undefined,
    /** What reached the coordinator, in order: `release k`, `keepAlive`, `close`. */
    log: [] as string[],
  };
  const backend: Backend = {
    ...inner,
    name: 'wrapped',
    acquire: async (req) => {
      if (control.acquireGate) await control.acquireGate;
      return inner.acquire(req);
    },
    release: async (req) => {
      control.releaseCalls++;
      control.log.push(`release ${req.key}`);
      if (control.failReleases > 0) {
        control.failReleases--;
        throw new BackendUnavailableError('wrapped', 'connection killed');
      }
      return inner.release(req);
    },
  };
  if (inner.sessions) {
    const s = inner.sessions;
    backend.sessions = {
      open: (ttl) => s.open(ttl),
      keepAlive: async (id, ttl) => {
        control.keepAlives++;
        control.log.push('keepAlive');
        return control.sessionGone ? false : s.keepAlive(id, ttl);
      },
      close: async (id) => {
        control.log.push('close');
        if (control.failClose) throw new BackendUnavailableError('wrapped', 'connection killed');
        return s.close(id);
      },
    };
  }
  return { backend, control, inner };
}

/** Whether another client could take `key` now (asks the coordinator directly, without a session). */
async function free(inner: Backend, key: string): Promise<boolean> {
  const states = await inner.inspect(key);
  return (states.find((s) => s.key === key)?.holders.length ?? 0) === 0;
}

describe('a failed release of a session lease', () => {
  let clock: ManualClock;
  const unhandled: unknown[] = [];
  const onUnhandled = (reason: unknown): void => {
    unhandled.push(reason);
  };
  const opened: Locks[] = [];
  const open = (backend: Backend): Locks => {
    const locks = new Locks({ backend, clock });
    opened.push(locks);
    return locks;
  };

  beforeEach(() => {
    clock = manualClock(1_000);
    unhandled.length = 0;
    process.on('unhandledRejection', onUnhandled);
  });
  afterEach(async () => {
    // close() is time-boxed on the manual clock: let time run while it settles.
    const closing = Promise.all(opened.splice(0).map((l) => l.close()));
    for (let i = 0; i < 200; i++) {
      clock.advance(50);
      await flush();
    }
    await closing;
    process.off('unhandledRejection', onUnhandled);
    expect(unhandled).toEqual([]);
  });

  it('failing 3 times then succeeding: retried until it gets through, the key is free soon after (the session lives on), then released is emitted', async () => {
    const { backend, control, inner } = coordinator(clock);
    const locks = open(backend);
    const events: string[] = [];
    locks.on('releaseFailed', (e) => events.push(`releaseFailed ${e.key} ${e.error.code}`));
    locks.on('released', (e) => events.push(`released ${e.key}`));
    locks.on('lost', (e) => events.push(`lost ${e.key}`));
    const ttlMs = 3_000;
    const keep = await locks.acquire('keep', { ttlMs });
    const lease = await locks.acquire('k', { ttlMs });
    control.failReleases = 3;
    await expect(lease.release()).rejects.toBeInstanceOf(BackendUnavailableError);
    expect(lease.held).toBe(false);
    expect(events).toEqual(['releaseFailed k BACKEND_UNAVAILABLE']);
    expect(await free(inner, 'k')).toBe(false);
    // Retries at 50, 100 and 200 ms after each failure: through after ~350 ms, long before the ttl.
    await advance(clock, 600, 10);
    expect(control.releaseCalls).toBe(4);
    expect(await free(inner, 'k')).toBe(true);
    expect(events).toEqual(['releaseFailed k BACKEND_UNAVAILABLE', 'released k']);
    // Nothing more is retried, and the session was not ended: its other lease is kept alive.
    await advance(clock, 3 * ttlMs, 50);
    expect(control.releaseCalls).toBe(4);
    expect(control.log).not.toContain('close');
    expect(keep.held).toBe(true);
    expect(control.keepAlives).toBeGreaterThanOrEqual(3);
    expect(await locks.tryAcquire('k', { ttlMs })).not.toBeNull();
  });

  it('a grant answered after its acquire gave up, whose give-back fails: retried by the session it was asked with, so the session does not keep the key held', async () => {
    const { backend, control, inner } = coordinator(clock);
    const locks = new Locks({ backend, clock, operationTimeoutMs: 300 });
    opened.push(locks);
    const ttlMs = 3_000;
    const keep = await locks.acquire('keep', { ttlMs }); // the session lives on through this lease's keep-alives
    let openGate!: () => void;
    control.acquireGate = new Promise((resolve) => {
      openGate = resolve;
    });
    const failed = locks.acquire('k', { ttlMs, waitMs: 1_000 }).catch((e: unknown) => e);
    await advance(clock, 1_200, 10);
    expect(((await failed) as Error).name).toBe('AcquireTimeoutError');
    // The held requests now reach the coordinator and are granted (the same owner: one grant), too late.
    control.failReleases = Number.POSITIVE_INFINITY;
    control.acquireGate = undefined;
    openGate();
    await flush();
    await advance(clock, 200, 10);
    expect(await free(inner, 'k')).toBe(false);
    // The give-backs failed; the session retries them (backoff, and with its keep-alives): once the
    // coordinator answers again, one gets through, long before the ttl.
    control.failReleases = 0;
    await advance(clock, 1_200, 10);
    expect(await free(inner, 'k')).toBe(true);
    expect(keep.held).toBe(true);
    // and stays free across keep-alives of the session
    await advance(clock, 2 * ttlMs, 50);
    expect(await free(inner, 'k')).toBe(true);
    expect(keep.held).toBe(true);
  });

  it('failing for ever while keep-alives succeed: past the ttl the session is ended — its other lease signalled lost first, then closed — and the key is free within ttl + one close', async () => {
    const { backend, control, inner } = coordinator(clock);
    const locks = open(backend);
    const lost: { key: string; reason: string; cause: unknown }[] = [];
    locks.on('lost', (e) => {
      lost.push({ key: e.key, reason: e.reason, cause: e.error.cause });
      control.log.push(`lost ${e.key}`);
    });
    const released: string[] = [];
    locks.on('released', (e) => released.push(e.key));
    const ttlMs = 3_000;
    const keep = await locks.acquire('keep', { ttlMs });
    const lease = await locks.acquire('k', { ttlMs });
    control.failReleases = Number.POSITIVE_INFINITY;
    const releasedAt = clock.now();
    await expect(lease.release()).rejects.toBeInstanceOf(BackendUnavailableError);
    // Until the ttl has run out the session lives: keep-alives go on, the release is retried.
    await advance(clock, ttlMs - 100, 10);
    expect(keep.held).toBe(true);
    expect(await free(inner, 'k')).toBe(false);
    const keepAlivesBefore = control.keepAlives;
    expect(keepAlivesBefore).toBeGreaterThanOrEqual(2);
    // Retried with backoff (bounded: at most ~1 s apart, never a tight loop).
    expect(control.releaseCalls).toBeGreaterThanOrEqual(6);
    expect(control.releaseCalls).toBeLessThanOrEqual(20);
    await advance(clock, 200, 10);
    // Ended: the other lease is lost (session-lost, the cause names the release), before the close reached the coordinator.
    expect(clock.now() - releasedAt).toBeLessThanOrEqual(ttlMs + 100);
    expect(await free(inner, 'k')).toBe(true);
    expect(await free(inner, 'keep')).toBe(true);
    expect(keep.held).toBe(false);
    expect((keep.signal.reason as LeaseLostError).reason).toBe('session-lost');
    expect(lost.map((l) => l.key)).toEqual(['keep']);
    expect(lost[0]?.reason).toBe('session-lost');
    expect(lost[0]?.cause).toBeInstanceOf(BackendUnavailableError);
    expect(String((lost[0]?.cause as Error | undefined)?.message)).toMatch(/release of "k"/);
    expect(control.log.indexOf('lost keep')).toBeLessThan(control.log.indexOf('close'));
    expect(released).toEqual([]);
    // No retry and no keep-alive of the ended session after that.
    const calls = control.releaseCalls;
    const keepAlives = control.keepAlives;
    await advance(clock, 2 * ttlMs, 50);
    expect(control.releaseCalls).toBe(calls);
    expect(control.keepAlives).toBe(keepAlives);
    // Its owner acquires again, on a new session.
    control.failReleases = 0;
    const again = await locks.acquire('keep', { ttlMs });
    expect(again.held).toBe(true);
    expect(again.token).toBeGreaterThan(keep.token);
  });

  it('failing for ever and the session close refused too: keep-alives stop, so the session expires by the coordinator within 2 × ttl of the release', async () => {
    const { backend, control, inner } = coordinator(clock);
    const locks = open(backend);
    const ttlMs = 3_000;
    const keep = await locks.acquire('keep', { ttlMs });
    const lease = await locks.acquire('k', { ttlMs });
    control.failReleases = Number.POSITIVE_INFINITY;
    control.failClose = true;
    await expect(lease.release()).rejects.toBeInstanceOf(BackendUnavailableError);
    await advance(clock, ttlMs + 100, 10);
    expect(keep.held).toBe(false);
    const keepAlives = control.keepAlives;
    await advance(clock, ttlMs, 10);
    expect(control.keepAlives).toBe(keepAlives);
    expect(await free(inner, 'k')).toBe(true);
    expect(await free(inner, 'keep')).toBe(true);
  });

  it('every keep-alive of the session also retries the pending release (started with it)', async () => {
    const { backend, control } = coordinator(clock);
    const locks = open(backend);
    // A long ttl: keep-alives every 10 s; the backoff reaches its 1 s cap in between.
    const ttlMs = 30_000;
    await locks.acquire('keep', { ttlMs });
    const lease = await locks.acquire('k', { ttlMs });
    control.failReleases = Number.POSITIVE_INFINITY;
    await expect(lease.release()).rejects.toBeInstanceOf(BackendUnavailableError);
    control.log.length = 0;
    await advance(clock, 25_000, 50);
    const rounds = control.log.flatMap((entry, i) => (entry === 'keepAlive' ? [i] : []));
    expect(rounds.length).toBe(2);
    // The retry goes out with the keep-alive, in the same turn, just before it.
    for (const i of rounds) expect(control.log[i - 1]).toBe('release k');
    // Between keep-alives, backoff capped at 1 s: about one a second.
    const releases = control.log.filter((e) => e === 'release k').length;
    expect(releases).toBeGreaterThanOrEqual(20);
    expect(releases).toBeLessThanOrEqual(40);
  });

  it('a session that is lost ends its retries (its leases are gone with it)', async () => {
    const { backend, control } = coordinator(clock);
    const locks = open(backend);
    const ttlMs = 3_000;
    await locks.acquire('keep', { ttlMs });
    const lease = await locks.acquire('k', { ttlMs });
    control.failReleases = Number.POSITIVE_INFINITY;
    await expect(lease.release()).rejects.toBeInstanceOf(BackendUnavailableError);
    await advance(clock, 300, 10);
    // The coordinator no longer knows the session (a restart without its data, say): the next keep-alive says so.
    control.sessionGone = true;
    await advance(clock, ttlMs / 3 + 100, 10);
    expect(locks.leases()).toHaveLength(0);
    const calls = control.releaseCalls;
    await advance(clock, 2 * ttlMs, 50);
    expect(control.releaseCalls).toBe(calls);
  });

  it('close() tries a pending release once more before it closes the session, and retries nothing after', async () => {
    const { backend, control, inner } = coordinator(clock);
    const locks = new Locks({ backend, clock });
    const released: string[] = [];
    locks.on('released', (e) => released.push(e.key));
    const ttlMs = 3_000;
    await locks.acquire('keep', { ttlMs });
    const lease = await locks.acquire('k', { ttlMs });
    control.failReleases = 1;
    await expect(lease.release()).rejects.toBeInstanceOf(BackendUnavailableError);
    control.log.length = 0;
    // Closed before the first retry is due: the last try is close()'s own, then the session close.
    await locks.close();
    expect(control.log).toEqual(['release keep', 'release k', 'close']);
    expect(released).toEqual(['keep', 'k']);
    expect(await free(inner, 'k')).toBe(true);
    const calls = control.releaseCalls;
    await advance(clock, 3 * ttlMs, 50);
    expect(control.releaseCalls).toBe(calls);
    expect(clock.pending()).toBe(0);
  });

  it('close() with a release that still fails: the session close frees the key, nothing is retried after', async () => {
    const { backend, control, inner } = coordinator(clock);
    const locks = new Locks({ backend, clock });
    const ttlMs = 3_000;
    const lease = await locks.acquire('k', { ttlMs });
    control.failReleases = Number.POSITIVE_INFINITY;
    await expect(lease.release()).rejects.toBeInstanceOf(BackendUnavailableError);
    control.log.length = 0;
    await locks.close();
    expect(control.log).toEqual(['release k', 'close']);
    expect(await free(inner, 'k')).toBe(true);
    await advance(clock, 3 * ttlMs, 50);
    expect(control.log).toEqual(['release k', 'close']);
    expect(clock.pending()).toBe(0);
  });

  it('many failed releases at once: all retried, then nothing left behind (no timer, no entry)', async () => {
    const { backend, control, inner } = coordinator(clock);
    const locks = open(backend);
    const ttlMs = 3_000;
    const keep = await locks.acquire('keep', { ttlMs });
    const leases = await Promise.all(Array.from({ length: 50 }, (_, i) => locks.acquire(`k${i}`, { ttlMs })));
    const timersBefore = clock.pending();
    control.failReleases = 50 * 3; // each fails about three times
    const results = await Promise.allSettled(leases.map((l) => l.release()));
    expect(results.every((r) => r.status === 'rejected')).toBe(true);
    await advance(clock, 1_500, 10);
    for (let i = 0; i < 50; i++) expect(await free(inner, `k${i}`), `k${i}`).toBe(true);
    expect(keep.held).toBe(true);
    // The retry timers are gone: what is left is the session's own (renewal, validity).
    expect(clock.pending()).toBeLessThanOrEqual(timersBefore);
    const calls = control.releaseCalls;
    await advance(clock, ttlMs, 50);
    expect(control.releaseCalls).toBe(calls);
  });
});

describe('a failed release of a lease kept on its own (no session)', () => {
  it('is not retried: the key expires within its ttl, as before', async () => {
    const clock = manualClock(1_000);
    const { backend, control, inner } = coordinator(clock, false);
    const locks = new Locks({ backend, clock });
    const lease = await locks.acquire('k', { ttlMs: 1_000 });
    control.failReleases = Number.POSITIVE_INFINITY;
    await expect(lease.release()).rejects.toBeInstanceOf(BackendUnavailableError);
    await advance(clock, 1_100, 10);
    expect(control.releaseCalls).toBe(1);
    expect(await free(inner, 'k')).toBe(true);
    await locks.close();
  });
});

describe('events', () => {
  it('releaseFailed once per failed release() call, released once when a retry gets through, never lost for it', async () => {
    const clock = manualClock(1_000);
    const { backend, control } = coordinator(clock);
    const locks = new Locks({ backend, clock });
    const seen: (keyof LockEvents)[] = [];
    for (const name of ['releaseFailed', 'released', 'lost'] as const) locks.on(name, () => seen.push(name));
    const lease = await locks.acquire('k', { ttlMs: 3_000 });
    control.failReleases = 5;
    await expect(lease.release()).rejects.toBeInstanceOf(BackendUnavailableError);
    await lease.release(); // a second call resolves quietly, and does not release again
    await advance(clock, 3_000, 10);
    expect(seen).toEqual(['releaseFailed', 'released']);
    expect(control.releaseCalls).toBe(6);
    await locks.close();
  });
});

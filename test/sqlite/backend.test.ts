/**
 * The SQLite backend's own edge cases. First: tokens across a machine restart, through the backend's documented clock seam
 * (`clock: { now, epoch }`, the machine's monotonic clock tagged with its boot id). After a
 * reboot the monotonic clock starts again from a smaller value: rows written before it must read
 * as expired (never as far in the future), their lock-delay must not carry over, and the token
 * counter must carry over (I1).
 */
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterAll, describe, expect, it } from 'vitest';
import { MAX_DURATION_MS } from '../../src/core/validate.js';
import { createLocks } from '../../src/index.js';
import type { AcquireRequest } from '../../src/core/backend.js';
import { sqliteBackend } from '../../src/sqlite/index.js';
import { tempDir } from '../helpers/env.js';

describe('sqlite backend across a machine restart', () => {
  const dir = tempDir();
  afterAll(() => dir.cleanup());
  const path = join(dir.path, 'locks.db');
  /**
   * One boot of the machine: a monotonic clock reading `at`, tagged `epoch`. `crash` closes the
   * connection without releasing anything (Locks.close would release the leases).
   */
  const boot = (epoch: string, at: number) => {
    const backend = sqliteBackend({ path, clock: { now: () => at, epoch } });
    return Object.assign(createLocks({ backend }), { crash: () => backend.close() });
  };
  const opts = { autoRenew: false } as const;

  it('a key held with a huge ttl and a lock-delay before the reboot is grantable at once after it, with a higher token', async () => {
    const before = boot('boot:a', 50_000_000);
    const held = await before.acquire('held', { ...opts, ttlMs: MAX_DURATION_MS, lockDelayMs: 60_000 });
    // and one whose lock-delay already started before the reboot (expired without a release)
    const expired = await before.acquire('delayed', { ...opts, ttlMs: 1_000, lockDelayMs: MAX_DURATION_MS });
    await before.crash();
    const stillBefore = boot('boot:a', 50_000_000 + 1_001);
    expect(await stillBefore.tryAcquire('held', opts)).toBeNull(); // control: same boot, the ttl still runs
    expect(await stillBefore.tryAcquire('delayed', opts)).toBeNull(); // control: same boot, in its lock-delay
    await stillBefore.crash();

    const after = boot('boot:b', 10); // the new boot's monotonic clock is far below the old one
    const regranted = await after.tryAcquire('held', opts);
    expect(regranted?.token).toBeGreaterThan(held.token);
    const undelayed = await after.tryAcquire('delayed', opts);
    expect(undelayed?.token).toBeGreaterThan(expired.token);
    // the new grant's own expiry is judged in the new boot: still held a moment later
    const again = boot('boot:b', 20);
    expect(await again.tryAcquire('held', opts)).toBeNull();
    await again.crash();
    await after.crash();
  });
});

describe('sqlite backend on a database the user already has', () => {
  const request = (owner: string): AcquireRequest => ({
    key: 'k',
    owner,
    mode: 'exclusive',
    ttlMs: 60_000,
    lockDelayMs: 0,
    holder: 'test',
    queue: false,
    queueTtlMs: 2_000,
  });

  it("refuses to grant inside the user's open transaction, whose rollback would take the token back (I1, I2)", async () => {
    const db = new Database(':memory:');
    const backend = sqliteBackend({ database: db });
    const first = await backend.acquire(request('a'));
    expect(first).toMatchObject({ granted: true, token: 1n });
    await backend.release({ key: 'k', owner: 'a', token: 1n, mode: 'exclusive' });
    db.exec('BEGIN');
    await expect(backend.acquire(request('b'))).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'database' });
    await expect(backend.renew({ key: 'k', owner: 'a', token: 1n, mode: 'exclusive', ttlMs: 1_000 })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    db.exec('ROLLBACK');
    // once the transaction is over, grants go on from where the committed counter was
    expect(await backend.acquire(request('c'))).toMatchObject({ granted: true, token: 2n });
    expect(await backend.acquire(request('d'))).toMatchObject({ granted: false });
    await backend.close();
    db.close();
  });

  it("a first use inside the user's open transaction does not create the tables in it", async () => {
    const db = new Database(':memory:');
    const backend = sqliteBackend({ database: db });
    db.exec('BEGIN');
    await expect(backend.acquire(request('a'))).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'database' });
    db.exec('ROLLBACK');
    expect(await backend.acquire(request('a'))).toMatchObject({ granted: true, token: 1n });
    await backend.close();
    db.close();
  });
});

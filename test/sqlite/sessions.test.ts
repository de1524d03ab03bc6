/**
 * Sessions on SQLite: one keep-alive per client and ttl moves the session's expiry and every bound
 * holder's (by the machine's clock, injected here where the test is about expiry); a session that
 * runs out frees its leases (with their lock-delay), one that is closed frees them at once and wakes
 * waiters; an acquire naming a gone session writes nothing. Also a file made before sessions.
 */
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterEach, describe, expect, it } from 'vitest';
import type { AcquireRequest, AcquireResult, Backend } from '../../src/core/backend.js';
import { Locks } from '../../src/core/locks.js';
import { sqliteBackend, type MachineClock } from '../../src/sqlite/index.js';
import { acquireRequest, eventually, sleep, tempDir } from '../helpers/env.js';

let cleanups: (() => unknown)[] = [];

afterEach(async () => {
  for (const c of cleanups.reverse()) await c();
  cleanups = [];
});

/** A fresh database file, removed after the test. */
function file(): string {
  const dir = tempDir();
  cleanups.push(() => dir.cleanup());
  return join(dir.path, 'locks.db');
}

function open(path: string, extra: { clock?: MachineClock; sessions?: boolean } = {}): Backend {
  const b = sqliteBackend({ path, ...extra });
  cleanups.push(() => b.close());
  return b;
}

/** A clock the test moves by hand (the coordinator's clock judges every expiry, I7). */
function manualClock(epoch = 'test-boot'): MachineClock & { at: number } {
  const c = { at: 1_000_000, epoch, now: () => c.at };
  return c;
}

function granted(result: AcquireResult): bigint {
  if (!result.granted) throw new Error(`expected a grant, got ${JSON.stringify(result)}`);
  return result.token;
}

const request = (key: string, owner: string, extra: Partial<AcquireRequest> = {}): AcquireRequest => acquireRequest(key, owner, extra);

/** A read-only look at the file, as another process would take it. */
function peek<T>(path: string, sql: string): T[] {
  const db = new Database(path, { readonly: true });
  try {
    return db.prepare(sql).all() as T[];
  } finally {
    db.close();
  }
}

describe('sqlite sessions', () => {
  it('a keep-alive extends every lease of the session (inspect shows expiresInMs refreshed), not the leases of others', async () => {
    const clock = manualClock();
    const b = open(file(), { clock });
    const { id } = await b.sessions!.open(1_000);
    for (const k of ['ka/1', 'ka/2', 'ka/3']) granted(await b.acquire(request(k, `o-${k}`, { ttlMs: 1_000, session: id })));
    granted(await b.acquire(request('ka/own', 'o-own', { ttlMs: 1_000 })));
    clock.at += 600;
    expect((await b.inspect('ka/')).map((s) => s.holders[0]!.expiresInMs)).toEqual([400, 400, 400, 400]);
    expect(await b.sessions!.keepAlive(id, 1_000)).toBe(true);
    expect((await b.inspect('ka/')).map((s) => s.holders[0]!.expiresInMs)).toEqual([1_000, 1_000, 1_000, 400]);
    clock.at += 700; // past the first expiry: the session's leases live on, the other one is gone
    expect((await b.inspect('ka/')).map((s) => s.key)).toEqual(['ka/1', 'ka/2', 'ka/3']);
  });

  it('a session that runs out frees all its leases, with their lock-delay (I8); the next grant has a higher token; keepAlive says false', async () => {
    const clock = manualClock();
    const path = file();
    const b = open(path, { clock });
    const other = open(path, { clock });
    const { id } = await b.sessions!.open(300);
    const t1 = granted(await b.acquire(request('exp/1', 'o1', { ttlMs: 300, session: id })));
    const t2 = granted(await b.acquire(request('exp/2', 'o2', { ttlMs: 300, session: id, lockDelayMs: 1_000 })));
    expect((await other.acquire(request('exp/1', 'x'))).granted).toBe(false);
    clock.at += 300;
    expect(await b.sessions!.keepAlive(id, 300)).toBe(false);
    expect(granted(await other.acquire(request('exp/1', 'x')))).toBeGreaterThan(t1);
    await b.sessions!.close(id); // a session that ran out is not "closed": the lock-delay of its leases runs
    expect((await other.acquire(request('exp/2', 'x'))).granted).toBe(false);
    expect((await other.inspect('exp/2'))[0]).toMatchObject({ holders: [], lockDelayRemainingMs: 1_000, lastToken: t2 });
    clock.at += 1_000;
    expect(granted(await other.acquire(request('exp/2', 'x')))).toBeGreaterThan(t2);
  });

  it('closing a session frees all its leases at once (no lock-delay) and wakes a waiter in another process', async () => {
    const path = file();
    const a = open(path);
    const w = open(path);
    const { id } = await a.sessions!.open(30_000);
    const held = granted(await a.acquire(request('close/1', 'holder', { ttlMs: 30_000, session: id, lockDelayMs: 60_000 })));
    granted(await a.acquire(request('close/2', 'holder', { ttlMs: 30_000, session: id, lockDelayMs: 60_000 })));
    const busy = await w.acquire(request('close/1', 'waiter'));
    expect(busy).toMatchObject({ granted: false, holder: 'holder' });
    expect(busy.granted === false && busy.retryInMs).toBeGreaterThan(20_000);
    let woken = 0;
    const off = await w.subscribe!('close/1', () => woken++);
    await sleep(50);
    expect(woken).toBe(0);
    await a.sessions!.close(id);
    expect(await eventually(() => woken > 0, 5_000)).toBe(true);
    off();
    expect(granted(await w.acquire(request('close/1', 'waiter')))).toBeGreaterThan(held);
    expect((await w.acquire(request('close/2', 'waiter'))).granted).toBe(true);
    expect((await w.inspect('close/')).map((s) => s.lockDelayRemainingMs)).toEqual([0, 0]);
    expect(await a.sessions!.keepAlive(id, 30_000)).toBe(false);
    await a.sessions!.close(id); // idempotent
  });

  it("closing a session wakes this backend's own waiters and watchers at once", async () => {
    const b = open(file());
    const { id } = await b.sessions!.open(30_000);
    granted(await b.acquire(request('own', 'holder', { ttlMs: 30_000, session: id })));
    let woken = 0;
    let watched = 0;
    const offs = [await b.subscribe!('own', () => woken++), await b.watch!('own', () => watched++)];
    await b.sessions!.close(id);
    expect(await eventually(() => woken > 0 && watched > 0, 2_000)).toBe(true);
    for (const off of offs) off();
  });

  it('an acquire naming a session that is gone (closed, ran out, or of an earlier boot) answers sessionLost and writes nothing', async () => {
    const clock = manualClock('boot-1');
    const path = file();
    const b = open(path, { clock });
    const closed = (await b.sessions!.open(10_000)).id;
    await b.sessions!.close(closed);
    const ranOut = (await b.sessions!.open(100)).id;
    const live = (await b.sessions!.open(10_000)).id;
    granted(await b.acquire(request('lost/busy', 'holder')));
    clock.at += 100;
    const snapshot = () => [peek(path, 'SELECT * FROM leasehold_locks ORDER BY key'), peek(path, 'SELECT * FROM leasehold_locks_tokens ORDER BY key')];
    const before = snapshot();
    for (const session of [closed, ranOut, 'never-opened']) {
      expect(await b.acquire(request('lost/free', 'o', { session }))).toEqual({ granted: false, sessionLost: true });
      expect(await b.acquire(request('lost/busy', 'o', { session, queue: true }))).toEqual({ granted: false, sessionLost: true });
    }
    expect(snapshot()).toEqual(before);
    expect(peek(path, 'SELECT * FROM leasehold_locks_waiters')).toEqual([]);
    // after a reboot the machine's clock restarted: a session of the earlier boot is gone too
    const rebooted = open(path, { clock: manualClock('boot-2') });
    expect(await rebooted.sessions!.keepAlive(live, 10_000)).toBe(false);
    expect(await rebooted.acquire(request('lost/free', 'o', { session: live }))).toEqual({ granted: false, sessionLost: true });
  });

  it('renewing a session-bound lease keeps its session alive, with every lease of it; releasing one frees only that one', async () => {
    const clock = manualClock();
    const b = open(file(), { clock });
    const { id } = await b.sessions!.open(600);
    const t1 = granted(await b.acquire(request('rn/1', 'o1', { ttlMs: 600, session: id })));
    granted(await b.acquire(request('rn/2', 'o2', { ttlMs: 600, session: id })));
    clock.at += 400;
    expect(await b.renew({ key: 'rn/1', owner: 'o1', token: t1, mode: 'exclusive', ttlMs: 600 })).toEqual({ renewed: true, ttlMs: 600 });
    expect((await b.inspect('rn/')).map((s) => s.holders[0]!.expiresInMs)).toEqual([600, 600]);
    await b.release({ key: 'rn/1', owner: 'o1', token: t1, mode: 'exclusive' });
    expect((await b.inspect('rn/')).map((s) => s.key)).toEqual(['rn/2']);
    expect(await b.renew({ key: 'rn/1', owner: 'o1', token: t1, mode: 'exclusive', ttlMs: 600 })).toEqual({ renewed: false });
    expect(await b.sessions!.keepAlive(id, 600)).toBe(true);
  });

  it('a retried acquire of a lease it holds gets it back bound to the session it asks with now', async () => {
    const clock = manualClock();
    const b = open(file(), { clock });
    const { id } = await b.sessions!.open(500);
    const t = granted(await b.acquire(request('retry', 'o', { ttlMs: 10_000 })));
    expect(granted(await b.acquire(request('retry', 'o', { ttlMs: 500, session: id })))).toBe(t);
    expect((await b.inspect('retry'))[0]!.holders[0]!.expiresInMs).toBe(500);
    clock.at += 400;
    expect(await b.sessions!.keepAlive(id, 500)).toBe(true);
    expect((await b.inspect('retry'))[0]!.holders[0]!.expiresInMs).toBe(500);
  });

  it('a Locks client holding 200 leases makes one keep-alive write transaction per interval and no renewals', async () => {
    const path = file();
    // the connection, with its write transactions counted (every write of the backend is one IMMEDIATE transaction)
    const db = new Database(path);
    cleanups.push(() => db.close());
    db.pragma('journal_mode = WAL'); // as the backend sets it on a file of its own
    db.pragma('synchronous = FULL');
    let writes = 0;
    const counted = new Proxy(db, {
      get(target, prop) {
        if (prop === 'transaction') {
          return (fn: (...args: unknown[]) => unknown) => {
            const tx = target.transaction(fn);
            return Object.assign((...args: unknown[]) => tx(...args), {
              immediate: (...args: unknown[]) => (writes++, tx.immediate(...args)),
              deferred: (...args: unknown[]) => tx.deferred(...args),
            });
          };
        }
        const value = Reflect.get(target, prop, target);
        return typeof value === 'function' ? value.bind(target) : value;
      },
    });
    const raw = sqliteBackend({ database: counted });
    cleanups.push(() => raw.close());
    const counts: Record<string, number> = {};
    const bump = (name: string): void => {
      counts[name] = (counts[name] ?? 0) + 1;
    };
    // counts calls to the Backend interface, as the conformance suite does
    const wrapped: Backend = Object.create(raw) as Backend;
    for (const name of ['acquire', 'renew', 'release'] as const) {
      const fn = raw[name] as (...args: unknown[]) => unknown;
      Object.defineProperty(wrapped, name, { value: (...args: unknown[]) => (bump(name), fn.apply(raw, args)) });
    }
    const s = raw.sessions!;
    Object.defineProperty(wrapped, 'sessions', {
      value: {
        open: (ttl: number) => (bump('open'), s.open(ttl)),
        keepAlive: (id: string, ttl: number) => (bump('keepAlive'), s.keepAlive(id, ttl)),
        close: (id: string) => (bump('close'), s.close(id)),
      },
    });
    const locks = new Locks({ backend: wrapped });
    cleanups.push(() => locks.close());
    // 200 grants are 200 synchronous commits in a row: the ttl leaves them room on a slow disk
    const ttlMs = 1_500;
    const leases = await Promise.all(Array.from({ length: 200 }, (_, i) => locks.acquire(`many/${i}`, { ttlMs })));
    expect(counts.open).toBe(1);
    const keepAlivesBefore = counts.keepAlive ?? 0;
    const writesBefore = writes;
    await sleep(2 * ttlMs); // ~6 intervals of ttl/3
    const keepAlives = (counts.keepAlive ?? 0) - keepAlivesBefore;
    expect(keepAlives).toBeGreaterThanOrEqual(3);
    expect(keepAlives).toBeLessThanOrEqual(12); // ≈ 6, not 200 × 6
    expect(counts.renew ?? 0).toBe(0);
    expect(writes - writesBefore).toBe(keepAlives); // one write transaction each, nothing else
    expect(leases.every((l) => l.held)).toBe(true);
    const states = await locks.inspect('many/');
    expect(states).toHaveLength(200);
    expect(states.every((k) => k.holders.length === 1 && k.holders[0]!.expiresInMs > ttlMs / 3)).toBe(true);
  });

  it('storage layout: an operator who deletes a session row takes every lease of that client away (signalled at its next keep-alive)', async () => {
    const path = file();
    const locks = new Locks({ backend: open(path) });
    cleanups.push(() => locks.close());
    const leases = await Promise.all(['op/1', 'op/2'].map((k) => locks.acquire(k, { ttlMs: 600 })));
    const db = new Database(path, { timeout: 5_000 });
    try {
      expect(db.prepare('DELETE FROM leasehold_locks_sessions').run().changes).toBe(1);
    } finally {
      db.close();
    }
    expect(await eventually(() => leases.every((l) => l.signal.aborted), 3_000)).toBe(true);
    for (const l of leases) expect((l.signal.reason as { reason?: string }).reason).toBe('session-lost');
    // their rows are no longer kept alive: the keys are free once the last keep-alive's time runs out
    const other = new Locks({ backend: open(path) });
    cleanups.push(() => other.close());
    expect((await other.acquire('op/1', { ttlMs: 600, waitMs: 3_000 })).token).toBeGreaterThan(leases[0]!.token);
  });

  it('sessions: false offers none; each lease is renewed on its own', async () => {
    const b = open(file(), { sessions: false });
    expect(b.sessions).toBeUndefined();
    expect(() => sqliteBackend({ path: file(), sessions: 'yes' } as never)).toThrow(/sessions/);
    const locks = new Locks({ backend: b });
    cleanups.push(() => locks.close());
    const lease = await locks.acquire('nosess', { ttlMs: 200 });
    await sleep(400);
    expect(lease.held).toBe(true);
  });

  it('storage layout: sessions that ran out are deleted by the next open (the table does not grow)', async () => {
    const clock = manualClock();
    const path = file();
    const b = open(path, { clock });
    for (let i = 0; i < 5; i++) await b.sessions!.open(50);
    await b.sessions!.open(60_000);
    expect(peek(path, 'SELECT id FROM leasehold_locks_sessions')).toHaveLength(6);
    clock.at += 50;
    await b.sessions!.open(60_000);
    expect(peek(path, 'SELECT id FROM leasehold_locks_sessions')).toHaveLength(2);
  });

  it('a file made before sessions gets the session column, its index and the sessions table on first use; its holders stay', async () => {
    const path = file();
    // the tables as the previous release made them (permit_limit, no session)
    const old = new Database(path);
    old.exec(`CREATE TABLE leasehold_locks_tokens (key TEXT PRIMARY KEY NOT NULL, last_token INTEGER NOT NULL, delay_until INTEGER NOT NULL DEFAULT 0,
        delay_epoch TEXT NOT NULL DEFAULT '') WITHOUT ROWID;
      CREATE TABLE leasehold_locks (key TEXT NOT NULL, owner TEXT NOT NULL, mode TEXT NOT NULL CHECK (mode IN ('exclusive', 'shared')),
        token INTEGER NOT NULL, holder TEXT NOT NULL, expires_at INTEGER NOT NULL, epoch TEXT NOT NULL, lock_delay_ms INTEGER NOT NULL,
        permit_limit INTEGER, PRIMARY KEY (key, owner)) WITHOUT ROWID;
      CREATE TABLE leasehold_locks_waiters (key TEXT NOT NULL, owner TEXT NOT NULL, mode TEXT NOT NULL, seq INTEGER NOT NULL,
        expires_at INTEGER NOT NULL, epoch TEXT NOT NULL, PRIMARY KEY (key, owner)) WITHOUT ROWID;
      INSERT INTO leasehold_locks_tokens (key, last_token) VALUES ('old', 7);
      INSERT INTO leasehold_locks VALUES ('old', 'old-owner', 'exclusive', 7, 'old-holder', 2000000, 'test-boot', 0, NULL);`);
    old.close();
    const clock = manualClock();
    const b = open(path, { clock });
    expect(await b.acquire(request('old', 'new-owner'))).toMatchObject({ granted: false, holder: 'old-holder' });
    expect(await b.renew({ key: 'old', owner: 'old-owner', token: 7n, mode: 'exclusive', ttlMs: 60_000 })).toEqual({ renewed: true, ttlMs: 60_000 });
    const { id } = await b.sessions!.open(5_000);
    await b.release({ key: 'old', owner: 'old-owner', token: 7n, mode: 'exclusive' });
    expect(granted(await b.acquire(request('old', 'new-owner', { session: id })))).toBe(8n);
    expect(await b.sessions!.keepAlive(id, 5_000)).toBe(true);
    const columns = peek<{ name: string }>(path, `SELECT name FROM pragma_table_info('leasehold_locks')`).map((c) => c.name);
    expect(columns).toContain('session');
    expect(peek(path, `SELECT name FROM sqlite_master WHERE name IN ('leasehold_locks_sessions', 'leasehold_locks_by_session') ORDER BY name`)).toEqual([
      { name: 'leasehold_locks_by_session' },
      { name: 'leasehold_locks_sessions' },
    ]);
  });
});

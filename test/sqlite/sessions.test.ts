/**
 * Sessions on SQLite. The cases the SQL backends share run from ../helpers/backend-sessions.ts on a
 * fresh file each: a session that is closed frees its leases at once and wakes waiters; an acquire
 * naming a gone session writes nothing; one keep-alive per client and ttl. Here, what is SQLite's
 * own: the cases about expiry, on the machine's clock injected (exact values: a keep-alive moves the
 * session's expiry and every bound holder's; a session that runs out frees its leases, with their
 * lock-delay; a session of an earlier boot is gone), this backend's own waiters and watchers woken
 * at once, an operator deleting a session row, and a file made before sessions.
 */
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterEach, describe, expect, it } from 'vitest';
import type { Backend } from '../../src/core/backend.js';
import { Locks } from '../../src/core/locks.js';
import { sqliteBackend, type MachineClock } from '../../src/sqlite/index.js';
import { backendSessionCases, granted, type SessionStore } from '../helpers/backend-sessions.js';
import { acquireRequest as request, eventually, tempDir } from '../helpers/env.js';

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

/** A read-only look at the file, as another process would take it. */
function peek<T>(path: string, sql: string): T[] {
  const db = new Database(path, { readonly: true });
  try {
    return db.prepare(sql).all() as T[];
  } finally {
    db.close();
  }
}

/** Every row of the holders and of the keys' token counters. */
const snapshot = (path: string) => [peek(path, 'SELECT * FROM leasehold_locks ORDER BY key'), peek(path, 'SELECT * FROM leasehold_locks_tokens ORDER BY key')];

/** A fresh file, and the tests' reads of it. */
function store(): SessionStore {
  const path = file();
  return {
    backend: (extra) => open(path, extra),
    sessionRows: async () => peek(path, 'SELECT id FROM leasehold_locks_sessions').length,
    waiterRows: async () => peek(path, 'SELECT * FROM leasehold_locks_waiters').length,
    snapshot: async () => snapshot(path),
  };
}

backendSessionCases('sqlite', {
  store,
  // another process's commits are seen by polling PRAGMA data_version
  wakeBy: 'through its data_version poller',
  // the cases about expiry are below, on an injected clock
  serverClock: false,
  keepAliveEntry: 'write transaction',
  recording() {
    // the connection, with its write transactions recorded (every write of the backend is one IMMEDIATE transaction)
    const db = new Database(file());
    cleanups.push(() => db.close());
    db.pragma('journal_mode = WAL'); // as the backend sets it on a file of its own
    db.pragma('synchronous = FULL');
    const sent: string[] = [];
    const recorded = new Proxy(db, {
      get(target, prop) {
        if (prop === 'transaction') {
          return (fn: (...args: unknown[]) => unknown) => {
            const tx = target.transaction(fn);
            return Object.assign((...args: unknown[]) => tx(...args), {
              immediate: (...args: unknown[]) => (sent.push('write transaction'), tx.immediate(...args)),
              deferred: (...args: unknown[]) => tx.deferred(...args),
            });
          };
        }
        const value = Reflect.get(target, prop, target);
        return typeof value === 'function' ? value.bind(target) : value;
      },
    });
    const backend = sqliteBackend({ database: recorded });
    cleanups.push(() => backend.close());
    return { backend, sent };
  },
});

describe('sqlite sessions: SQLite only', () => {
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

  it('an acquire naming a session that ran out, or one of an earlier boot, answers sessionLost and writes nothing', async () => {
    const clock = manualClock('boot-1');
    const path = file();
    const b = open(path, { clock });
    const ranOut = (await b.sessions!.open(100)).id;
    const live = (await b.sessions!.open(10_000)).id;
    granted(await b.acquire(request('lost/busy', 'holder')));
    clock.at += 100;
    const before = snapshot(path);
    expect(await b.acquire(request('lost/free', 'o', { session: ranOut }))).toEqual({ granted: false, sessionLost: true });
    expect(await b.acquire(request('lost/busy', 'o', { session: ranOut, queue: true }))).toEqual({ granted: false, sessionLost: true });
    expect(snapshot(path)).toEqual(before);
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

/**
 * The session cases the SQL backends share (PostgreSQL, MySQL / MariaDB, SQLite), registered once
 * per backend by its sessions.test.ts: closing a session frees its leases at once and wakes another
 * process's waiter; a Locks waiter is served when the session holding its key ends, and the holding
 * client sees its leases lost; an acquire naming a gone session writes nothing; a client holding
 * 200 leases keeps them with one keep-alive per interval; `sessions: false` renews each lease on its
 * own. Where expiry is judged by a server's clock (PostgreSQL, MySQL), the cases about expiry run
 * here too, with real waits; SQLite's file runs them on an injected clock, with exact values. Each
 * file keeps what only its backend has (schema upgrades and SQL, wake-ups inside one instance, …).
 */
import { afterEach, describe, expect, it } from 'vitest';
import type { AcquireResult, Backend } from '../../src/core/backend.js';
import { Locks } from '../../src/core/locks.js';
import { counting } from '../../src/testing/counting.js';
import { acquireRequest as request, eventually, sleep } from './env.js';

/** How the store binds holders to sessions (read from its tables: the storage layout is the subject). */
export interface BoundHolders {
  /** Holders that refer to a session. */
  bound: number;
  /** Distinct expiries among those holders. */
  expiries: number;
  /** Whether every one of them carries its session's expiry exactly. */
  sameExpiry: boolean;
  /** Holders bound to no session. */
  unbound: number;
}

/** One store (a schema, a table set or a file), fresh for each test, and the test's reads of its tables. */
export interface SessionStore {
  /** A backend of its own on this store, as another process would open it; closed after the test by the test file. */
  backend(extra?: Record<string, unknown>): Backend;
  /** Rows in the sessions table, expired ones included. */
  sessionRows(): Promise<number>;
  /** Rows in the waiters table. */
  waiterRows(): Promise<number>;
  /** The keys' rows (token counters …) and the holders' rows, to compare before and after calls that must write nothing. */
  snapshot(): Promise<unknown>;
  /** The key's change counter, where other processes' pollers read one (MySQL): ending a session must move it once. */
  changeCounter?(key: string): Promise<bigint>;
  /** Where the cases about expiry run here (`SessionHarness.serverClock`). */
  boundHolders?(): Promise<BoundHolders>;
}

/** A backend on a fresh store whose traffic to the store is recorded: one entry per statement or write transaction. */
export interface RecordingBackend {
  backend: Backend;
  /** The entries recorded; the case empties it to start counting. */
  sent: string[];
}

export interface SessionHarness {
  /** A fresh store for one test. */
  store(): SessionStore;
  /** How a waiter in another process hears that a key changed (in the test's name). */
  wakeBy: string;
  /** A backend whose traffic is recorded (closed after the test by the test file). */
  recording(): RecordingBackend;
  /** What one entry of `RecordingBackend.sent` is (in the test's name): 'statement', 'CALL', 'write transaction'. */
  keepAliveEntry: string;
  /** Whether a recorded entry is a keep-alive; absent where entries carry no text (SQLite's write transactions). */
  isKeepAlive?(entry: string): boolean;
  /**
   * Whether expiry is judged by a server's clock, which a test cannot move (PostgreSQL, MySQL): the
   * cases about expiry then run here, waiting in real time. SQLite runs them on an injected clock.
   */
  serverClock: boolean;
}

/** The token of a grant; anything else fails the test, with the answer. */
export function granted(result: AcquireResult): bigint {
  if (!result.granted) throw new Error(`expected a grant, got ${JSON.stringify(result)}`);
  return result.token;
}

/**
 * Returns `track`: what it is given during a test is closed after that test, all at once (a close
 * that fails does not keep the others from running). Registers its afterEach where it is called.
 */
export function closedAfterEach(): <T extends { close(): unknown }>(thing: T) => T {
  let opened: { close(): unknown }[] = [];
  afterEach(async () => {
    await Promise.allSettled(opened.map((o) => o.close()));
    opened = [];
  });
  return (thing) => {
    opened.push(thing);
    return thing;
  };
}

export function backendSessionCases(name: string, h: SessionHarness): void {
  describe(`${name} sessions`, () => {
    const track = closedAfterEach();
    /** A Locks client, closed after the test (with its backend). */
    const client = (backend: Backend): Locks => track(new Locks({ backend }));

    it(`closing a session frees all its leases at once (no lock-delay) and wakes a waiter in another process (${h.wakeBy})`, async () => {
      const store = h.store();
      const a = store.backend();
      const w = store.backend();
      const { id } = await a.sessions!.open(30_000);
      const held = granted(await a.acquire(request('close/1', 'holder', { ttlMs: 30_000, session: id, lockDelayMs: 60_000 })));
      granted(await a.acquire(request('close/2', 'holder', { ttlMs: 30_000, session: id, lockDelayMs: 60_000 })));
      const busy = await w.acquire(request('close/1', 'waiter'));
      expect(busy).toMatchObject({ granted: false, holder: 'holder' });
      if (busy.granted) throw new Error('expected busy');
      expect(busy.retryInMs).toBeGreaterThan(20_000); // nothing would end the wait by itself for a long time
      // The hook fires only when the key changes after the busy answer (a NOTIFY, a change counter or
      // data_version seen to move by a poll round): the wake is the close's.
      let woken = 0;
      const off = await w.subscribe!('close/1', () => woken++, busy.cursor);
      await sleep(100); // poll rounds go by
      expect(woken).toBe(0);
      const counterBefore = await store.changeCounter?.('close/1');
      await a.sessions!.close(id);
      expect(await eventually(() => woken > 0, 5_000)).toBe(true);
      off();
      if (counterBefore !== undefined) expect(await store.changeCounter!('close/1')).toBe(counterBefore + 1n);
      expect(granted(await w.acquire(request('close/1', 'waiter')))).toBeGreaterThan(held);
      expect((await w.acquire(request('close/2', 'waiter'))).granted).toBe(true);
      expect((await w.inspect('close/')).map((s) => s.lockDelayRemainingMs)).toEqual([0, 0]);
      expect(await a.sessions!.keepAlive(id, 30_000)).toBe(false);
      await a.sessions!.close(id); // idempotent
      expect(await store.sessionRows()).toBe(0);
    });

    it('a Locks waiter is served when the session holding its key ends; the holding Locks client sees its leases lost', async () => {
      const store = h.store();
      const raw = store.backend();
      const spied = counting(raw);
      const holder = client(spied.backend);
      const waiter = client(store.backend());
      const leases = await Promise.all(['lw/1', 'lw/2'].map((k) => holder.acquire(k, { ttlMs: 3_000 })));
      const waiting = waiter.acquire('lw/2', { ttlMs: 3_000, waitMs: 10_000 });
      await eventually(async () => (await waiter.inspect('lw/2'))[0]?.waiters === 1, 5_000);
      expect(spied.sessionIds).toHaveLength(1);
      await raw.sessions!.close(spied.sessionIds[0]!); // an operator ends the session behind the holder's back
      const lease = await waiting;
      expect(lease.token).toBeGreaterThan(leases[1]!.token);
      expect(await waiter.tryAcquire('lw/1', { ttlMs: 1_000 })).not.toBeNull();
      // its next keep-alive (within ttl/3) finds the session gone
      expect(await eventually(() => leases.every((l) => l.signal.aborted), 5_000)).toBe(true);
    });

    it('an acquire naming a session that is gone (closed, or never opened) answers sessionLost and writes nothing', async () => {
      const store = h.store();
      const b = store.backend();
      const { id } = await b.sessions!.open(10_000);
      granted(await b.acquire(request('lost/busy', 'holder')));
      await b.sessions!.close(id);
      const before = await store.snapshot();
      const tooLong = 'x'.repeat(65); // longer than any id the backend makes (MySQL stores them as VARBINARY(64))
      for (const session of [id, 'never-opened', tooLong]) {
        expect(await b.acquire(request('lost/free', 'o', { session }))).toEqual({ granted: false, sessionLost: true });
        expect(await b.acquire(request('lost/busy', 'o', { session, queue: true }))).toEqual({ granted: false, sessionLost: true });
        expect(await b.acquire(request('lost/busy', 'holder', { session }))).toEqual({ granted: false, sessionLost: true }); // not even its own grant back
      }
      expect(await store.snapshot()).toEqual(before);
      expect(await store.waiterRows()).toBe(0);
      // and the other calls on unknown ids answer as for a gone session
      expect(await b.sessions!.keepAlive('never-opened', 1_000)).toBe(false);
      expect(await b.sessions!.keepAlive(tooLong, 1_000)).toBe(false);
      await b.sessions!.close(tooLong);
    });

    it(`a Locks client holding 200 leases makes one keep-alive ${h.keepAliveEntry} per interval and no renewals`, async () => {
      const recorded = h.recording();
      const { backend, counts } = counting(recorded.backend);
      const locks = client(backend);
      // 200 grants in a row (on SQLite 200 synchronous commits), and the first keep-alive queues behind
      // them: the ttl leaves them room on a busy machine or a slow disk
      const ttlMs = 2_000;
      const leases = await Promise.all(Array.from({ length: 200 }, (_, i) => locks.acquire(`many/${i}`, { ttlMs })));
      expect(counts['sessions.open']).toBe(1);
      const keepAlivesBefore = counts['sessions.keepAlive'] ?? 0;
      recorded.sent.length = 0;
      await sleep(2 * ttlMs); // ~6 intervals of ttl/3
      const keepAlives = (counts['sessions.keepAlive'] ?? 0) - keepAlivesBefore;
      expect(keepAlives).toBeGreaterThanOrEqual(3);
      expect(keepAlives).toBeLessThanOrEqual(12); // ≈ 6, not 200 × 6
      expect(counts.renew ?? 0).toBe(0);
      // everything sent meanwhile is a keep-alive, one per interval
      expect(recorded.sent.length).toBe(keepAlives);
      if (h.isKeepAlive) expect(recorded.sent.every((entry) => h.isKeepAlive!(entry))).toBe(true);
      expect(leases.every((l) => l.held)).toBe(true);
      // and the coordinator agrees: every holder is there, its expiry moved by the keep-alives
      const states = await locks.inspect('many/');
      expect(states).toHaveLength(200);
      expect(states.every((k) => k.holders.length === 1 && k.holders[0]!.expiresInMs > ttlMs / 3)).toBe(true);
    });

    it('sessions: false offers none; each lease is renewed on its own', async () => {
      const store = h.store();
      const b = store.backend({ sessions: false });
      expect(b.sessions).toBeUndefined();
      expect(() => store.backend({ sessions: 'yes' })).toThrow(/sessions/);
      await b.inspect(''); // the tables first: a lease's validity counts from its request, which would include their creation
      const locks = client(b);
      let renewals = 0;
      locks.on('renewed', () => renewals++);
      const lease = await locks.acquire('nosess', { ttlMs: 1_000 });
      await sleep(1_500);
      expect(lease.held).toBe(true);
      expect(renewals).toBeGreaterThanOrEqual(2);
    });

    if (!h.serverClock) return;

    it('a keep-alive extends every lease of the session (inspect shows expiresInMs refreshed), not the leases of others', async () => {
      const store = h.store();
      const b = store.backend();
      const { id } = await b.sessions!.open(1_000);
      for (const k of ['ka/1', 'ka/2', 'ka/3']) granted(await b.acquire(request(k, `o-${k}`, { ttlMs: 1_000, session: id })));
      granted(await b.acquire(request('ka/own', 'o-own', { ttlMs: 1_000 }))); // renewed on its own: not the session's
      await sleep(500);
      const before = await b.inspect('ka/');
      for (const s of before) expect(s.holders[0]!.expiresInMs).toBeLessThanOrEqual(550);
      expect(await b.sessions!.keepAlive(id, 1_000)).toBe(true);
      const after = await b.inspect('ka/');
      expect(after.map((s) => s.key)).toEqual(['ka/1', 'ka/2', 'ka/3', 'ka/own']);
      for (const s of after.slice(0, 3)) expect(s.holders[0]!.expiresInMs).toBeGreaterThan(700);
      expect(after[3]!.holders[0]!.expiresInMs).toBeLessThanOrEqual(550);
      // storage layout: the three holders refer to the session, and carry its expiry exactly; the fourth to none
      expect(await store.boundHolders?.()).toEqual({ bound: 3, expiries: 1, sameExpiry: true, unbound: 1 });
    });

    it('a session that runs out frees all its leases, with their lock-delay (I8); the next grant has a higher token; keepAlive says false', async () => {
      const store = h.store();
      const b = store.backend();
      const other = store.backend();
      const { id } = await b.sessions!.open(300);
      const tokens = [];
      for (const k of ['exp/1', 'exp/2']) tokens.push(granted(await b.acquire(request(k, `o-${k}`, { ttlMs: 300, session: id }))));
      const delayed = granted(await b.acquire(request('exp/delay', 'o-delay', { ttlMs: 300, session: id, lockDelayMs: 60_000 })));
      expect((await other.acquire(request('exp/1', 'x'))).granted).toBe(false);
      await sleep(400);
      expect(await b.sessions!.keepAlive(id, 300)).toBe(false);
      expect(granted(await other.acquire(request('exp/1', 'x')))).toBeGreaterThan(tokens[0]!);
      expect(granted(await other.acquire(request('exp/2', 'x')))).toBeGreaterThan(tokens[1]!);
      // a session that ran out is not "closed": its leases' lock-delay runs
      await b.sessions!.close(id);
      expect((await other.acquire(request('exp/delay', 'x'))).granted).toBe(false);
      const [state] = await other.inspect('exp/delay');
      expect(state?.lockDelayRemainingMs).toBeGreaterThan(50_000);
      expect(state?.lastToken).toBe(delayed);
    });

    it('renewing a session-bound lease keeps its session alive, with every lease of it; releasing one frees only that one', async () => {
      const b = h.store().backend();
      const { id } = await b.sessions!.open(600);
      const t1 = granted(await b.acquire(request('rn/1', 'o1', { ttlMs: 600, session: id })));
      granted(await b.acquire(request('rn/2', 'o2', { ttlMs: 600, session: id })));
      await sleep(400);
      expect(await b.renew({ key: 'rn/1', owner: 'o1', token: t1, mode: 'exclusive', ttlMs: 600 })).toEqual({ renewed: true, ttlMs: 600 });
      await sleep(400); // past the first expiry: alive thanks to the renewal
      expect((await b.inspect('rn/')).map((s) => s.holders.length)).toEqual([1, 1]);
      await b.release({ key: 'rn/1', owner: 'o1', token: t1, mode: 'exclusive' });
      expect((await b.inspect('rn/')).map((s) => s.key)).toEqual(['rn/2']);
      expect(await b.renew({ key: 'rn/1', owner: 'o1', token: t1, mode: 'exclusive', ttlMs: 600 })).toEqual({ renewed: false });
      expect(await b.renew({ key: 'rn/2', owner: 'o2', token: 99n, mode: 'exclusive', ttlMs: 600 })).toEqual({ renewed: false }); // another token
      expect(await b.sessions!.keepAlive(id, 600)).toBe(true);
      // once the session is closed, its former lease cannot be renewed
      const t2 = (await b.inspect('rn/2'))[0]!.holders[0]!.token;
      await b.sessions!.close(id);
      expect(await b.renew({ key: 'rn/2', owner: 'o2', token: t2, mode: 'exclusive', ttlMs: 600 })).toEqual({ renewed: false });
    });

    it('storage layout: sessions that ran out are deleted by the next open (the table does not grow)', async () => {
      const store = h.store();
      const b = store.backend();
      for (let i = 0; i < 5; i++) await b.sessions!.open(50);
      await b.sessions!.open(60_000);
      expect(await store.sessionRows()).toBeGreaterThanOrEqual(1);
      await sleep(100);
      await b.sessions!.open(60_000);
      expect(await store.sessionRows()).toBe(2);
    });
  });
}

/**
 * Sessions on MySQL / MariaDB: one keep-alive per client and ttl moves the session's expiry and
 * every bound holder's (by the server's clock) in one CALL; a session that runs out frees its leases
 * (with their lock-delay), one that is closed frees them at once and wakes their waiters (the keys'
 * change counters move: other processes' pollers see it, this instance's waiters hear at once); an
 * acquire naming a gone session writes nothing. Also the upgrade of a leasehold-locks-mysql/1 store
 * in place, by the backend and by mysqlSchemaSql as a migration. Some tests read the tables (the
 * storage layout is their subject).
 */
import { readFileSync } from 'node:fs';
import mysql from 'mysql2/promise';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import type { AcquireRequest, AcquireResult, Backend } from '../../src/core/backend.js';
import { Locks } from '../../src/core/locks.js';
import { mysqlBackend, mysqlSchemaSql, SCHEMA_VERSION } from '../../src/mysql/index.js';
import { acquireRequest, eventually, MYSQL_URL, sleep, uniqueName } from '../helpers/env.js';
import { recordingPool } from './support.js';

const admin = mysql.createPool({ uri: MYSQL_URL, connectionLimit: 3 });
const tables: string[] = [];
const users: string[] = [];
let opened: { close(): Promise<void> }[] = [];

function freshTable(): string {
  const t = uniqueName('lh_mys');
  tables.push(t);
  return t;
}

function track<T extends { close(): Promise<void> }>(thing: T): T {
  opened.push(thing);
  return thing;
}

/** A backend of its own pool (as another process would have) on the given table, closed after the test. */
function backend(table: string, extra: Record<string, unknown> = {}): Backend {
  return track(mysqlBackend({ uri: MYSQL_URL, table, poolSize: 3, ...extra }));
}

function granted(result: AcquireResult): bigint {
  if (!result.granted) throw new Error(`expected a grant, got ${JSON.stringify(result)}`);
  return result.token;
}

const request = (key: string, owner: string, extra: Partial<AcquireRequest> = {}): AcquireRequest => acquireRequest(key, owner, extra);

async function rows(sql: string, values: unknown[] = []): Promise<Record<string, unknown>[]> {
  const [result] = await admin.query(sql, values);
  return result as Record<string, unknown>[];
}

/** The keys' rows as the tables hold them (token counters and change counters), in key order. */
const keyRows = (table: string) =>
  rows(`SELECT CAST(\`key\` AS CHAR) AS k, CAST(last_token AS CHAR) AS t, CAST(version AS CHAR) AS v FROM \`${table}_keys\` ORDER BY 1`);

afterEach(async () => {
  await Promise.allSettled(opened.map((o) => o.close()));
  opened = [];
});

afterAll(async () => {
  for (const t of tables) {
    for (const suffix of ['', '_keys', '_waiters', '_sessions']) await admin.query(`DROP TABLE IF EXISTS \`${t}${suffix}\``).catch(() => {});
    for (const suffix of ['_acquire', '_release', '_cancel', '_keepalive', '_session_end']) {
      await admin.query(`DROP PROCEDURE IF EXISTS \`${t}${suffix}\``).catch(() => {});
    }
  }
  for (const u of users) await admin.query(`DROP USER IF EXISTS '${u}'@'%', '${u}'@'localhost'`).catch(() => {});
  await admin.end();
});

describe('mysql sessions', () => {
  it('a keep-alive extends every lease of the session (inspect shows expiresInMs refreshed), not the leases of others', async () => {
    const table = freshTable();
    const b = backend(table);
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
    // storage layout: the three holders refer to the session, and carry its expiry exactly
    const [layout] = await rows(
      `SELECT COUNT(*) AS n, COUNT(DISTINCT h.expires_at) AS expiries, MIN(h.expires_at = s.expires_at) AS same
       FROM \`${table}\` h JOIN \`${table}_sessions\` s ON s.id = h.\`session\``,
    );
    expect(layout).toEqual({ n: 3, expiries: 1, same: 1 });
    expect(await rows(`SELECT COUNT(*) AS n FROM \`${table}\` WHERE \`session\` IS NULL`)).toEqual([{ n: 1 }]);
  });

  it('a session that runs out frees all its leases, with their lock-delay (I8); the next grant has a higher token; keepAlive says false', async () => {
    const table = freshTable();
    const b = backend(table);
    const other = backend(table);
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

  it("closing a session frees all its leases at once (no lock-delay) and wakes another process's waiter through its poller", async () => {
    const table = freshTable();
    const a = backend(table);
    const w = backend(table);
    const { id } = await a.sessions!.open(30_000);
    const held = granted(await a.acquire(request('close/1', 'holder', { ttlMs: 30_000, session: id, lockDelayMs: 60_000 })));
    granted(await a.acquire(request('close/2', 'holder', { ttlMs: 30_000, session: id, lockDelayMs: 60_000 })));
    const busy = await w.acquire(request('close/1', 'waiter'));
    if (busy.granted) throw new Error('expected busy');
    expect(busy.retryInMs).toBeGreaterThan(20_000); // nothing would end the wait by itself for a long time
    // The hook fires only when the key's change counter passes the busy answer's: the wake is the close's.
    let woken = 0;
    const off = await w.subscribe!('close/1', () => woken++, busy.cursor);
    await sleep(100); // ten poll rounds
    expect(woken).toBe(0);
    const [before] = await keyRows(table);
    await a.sessions!.close(id);
    expect(await eventually(() => woken > 0, 5_000)).toBe(true);
    off();
    const [after] = await keyRows(table);
    expect(BigInt(String(after!.v))).toBe(BigInt(String(before!.v)) + 1n);
    expect(granted(await w.acquire(request('close/1', 'waiter')))).toBeGreaterThan(held);
    expect((await w.acquire(request('close/2', 'waiter'))).granted).toBe(true);
    expect((await w.inspect('close/')).map((s) => s.lockDelayRemainingMs)).toEqual([0, 0]);
    expect(await a.sessions!.keepAlive(id, 30_000)).toBe(false);
    await a.sessions!.close(id); // idempotent
    expect(await rows(`SELECT COUNT(*) AS n FROM \`${table}_sessions\``)).toEqual([{ n: 0 }]);
  });

  it("closing a session wakes the same instance's waiter at once, without a poll round (pollMs 60 s)", async () => {
    const table = freshTable();
    const b = backend(table, { pollMs: 60_000 });
    const { id } = await b.sessions!.open(30_000);
    granted(await b.acquire(request('local/1', 'holder', { ttlMs: 30_000, session: id })));
    const busy = await b.acquire(request('local/1', 'waiter'));
    if (busy.granted) throw new Error('expected busy');
    let woken = 0;
    const off = await b.subscribe!('local/1', () => woken++, busy.cursor);
    await b.sessions!.close(id);
    expect(woken).toBe(1); // told as the close resolved, before any poll round could run
    off();
    expect((await b.acquire(request('local/1', 'waiter'))).granted).toBe(true);
  });

  it('a Locks waiter is served when the session holding its key ends; the holding Locks client sees its leases lost', async () => {
    const table = freshTable();
    const raw = backend(table);
    const s = raw.sessions!;
    let sessionId = '';
    const spied: Backend = Object.create(raw) as Backend;
    Object.defineProperty(spied, 'sessions', {
      value: {
        open: async (ttl: number) => {
          const opened = await s.open(ttl);
          sessionId = opened.id;
          return opened;
        },
        keepAlive: (id: string, ttl: number) => s.keepAlive(id, ttl),
        close: (id: string) => s.close(id),
      },
    });
    const holder = track(new Locks({ backend: spied }));
    const waiter = track(new Locks({ backend: backend(table) }));
    const leases = await Promise.all(['lw/1', 'lw/2'].map((k) => holder.acquire(k, { ttlMs: 3_000 })));
    const waiting = waiter.acquire('lw/2', { ttlMs: 3_000, waitMs: 10_000 });
    await eventually(async () => (await waiter.inspect('lw/2'))[0]?.waiters === 1, 5_000);
    await s.close(sessionId); // an operator ends the session behind the holder's back
    const lease = await waiting;
    expect(lease.token).toBeGreaterThan(leases[1]!.token);
    expect(await waiter.tryAcquire('lw/1', { ttlMs: 1_000 })).not.toBeNull();
    // its next keep-alive (within ttl/3) finds the session gone
    expect(await eventually(() => leases.every((l) => l.signal.aborted), 5_000)).toBe(true);
  });

  it('an acquire naming a session that is gone answers sessionLost and writes nothing', async () => {
    const table = freshTable();
    const b = backend(table);
    const { id } = await b.sessions!.open(10_000);
    granted(await b.acquire(request('lost/busy', 'holder')));
    await b.sessions!.close(id);
    const before = await keyRows(table);
    const holdersBefore = await rows(`SELECT CAST(\`key\` AS CHAR) AS k, CAST(owner AS CHAR) AS o, expires_at FROM \`${table}\` ORDER BY 1`);
    for (const session of [id, 'never-opened', 'x'.repeat(65)]) {
      expect(await b.acquire(request('lost/free', 'o', { session }))).toEqual({ granted: false, sessionLost: true });
      expect(await b.acquire(request('lost/busy', 'o', { session, queue: true }))).toEqual({ granted: false, sessionLost: true });
      expect(await b.acquire(request('lost/busy', 'holder', { session }))).toEqual({ granted: false, sessionLost: true }); // not even its own grant back
    }
    expect(await keyRows(table)).toEqual(before);
    expect(await rows(`SELECT CAST(\`key\` AS CHAR) AS k, CAST(owner AS CHAR) AS o, expires_at FROM \`${table}\` ORDER BY 1`)).toEqual(holdersBefore);
    expect(await rows(`SELECT COUNT(*) AS n FROM \`${table}_waiters\``)).toEqual([{ n: 0 }]);
    // and the other calls on unknown ids answer as for a gone session
    expect(await b.sessions!.keepAlive('never-opened', 1_000)).toBe(false);
    expect(await b.sessions!.keepAlive('x'.repeat(65), 1_000)).toBe(false);
    await b.sessions!.close('x'.repeat(65));
  });

  it('renewing a session-bound lease keeps its session alive, with every lease of it; releasing one frees only that one', async () => {
    const b = backend(freshTable());
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

  it("a release whose connection was lost is asked again by core's session: the holder does not live on with its session", async () => {
    const inner = mysql.createPool({ uri: MYSQL_URL, connectionLimit: 3 });
    track({ close: () => inner.end() });
    // A pool whose connection drops the first release statement unsent, as a killed connection does.
    let drops = 1;
    let releaseCalls = 0;
    const pool = {
      async getConnection() {
        const c = await inner.getConnection();
        const query = (sql: unknown, values?: unknown) => {
          const text = typeof sql === 'string' ? sql : String((sql as { sql: string }).sql);
          if (text.startsWith('CALL') && text.includes('_release')) {
            releaseCalls++;
            if (drops > 0) {
              drops--;
              return Promise.reject(
                Object.assign(new Error('Connection lost: The server closed the connection.'), { code: 'PROTOCOL_CONNECTION_LOST', fatal: true }),
              );
            }
          }
          return (c.query as unknown as (s: unknown, v?: unknown) => Promise<[unknown, unknown]>).call(c, sql, values);
        };
        return { query, release: () => c.release(), destroy: () => c.destroy(), threadId: c.threadId };
      },
      query: (sql: string, values?: unknown) => (inner.query as unknown as (s: string, v?: unknown) => Promise<[unknown, unknown]>).call(inner, sql, values),
    };
    const table = freshTable();
    const locks = track(new Locks({ backend: mysqlBackend({ pool, table }) }));
    const lost = await locks.acquire('bg/lost', { ttlMs: 1_000 });
    await locks.acquire('bg/kept', { ttlMs: 1_000 }); // held throughout: its session's keep-alives go on
    await expect(lost.release()).rejects.toMatchObject({ code: 'BACKEND_UNAVAILABLE' });
    expect(drops).toBe(0);
    // the session is kept alive (its other lease is held), yet the released key goes: core asks again
    expect(await eventually(async () => (await locks.inspect('bg/')).map((s) => s.key).join() === 'bg/kept', 5_000)).toBe(true);
    expect(releaseCalls).toBeGreaterThanOrEqual(2);
    await sleep(1_200); // past the session's first expiry: kept alive
    expect((await locks.inspect('bg/')).map((s) => s.key)).toEqual(['bg/kept']);
    expect((await backend(table).acquire(request('bg/lost', 'other'))).granted).toBe(true);
  });

  it('a Locks client holding 200 leases sends one keep-alive statement per interval and no renewals', async () => {
    const inner = mysql.createPool({ uri: MYSQL_URL, connectionLimit: 8 });
    track({ close: () => inner.end() });
    const { pool, statements } = recordingPool(inner);
    const raw = track(mysqlBackend({ pool, table: freshTable() }));
    // counts calls to the Backend interface, as the conformance suite does
    const counts: Record<string, number> = {};
    const bump = (name: string): void => {
      counts[name] = (counts[name] ?? 0) + 1;
    };
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
    const locks = track(new Locks({ backend: wrapped }));
    // the first keep-alive queues in the pool behind the 200 grants: the ttl leaves them room on a busy machine
    const ttlMs = 2_000;
    const leases = await Promise.all(Array.from({ length: 200 }, (_, i) => locks.acquire(`many/${i}`, { ttlMs })));
    expect(counts.open).toBe(1);
    const keepAlivesBefore = counts.keepAlive ?? 0;
    statements.length = 0;
    await sleep(2 * ttlMs); // ~6 intervals of ttl/3
    const keepAlives = (counts.keepAlive ?? 0) - keepAlivesBefore;
    expect(keepAlives).toBeGreaterThanOrEqual(3);
    expect(keepAlives).toBeLessThanOrEqual(12); // ≈ 6, not 200 × 6
    expect(counts.renew ?? 0).toBe(0);
    // every statement sent meanwhile is a keep-alive CALL, one per interval
    expect(statements.length).toBe(keepAlives);
    expect(statements.every((t) => t.startsWith('CALL') && t.includes('_keepalive'))).toBe(true);
    expect(leases.every((l) => l.held)).toBe(true);
    // and the coordinator agrees: every holder is there, its expiry moved by the keep-alives
    const states = await locks.inspect('many/');
    expect(states).toHaveLength(200);
    expect(states.every((k) => k.holders.length === 1 && k.holders[0]!.expiresInMs > ttlMs / 3)).toBe(true);
  });

  it('keep-alives, grants, releases and ends of four sessions racing on shared keys: no failure, one holder per key at most, every key free at the end', async () => {
    const table = freshTable();
    const clients = Array.from({ length: 4 }, () => backend(table));
    const ids = await Promise.all(clients.map(async (b) => (await b.sessions!.open(5_000)).id));
    const keys = Array.from({ length: 6 }, (_, i) => `race/${i}`);
    const failures: unknown[] = [];
    const stopAt = performance.now() + 2_000;
    const work = clients.map(async (b, c) => {
      let round = 0;
      while (performance.now() < stopAt) {
        round++;
        try {
          if (round % 5 === 0) {
            expect(await b.sessions!.keepAlive(ids[c]!, 5_000)).toBe(true);
            continue;
          }
          const k = keys[(round * 7 + c) % keys.length]!;
          const owner = `c${c}-${k}`;
          const r = await b.acquire(request(k, owner, { ttlMs: 5_000, session: ids[c] }));
          if (r.granted && round % 3 === 0) await b.release({ key: k, owner, token: r.token, mode: 'exclusive' });
          if (round % 40 === 0) {
            await b.sessions!.close(ids[c]!);
            ids[c] = (await b.sessions!.open(5_000)).id;
          }
        } catch (error) {
          failures.push(error);
        }
      }
    });
    await Promise.all(work);
    expect(failures).toEqual([]);
    for (const state of await clients[0]!.inspect('race/')) expect(state.holders.length).toBeLessThanOrEqual(1);
    for (let c = 0; c < clients.length; c++) await clients[c]!.sessions!.close(ids[c]!);
    expect(await clients[0]!.inspect('race/')).toEqual([]);
    expect(await rows(`SELECT COUNT(*) AS n FROM \`${table}\``)).toEqual([{ n: 0 }]);
  });

  it('sessions: false offers none; each lease is renewed on its own', async () => {
    const b = backend(freshTable(), { sessions: false });
    expect(b.sessions).toBeUndefined();
    expect(() => mysqlBackend({ uri: MYSQL_URL, sessions: 'yes' } as never)).toThrow(/sessions/);
    await b.inspect(''); // the tables first: a lease's validity counts from its request, which would include their creation
    const locks = track(new Locks({ backend: b }));
    let renewals = 0;
    locks.on('renewed', () => renewals++);
    const lease = await locks.acquire('nosess', { ttlMs: 1_000 });
    await sleep(1_500);
    expect(lease.held).toBe(true);
    expect(renewals).toBeGreaterThanOrEqual(2);
  });

  it('storage layout: sessions that ran out are deleted by the next open (the table does not grow)', async () => {
    const table = freshTable();
    const b = backend(table);
    for (let i = 0; i < 5; i++) await b.sessions!.open(50);
    await b.sessions!.open(60_000);
    const count = async () => Number((await rows(`SELECT COUNT(*) AS n FROM \`${table}_sessions\``))[0]!.n);
    expect(await count()).toBeGreaterThanOrEqual(1);
    await sleep(100);
    await b.sessions!.open(60_000);
    expect(await count()).toBe(2);
  });

  describe('a leasehold-locks-mysql/1 store', () => {
    /** A store as leasehold-locks-mysql/1 made it (the fixture), with a live lease it granted (token 7 of key 'old'). */
    async function v1Store(): Promise<string> {
      const table = freshTable();
      const ddl = readFileSync(new URL('../fixtures/mysql-schema-v1.sql', import.meta.url), 'utf8').replaceAll('lh_v1_table', table);
      const migrator = await mysql.createConnection({ uri: MYSQL_URL, multipleStatements: true });
      try {
        await migrator.query(ddl);
      } finally {
        await migrator.end();
      }
      expect(await routines(table)).toEqual([
        { name: `${table}_acquire`, version: 'leasehold-locks-mysql/1' },
        { name: `${table}_cancel`, version: '' },
        { name: `${table}_release`, version: '' },
      ]);
      await admin.query(`INSERT INTO \`${table}_keys\` (\`key\`, last_token) VALUES ('old', 7)`);
      await admin.query(`INSERT INTO \`${table}\` (\`key\`, owner, mode, token, holder, acquired_at, expires_at)
        VALUES ('old', 'old-owner', 'exclusive', 7, 'old-holder', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE)`);
      return table;
    }

    const routines = (table: string) =>
      rows(
        `SELECT ROUTINE_NAME AS name, ROUTINE_COMMENT AS version FROM information_schema.ROUTINES
         WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_NAME LIKE ? ORDER BY 1`,
        [`${table}\\_%`],
      );

    /** The session column and the index on it, as information_schema sees them. */
    const layout = async (table: string) => ({
      column: await rows(
        `SELECT COLUMN_TYPE AS type, IS_NULLABLE AS nullable FROM information_schema.COLUMNS
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = 'session'`,
        [table],
      ),
      index: await rows(
        `SELECT INDEX_NAME AS name, COLUMN_NAME AS col FROM information_schema.STATISTICS
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND INDEX_NAME = 'by_session'`,
        [table],
      ),
    });

    /** What the upgraded store must do: keep the /1 lease, and offer sessions. */
    async function usable(b: Backend): Promise<void> {
      expect(await b.acquire(request('old', 'new-owner'))).toMatchObject({ granted: false, holder: 'old-holder' });
      expect(await b.renew({ key: 'old', owner: 'old-owner', token: 7n, mode: 'exclusive', ttlMs: 60_000 })).toEqual({ renewed: true, ttlMs: 60_000 });
      const { id } = await b.sessions!.open(5_000);
      granted(await b.acquire(request('new', 'o', { session: id, ttlMs: 5_000 })));
      expect(await b.sessions!.keepAlive(id, 5_000)).toBe(true);
      await b.release({ key: 'old', owner: 'old-owner', token: 7n, mode: 'exclusive' });
      expect(granted(await b.acquire(request('old', 'new-owner', { session: id })))).toBe(8n);
      await b.sessions!.close(id);
      expect(await b.inspect('')).toEqual([]);
    }

    const expectedRoutines = (table: string) => [
      { name: `${table}_acquire`, version: SCHEMA_VERSION },
      { name: `${table}_cancel`, version: '' },
      { name: `${table}_keepalive`, version: '' },
      { name: `${table}_release`, version: '' },
      { name: `${table}_session_end`, version: '' },
    ];

    it('is upgraded in place by the backend: its live holder stays, sessions work; a second start runs no DDL', async () => {
      const table = await v1Store();
      expect((await layout(table)).column).toEqual([]);
      await usable(backend(table));
      expect(await routines(table)).toEqual(expectedRoutines(table));
      expect(SCHEMA_VERSION).toBe('leasehold-locks-mysql/3');
      expect(await layout(table)).toEqual({ column: [{ type: 'varbinary(64)', nullable: 'YES' }], index: [{ name: 'by_session', col: 'session' }] });
      // a second start (another process) finds the current version and sends no DDL
      const inner = mysql.createPool({ uri: MYSQL_URL, connectionLimit: 2 });
      track({ close: () => inner.end() });
      const { pool, statements } = recordingPool(inner);
      const again = track(mysqlBackend({ pool, table }));
      expect((await again.acquire(request('k', 'third'))).granted).toBe(true);
      expect(statements.filter((s) => /\b(CREATE|ALTER|DROP|PREPARE|GET_LOCK)\b/.test(s))).toEqual([]);
    });

    it('is upgraded in place by mysqlSchemaSql as a migration (run twice), then used with createSchema: false by a user with only the grants listed', async () => {
      const table = await v1Store();
      const stale = backend(table, { createSchema: false });
      await expect(stale.acquire(request('k', 'o'))).rejects.toThrow(/at version leasehold-locks-mysql\/1, expected leasehold-locks-mysql\/3/);
      const migrator = await mysql.createConnection({ uri: MYSQL_URL, multipleStatements: true });
      try {
        await migrator.query(mysqlSchemaSql({ table }));
        await migrator.query(mysqlSchemaSql({ table })); // idempotent: the column is added once
      } finally {
        await migrator.end();
      }
      expect(await routines(table)).toEqual(expectedRoutines(table));
      expect((await layout(table)).index).toEqual([{ name: 'by_session', col: 'session' }]);
      const user = uniqueName('lh_ses').slice(0, 32);
      users.push(user);
      for (const host of ['%', 'localhost']) {
        await admin.query(`CREATE USER '${user}'@'${host}'`);
        for (const t of [table, `${table}_keys`, `${table}_waiters`, `${table}_sessions`]) {
          await admin.query(`GRANT SELECT, INSERT, UPDATE, DELETE ON \`${t}\` TO '${user}'@'${host}'`);
        }
        for (const p of ['acquire', 'release', 'cancel', 'keepalive', 'session_end']) {
          await admin.query(`GRANT EXECUTE ON PROCEDURE \`${table}_${p}\` TO '${user}'@'${host}'`);
        }
      }
      const url = new URL(MYSQL_URL);
      url.username = user;
      url.password = '';
      await usable(backend(table, { uri: url.toString(), createSchema: false }));
    });
  });

  it('mysqlSchemaSql() has the sessions table, the guarded ALTER and the five procedures', () => {
    const sql = mysqlSchemaSql({ table: 't' });
    expect(sql).toContain('CREATE TABLE IF NOT EXISTS `t_sessions`');
    expect(sql).toContain(
      "TABLE_NAME = 't' AND COLUMN_NAME = 'session'), 'DO 0', 'ALTER TABLE `t` ADD COLUMN `session` VARBINARY(64) NULL, ADD KEY by_session (`session`)')",
    );
    for (const p of ['acquire', 'release', 'cancel', 'keepalive', 'session_end']) expect(sql).toContain(`CREATE PROCEDURE \`t_${p}\``);
    expect(sql).toContain("COMMENT 'leasehold-locks-mysql/3'");
    expect(() => mysqlSchemaSql({ table: 'x'.repeat(53) })).toThrow(/at most 52 characters/);
    expect(mysqlSchemaSql({ table: 'x'.repeat(52) })).toContain(`\`${'x'.repeat(52)}_session_end\``);
  });
});

/**
 * Sessions on MySQL / MariaDB. The cases the SQL backends share run from
 * ../helpers/backend-sessions.ts on fresh tables each: one keep-alive per client and ttl moves the
 * session's expiry and every bound holder's (by the server's clock) in one CALL; a session that runs
 * out frees its leases (with their lock-delay), one that is closed frees them at once and wakes their
 * waiters (the keys' change counters move: other processes' pollers see it); an acquire naming a gone
 * session writes nothing. Here, what is MySQL's own: this instance's waiters hear a close at once, a
 * release whose connection was lost, sessions racing on shared keys, the upgrade of a
 * leasehold-locks-mysql/1 store in place (by the backend and by mysqlSchemaSql as a migration), and
 * the schema SQL. Some tests read the tables (the storage layout is their subject).
 */
import { readFileSync } from 'node:fs';
import mysql from 'mysql2/promise';
import { afterAll, describe, expect, it } from 'vitest';
import type { Backend } from '../../src/core/backend.js';
import { Locks } from '../../src/core/locks.js';
import { mysqlBackend, mysqlSchemaSql, SCHEMA_VERSION } from '../../src/mysql/index.js';
import { backendSessionCases, closedAfterEach, granted, type SessionStore } from '../helpers/backend-sessions.js';
import { acquireRequest as request, eventually, MYSQL_URL, sleep, uniqueName } from '../helpers/env.js';
import { dropLeaseTables, recordingPool } from './support.js';

const admin = mysql.createPool({ uri: MYSQL_URL, connectionLimit: 3 });
const tables: string[] = [];
const users: string[] = [];
/** Closes what it is given after the test: backends, Locks clients, pools. */
const track = closedAfterEach();

function freshTable(): string {
  const t = uniqueName('lh_mys');
  tables.push(t);
  return t;
}

/** A backend of its own pool (as another process would have) on the given table, closed after the test. */
function backend(table: string, extra: Record<string, unknown> = {}): Backend {
  return track(mysqlBackend({ uri: MYSQL_URL, table, poolSize: 3, ...extra }));
}

async function rows(sql: string, values: unknown[] = []): Promise<Record<string, unknown>[]> {
  const [result] = await admin.query(sql, values);
  return result as Record<string, unknown>[];
}

const count = async (sql: string): Promise<number> => Number((await rows(sql))[0]!.n);

afterAll(async () => {
  for (const t of tables) await dropLeaseTables(t).catch(() => {});
  for (const u of users) await admin.query(`DROP USER IF EXISTS '${u}'@'%', '${u}'@'localhost'`).catch(() => {});
  await admin.end();
});

/** Fresh tables, and the tests' reads of them. */
function store(): SessionStore {
  const table = freshTable();
  return {
    backend: (extra) => backend(table, extra),
    sessionRows: () => count(`SELECT COUNT(*) AS n FROM \`${table}_sessions\``),
    waiterRows: () => count(`SELECT COUNT(*) AS n FROM \`${table}_waiters\``),
    // the keys' token counters and change counters, and the holders
    snapshot: async () => [
      await rows(`SELECT CAST(\`key\` AS CHAR) AS k, CAST(last_token AS CHAR) AS t, CAST(version AS CHAR) AS v FROM \`${table}_keys\` ORDER BY 1`),
      await rows(`SELECT CAST(\`key\` AS CHAR) AS k, CAST(owner AS CHAR) AS o, expires_at FROM \`${table}\` ORDER BY 1, 2`),
    ],
    changeCounter: async (key) => BigInt(String((await rows(`SELECT CAST(version AS CHAR) AS v FROM \`${table}_keys\` WHERE \`key\` = ?`, [key]))[0]!.v)),
    boundHolders: async () => {
      const [layout] = await rows(
        `SELECT COUNT(*) AS n, COUNT(DISTINCT h.expires_at) AS expiries, MIN(h.expires_at = s.expires_at) AS same
         FROM \`${table}\` h JOIN \`${table}_sessions\` s ON s.id = h.\`session\``,
      );
      const unbound = await count(`SELECT COUNT(*) AS n FROM \`${table}\` WHERE \`session\` IS NULL`);
      return { bound: Number(layout!.n), expiries: Number(layout!.expiries), sameExpiry: Number(layout!.same) === 1, unbound };
    },
  };
}

backendSessionCases('mysql', {
  store,
  wakeBy: 'through its poller',
  serverClock: true,
  keepAliveEntry: 'CALL',
  isKeepAlive: (text) => text.startsWith('CALL') && text.includes('_keepalive'),
  recording() {
    const inner = mysql.createPool({ uri: MYSQL_URL, connectionLimit: 8 });
    track({ close: () => inner.end() });
    const { pool, statements } = recordingPool(inner);
    return { backend: track(mysqlBackend({ pool, table: freshTable() })), sent: statements };
  },
});

describe('mysql sessions: MySQL only', () => {
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

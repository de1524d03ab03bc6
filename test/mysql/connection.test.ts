/**
 * Killed connections (issue 18, point 4): `KILL CONNECTION <id>` from another session on the
 * backend's pooled connections, idle and while operations run, and on the connection of a
 * mysqlFence write. The next operations succeed (the pool replaces the connection) or fail with
 * BackendUnavailableError and then recover; tokens keep rising and never repeat; a held lease keeps
 * renewing; a KILL inside a fenced write rolls it back (no mark raised without the mutation); and
 * nothing ends as an unhandled rejection or an unhandled 'error' event.
 *
 * On a MariaDB of the test's own (./server.ts); the backend logs in as a user of its own, so its
 * connections are told apart from the test's in PROCESSLIST by USER.
 */
import mysql from 'mysql2/promise';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Backend } from '../../src/core/backend.js';
import { BackendUnavailableError } from '../../src/core/errors.js';
import { createLocks, type Locks } from '../../src/index.js';
import { mysqlBackend, mysqlFence } from '../../src/mysql/index.js';
import { eventually, sleep, uniqueName } from '../helpers/env.js';
import { connectionIds, errorOf, killConnections, untilAvailable, within } from './faults.js';
import { startMariaDb, type MariaDb } from './server.js';

/** The MySQL user the backends log in as (only theirs are killed). */
const BACKEND_USER = 'lh_backend';
const BOUND_MS = 20_000;

const unhandled: unknown[] = [];
const onUnhandled = (reason: unknown): void => {
  unhandled.push(reason);
};
process.on('unhandledRejection', onUnhandled);
process.on('uncaughtException', onUnhandled);

let server: MariaDb | undefined;
let admin: mysql.Pool | undefined;
let backendUrl = '';
const opened: Locks[] = [];
const pools: mysql.Pool[] = [];

beforeAll(async () => {
  server = await startMariaDb();
  admin = mysql.createPool({ uri: server.url, connectionLimit: 2 });
  backendUrl = await server.addUser(BACKEND_USER);
}, 120_000);

afterAll(async () => {
  for (const locks of opened) await within(locks.close(), BOUND_MS);
  for (const pool of pools) await within(pool.end(), BOUND_MS);
  await admin?.end();
  await server?.destroy();
  process.off('unhandledRejection', onUnhandled);
  process.off('uncaughtException', onUnhandled);
}, 120_000);

function userPool(url: string): mysql.Pool {
  const pool = mysql.createPool({ uri: url, connectionLimit: 4 });
  pools.push(pool);
  return pool;
}

const variants: [string, (table: string) => Backend][] = [
  ['{ uri }', (table) => mysqlBackend({ uri: backendUrl, table })],
  ['{ pool } (the user’s own)', (table) => mysqlBackend({ pool: userPool(backendUrl), table })],
];

function open(backend: Backend): Locks {
  const locks = createLocks({ backend });
  opened.push(locks);
  return locks;
}

describe('mysql: killed connections', () => {
  it.each(variants)(
    '%s: idle pooled connections killed; the next operations work (or fail typed, then recover), a held lease keeps renewing',
    async (_name, make) => {
      const locks = open(make(uniqueName('lh_idle')));
      const renewedAt: number[] = [];
      locks.on('renewed', () => renewedAt.push(performance.now()));
      const held = await locks.acquire('held', { ttlMs: 3_000 });
      const tokens: bigint[] = [];
      for (let i = 0; i < 5; i++) {
        const lease = await locks.acquire('cycled', { ttlMs: 5_000 });
        tokens.push(lease.token);
        await lease.release();
      }
      const ids = await connectionIds(admin!, BACKEND_USER);
      expect(ids.length).toBeGreaterThan(0);
      expect(await killConnections(admin!, ids)).toBeGreaterThan(0);
      const killedAt = performance.now();

      const unavailable: BackendUnavailableError[] = [];
      for (let i = 0; i < 5; i++) {
        const got = await untilAvailable(() => locks.acquire('cycled', { ttlMs: 5_000, waitMs: 5_000 }), 10_000);
        unavailable.push(...got.unavailable);
        tokens.push(got.value.token);
        await untilAvailable(() => got.value.release(), 10_000);
      }
      // Recovered at once: at most one failed call per killed connection, then none.
      expect(unavailable.length).toBeLessThanOrEqual(ids.length);
      for (let i = 1; i < tokens.length; i++) expect(tokens[i]!).toBeGreaterThan(tokens[i - 1]!);
      // The killed connections are gone from the server; the pool opened new ones.
      const now = await connectionIds(admin!, BACKEND_USER);
      expect(now.filter((id) => ids.includes(id))).toEqual([]);
      // The held lease renewed after the KILL and is still valid.
      expect(await eventually(() => renewedAt.some((t) => t > killedAt), 5_000, 20)).toBe(true);
      expect(held.signal.aborted).toBe(false);
      await held.release();
    },
    60_000,
  );

  it('connections killed again and again while operations run: failures are BackendUnavailableError only, tokens rise and never repeat, a held lease survives, then all works', async () => {
    const locks = open(mysqlBackend({ uri: backendUrl, table: uniqueName('lh_storm') }));
    const held = await locks.acquire('held', { ttlMs: 4_000 });
    const errors: unknown[] = [];
    const tokensByKey = new Map<string, bigint[]>();
    let storming = true;

    const worker = async (key: string): Promise<void> => {
      const tokens: bigint[] = [];
      tokensByKey.set(key, tokens);
      while (storming) {
        try {
          // ttl 1 s: a grant whose answer was lost to a KILL frees itself soon; waitMs covers that.
          const lease = await locks.acquire(key, { ttlMs: 1_000, waitMs: 10_000 });
          tokens.push(lease.token);
          await lease.release().catch((e: unknown) => errors.push(e));
        } catch (error) {
          errors.push(error);
          await sleep(20);
        }
      }
    };
    const storm = async (): Promise<number> => {
      let kills = 0;
      const end = performance.now() + 3_000;
      while (performance.now() < end) {
        kills += await killConnections(admin!, await connectionIds(admin!, BACKEND_USER));
        await sleep(100);
      }
      return kills;
    };
    const workers = ['k1', 'k2', 'k3', 'k4'].map(worker);
    const kills = await storm();
    storming = false;
    expect(await within(Promise.all(workers), 30_000)).not.toBe('hung');

    expect(kills).toBeGreaterThan(5);
    const unexpected = errors.filter((e) => !(e instanceof BackendUnavailableError));
    expect(unexpected).toEqual([]);
    for (const [key, tokens] of tokensByKey) {
      expect(tokens.length, key).toBeGreaterThan(0);
      for (let i = 1; i < tokens.length; i++) expect(tokens[i]!, `${key} grant ${i}`).toBeGreaterThan(tokens[i - 1]!);
    }
    expect(held.signal.aborted).toBe(false);
    expect(held.held).toBe(true);
    // After the storm: a clean round, no error at all.
    for (const key of tokensByKey.keys()) {
      const lease = await locks.acquire(key, { ttlMs: 5_000, waitMs: 5_000 });
      expect(lease.token).toBeGreaterThan(tokensByKey.get(key)!.at(-1)!);
      await lease.release();
    }
    await held.release();
  }, 90_000);

  it('a release lost to a KILL (reads the lease tables’ layout to hold a row lock): the key frees itself within its ttl, though the client’s session lives on', async () => {
    const table = uniqueName('lh_lost_release');
    const locks = open(mysqlBackend({ uri: backendUrl, table }));
    const failed: unknown[] = [];
    locks.on('releaseFailed', (e) => failed.push(e.error));
    const ttlMs = 1_000;
    // Another lease of the same ttl keeps the client's session (if the backend has them) renewed throughout.
    const keep = await locks.acquire('keep', { ttlMs });
    const lease = await locks.acquire('k', { ttlMs });
    // Hold the key's rows so that the release waits on the server, then kill the connection it waits on.
    const blocker = await admin!.getConnection();
    try {
      await blocker.query('START TRANSACTION');
      await blocker.query(`SELECT * FROM \`${table}_keys\` WHERE \`key\` = ? FOR UPDATE`, ['k']);
      await blocker.query(`SELECT * FROM \`${table}\` WHERE \`key\` = ? FOR UPDATE`, ['k']);
      const releasing = lease.release().catch((e: unknown) => e);
      let waiting: number[] = [];
      const seen = await eventually(
        async () => {
          const [rows] = await admin!.query("SELECT ID AS id FROM information_schema.PROCESSLIST WHERE USER = ? AND INFO LIKE '%release%'", [BACKEND_USER]);
          waiting = (rows as { id: number }[]).map((r) => Number(r.id));
          return waiting.length > 0;
        },
        5_000,
        10,
      );
      expect(seen).toBe(true);
      await killConnections(admin!, waiting);
      expect(await releasing).toBeInstanceOf(BackendUnavailableError);
    } finally {
      await blocker.query('ROLLBACK').catch(() => {});
      blocker.release();
    }
    expect(failed).toHaveLength(1);
    // Nobody renews the lost release's lease: another client gets the key once its ttl has run out.
    const other = open(mysqlBackend({ uri: backendUrl, table }));
    const next = await within(other.acquire('k', { ttlMs, waitMs: 6 * ttlMs }), 20_000);
    const got = next === 'hung' ? 'hung' : 'error' in next ? String(next.error) : next.value;
    expect(typeof got === 'string' ? got : 'granted').toBe('granted');
    expect((got as { token: bigint }).token).toBeGreaterThan(lease.token);
    expect(keep.held).toBe(true);
    await keep.release();
  }, 60_000);

  it('a KILL during a mysqlFence write rolls the write back: no mark raised without the mutation; the fence works again after', async () => {
    const pool = userPool(server!.url);
    const docs = uniqueName('docs');
    await admin!.query(`CREATE TABLE ${docs} (id varchar(32) PRIMARY KEY, token bigint NOT NULL) ENGINE=InnoDB`);
    const fence = mysqlFence(pool as never, { table: uniqueName('lh_fence') });
    type Conn = { query(sql: string, values?: unknown): Promise<[unknown, unknown]> };
    const insert = (conn: Conn, id: string, token: bigint) => conn.query(`INSERT INTO ${docs} (id, token) VALUES (?, ?)`, [id, String(token)]);
    const threadOf = async (conn: Conn): Promise<number> => {
      const [rows] = await conn.query('SELECT CONNECTION_ID() AS id');
      return Number((rows as { id: number }[])[0]!.id);
    };
    const rows = async (): Promise<string[]> => ((await admin!.query(`SELECT id FROM ${docs} ORDER BY id`))[0] as { id: string }[]).map((r) => r.id);

    await fence.write('doc', 5n, (conn) => insert(conn as Conn, 'five', 5n));
    expect(await fence.highest('doc')).toBe(5n);

    // Killed after the mutation, before the fence commits: the commit fails, typed; nothing stays.
    const afterMutation = await within(
      fence.write('doc', 7n, async (conn) => {
        await insert(conn as Conn, 'seven', 7n);
        await admin!.query(`KILL CONNECTION ${await threadOf(conn as Conn)}`);
      }),
      BOUND_MS,
    );
    expect(errorOf(afterMutation, 'write killed before its commit')).toBeInstanceOf(BackendUnavailableError);
    expect(await untilAvailable(() => fence.highest('doc'))).toMatchObject({ value: 5n });
    expect(await rows()).toEqual(['five']);

    // Killed while the mutation's own statement runs: the write rejects; nothing stays.
    const duringStatement = await within(
      fence.write('doc', 8n, async (conn) => {
        await insert(conn as Conn, 'eight', 8n);
        const id = await threadOf(conn as Conn);
        setTimeout(() => void admin!.query(`KILL CONNECTION ${id}`).catch(() => {}), 200);
        await (conn as Conn).query('SELECT SLEEP(30)');
      }),
      BOUND_MS,
    );
    errorOf(duringStatement, 'write killed during its statement');
    expect(await untilAvailable(() => fence.highest('doc'))).toMatchObject({ value: 5n });
    expect(await rows()).toEqual(['five']);

    // The pool replaced the connections: the next write commits mark and mutation together.
    await untilAvailable(() => fence.write('doc', 9n, (conn) => insert(conn as Conn, 'nine', 9n)), 10_000);
    expect(await fence.highest('doc')).toBe(9n);
    expect(await rows()).toEqual(['five', 'nine']);
    // And a stale token is still refused after all that.
    const stale = await within(
      fence.write('doc', 8n, (conn) => insert(conn as Conn, 'late', 8n)),
      BOUND_MS,
    );
    expect((errorOf(stale, 'stale write') as { code?: string }).code).toBe('STALE_TOKEN');
    expect(await rows()).toEqual(['five', 'nine']);
  }, 60_000);

  it('no path above left an unhandled rejection or an unhandled error event', async () => {
    await sleep(100);
    expect(unhandled).toEqual([]);
  });
});

/**
 * What the conformance suite does not reach on MySQL / MariaDB: option checks, one round trip per
 * operation, schema creation under concurrent starts and by migration (with the grants the README
 * lists), pools the user owns, deadlocks and lock-wait timeouts retried inside the call, keys as
 * bytes, and a process that exits with its leases held. Some tests read or lock the tables on
 * purpose (their layout is the subject: the lock a deadlock needs, the key bytes stored).
 */
import { execFile, spawn } from 'node:child_process';
import mysql from 'mysql2/promise';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import type { Backend } from '../../src/core/backend.js';
import { BackendUnavailableError, ClosedError, InvalidArgumentError } from '../../src/core/errors.js';
import { Locks } from '../../src/core/locks.js';
import { mysqlBackend, mysqlSchemaSql, SCHEMA_VERSION } from '../../src/mysql/index.js';
import { acquireRequest, eventually, MYSQL_URL, sleep, uniqueName } from '../helpers/env.js';
import { dropLeaseTables, recordingPool } from './support.js';

const admin = mysql.createPool({ uri: MYSQL_URL, connectionLimit: 4 });
const tables: string[] = [];
const users: string[] = [];
let opened: { close(): Promise<void> }[] = [];
/** The mysql command-line client is on the PATH (one test applies the schema with it). */
const mysqlClient = await new Promise<boolean>((resolve) => execFile('mysql', ['--version'], (error) => resolve(!error)));

/** A fresh lease table name, dropped after the file. */
function freshTable(): string {
  const t = uniqueName('lh_my');
  tables.push(t);
  return t;
}

function track<T extends { close(): Promise<void> }>(thing: T): T {
  opened.push(thing);
  return thing;
}

function granted(result: Awaited<ReturnType<Backend['acquire']>>): bigint {
  if (!result.granted) throw new Error('expected a grant');
  return result.token;
}

afterEach(async () => {
  await Promise.allSettled(opened.map((o) => o.close()));
  opened = [];
});

afterAll(async () => {
  for (const t of tables) await dropLeaseTables(t).catch(() => {});
  for (const t of tables) await admin.query(`DROP TABLE IF EXISTS \`${t}_scratch\``).catch(() => {});
  for (const u of users) await admin.query(`DROP USER IF EXISTS '${u}'@'%', '${u}'@'localhost'`).catch(() => {});
  await admin.end();
});

describe('mysql backend: options', () => {
  it('refuses bad options with InvalidArgumentError naming the option, before connecting', () => {
    const pool = mysql.createPool({ uri: MYSQL_URL, connectionLimit: 1 });
    track({ close: () => pool.end() });
    const cases: [unknown, string][] = [
      [undefined, 'options'],
      [{}, 'options'],
      [{ uri: MYSQL_URL, pool }, 'options'],
      [{ uri: MYSQL_URL, poolsize: 3 }, 'options.poolsize'],
      [{ uri: 42 }, 'uri'],
      [{ uri: 'postgres://127.0.0.1/test' }, 'uri'],
      [{ uri: 'not a url' }, 'uri'],
      [{ uri: 'mysql://root@127.0.0.1:3306' }, 'uri'],
      [{ pool: {} }, 'pool'],
      [{ pool, poolSize: 3 }, 'poolSize'],
      [{ uri: MYSQL_URL, poolSize: 0 }, 'poolSize'],
      [{ uri: MYSQL_URL, pollMs: 0 }, 'pollMs'],
      [{ uri: MYSQL_URL, pollMs: 2.5 }, 'pollMs'],
      [{ uri: MYSQL_URL, createSchema: 'no' }, 'createSchema'],
      [{ uri: MYSQL_URL, table: 'bad-name' }, 'table'],
      [{ uri: MYSQL_URL, table: 'x'.repeat(57) }, 'table'],
    ];
    for (const [options, argument] of cases) {
      let error: unknown;
      try {
        track(mysqlBackend(options as never));
      } catch (e) {
        error = e;
      }
      expect(
        error,
        JSON.stringify(options, (_k, v) => (v === pool ? '<pool>' : v)),
      ).toBeInstanceOf(InvalidArgumentError);
      expect((error as InvalidArgumentError).argument).toBe(argument);
    }
    expect(() => mysqlSchemaSql({ table: 't', delimiter: ';' })).toThrow(InvalidArgumentError);
    expect(() => mysqlSchemaSql({ schema: 'x' } as never)).toThrow(InvalidArgumentError);
  });

  it('a key or owner longer than the table stores is an InvalidArgumentError, not a server error', async () => {
    const backend = track(mysqlBackend({ uri: MYSQL_URL, table: freshTable(), poolSize: 1 }));
    await expect(backend.acquire(acquireRequest(`${'é'.repeat(512)}x`, 'o'))).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'key' });
    await expect(backend.acquire(acquireRequest('k', 'o'.repeat(256)))).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'owner' });
    await expect(backend.inspect('x'.repeat(1025))).rejects.toMatchObject({ argument: 'key' });
  });
});

describe('mysql backend: statements and schema', () => {
  it('one statement per acquire, renew, release, busy answer and cancelWait (after the first use checked the schema)', async () => {
    const inner = mysql.createPool({ uri: MYSQL_URL, connectionLimit: 2 });
    track({ close: () => inner.end() });
    const { pool, statements } = recordingPool(inner);
    const backend = track(mysqlBackend({ pool, table: freshTable() }));
    granted(await backend.acquire(acquireRequest('one', 'warm-up')));
    statements.length = 0;

    const token = granted(await backend.acquire(acquireRequest('one:2', 'a')));
    expect(statements).toHaveLength(1);
    expect((await backend.renew({ key: 'one:2', owner: 'a', token, mode: 'exclusive', ttlMs: 5_000 })).renewed).toBe(true);
    expect(statements).toHaveLength(2);
    await backend.release({ key: 'one:2', owner: 'a', token, mode: 'exclusive' });
    expect(statements).toHaveLength(3);
    expect((await backend.acquire(acquireRequest('one', 'b', { queue: true }))).granted).toBe(false);
    expect(statements).toHaveLength(4);
    await backend.cancelWait!({ key: 'one', owner: 'b' });
    expect(statements).toHaveLength(5);
    expect(statements.map((s) => s.slice(0, 4))).toEqual(['CALL', 'UPDA', 'CALL', 'CALL', 'CALL']);
  });

  it('creates its tables once when eight processes start at the same moment on a new table', async () => {
    const table = freshTable();
    const backends = Array.from({ length: 8 }, () => track(mysqlBackend({ uri: MYSQL_URL, table, poolSize: 1 })));
    const grants = await Promise.all(backends.map((b, i) => b.acquire(acquireRequest('first-start', `owner-${i}`, { mode: 'shared' }))));
    const tokens = grants.map(granted).sort((a, b) => (a < b ? -1 : 1));
    expect(tokens).toEqual([1n, 2n, 3n, 4n, 5n, 6n, 7n, 8n]);
    const [rows] = await admin.query(
      `SELECT ROUTINE_NAME AS name, ROUTINE_COMMENT AS version FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_NAME LIKE ? ORDER BY 1`,
      [`${table}\\_%`],
    );
    expect(rows).toEqual([
      { name: `${table}_acquire`, version: SCHEMA_VERSION },
      { name: `${table}_cancel`, version: '' },
      { name: `${table}_keepalive`, version: '' },
      { name: `${table}_release`, version: '' },
      { name: `${table}_session_end`, version: '' },
    ]);
  });

  it('createSchema: false with no lease store is BackendUnavailableError saying to apply mysqlSchemaSql', async () => {
    const backend = track(mysqlBackend({ uri: MYSQL_URL, table: freshTable(), createSchema: false }));
    const error = await backend.acquire(acquireRequest('k', 'o')).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(BackendUnavailableError);
    expect((error as Error).message).toContain('mysqlSchemaSql');
    await expect(backend.inspect('')).rejects.toBeInstanceOf(BackendUnavailableError); // still missing: asked again, not cached
  });

  it('runs from a migration (mysqlSchemaSql through a driver) with createSchema: false, as a user with only the grants the docs list', async () => {
    const table = freshTable();
    const ddl = mysqlSchemaSql({ table });
    expect(ddl).toContain('CREATE TABLE IF NOT EXISTS');
    const migrator = await mysql.createConnection({ uri: MYSQL_URL, multipleStatements: true });
    try {
      await migrator.query(ddl);
      await migrator.query(ddl); // idempotent
    } finally {
      await migrator.end();
    }
    const user = uniqueName('lh_app').slice(0, 32);
    users.push(user);
    for (const host of ['%', 'localhost']) {
      await admin.query(`CREATE USER '${user}'@'${host}'`);
      for (const t of [table, `${table}_keys`, `${table}_waiters`, `${table}_sessions`])
        await admin.query(`GRANT SELECT, INSERT, UPDATE, DELETE ON \`${t}\` TO '${user}'@'${host}'`);
      for (const p of ['acquire', 'release', 'cancel', 'keepalive', 'session_end'])
        await admin.query(`GRANT EXECUTE ON PROCEDURE \`${table}_${p}\` TO '${user}'@'${host}'`);
    }
    const url = new URL(MYSQL_URL);
    url.username = user;
    url.password = '';

    for (const createSchema of [false, true]) {
      // with the schema at the current version, even createSchema: true runs no DDL (the user could not)
      const connect = () => mysqlBackend({ uri: url.toString(), table, createSchema });
      const locks = track(new Locks({ backend: connect() }));
      const other = track(new Locks({ backend: connect() }));
      const key = `migrated:${createSchema}`;
      const lease = await locks.acquire(key, { ttlMs: 2_000 });
      expect(lease.token).toBe(1n);
      // a waiter queues, polls and is served; renewals run: every statement runs as the restricted user
      const waiting = other.acquire(key, { ttlMs: 2_000, waitMs: 5_000 });
      expect(await eventually(async () => (await locks.inspect(key))[0]?.waiters === 1, 5_000)).toBe(true);
      await lease.renew();
      await lease.release();
      expect((await waiting).token).toBe(2n);
      expect(await other.tryAcquire(key, { ttlMs: 1_000 })).toBeNull();
    }
  });

  it.skipIf(!mysqlClient)('mysqlSchemaSql({ delimiter }) runs in the mysql command-line client (skipped without the client)', async () => {
    const table = freshTable();
    const url = new URL(MYSQL_URL);
    const args = ['-h', url.hostname, '-P', url.port || '3306', '-u', decodeURIComponent(url.username) || 'root', url.pathname.slice(1)];
    if (url.password) args.push(`-p${decodeURIComponent(url.password)}`);
    const script = mysqlSchemaSql({ table, delimiter: '//' });
    expect(script.startsWith('DELIMITER //')).toBe(true);
    await runClient(args, script);
    await runClient(args, script); // idempotent
    const backend = track(mysqlBackend({ uri: MYSQL_URL, table, createSchema: false }));
    expect(granted(await backend.acquire(acquireRequest('by-client', 'o')))).toBe(1n);
  });

  it('procedures dropped behind its back: the next call fails as BackendUnavailableError, a later one creates them again and tokens go on', async () => {
    const table = freshTable();
    const backend = track(mysqlBackend({ uri: MYSQL_URL, table, poolSize: 2 }));
    const t1 = granted(await backend.acquire(acquireRequest('dropped', 'a')));
    await backend.release({ key: 'dropped', owner: 'a', token: t1, mode: 'exclusive' });
    for (const p of ['acquire', 'release', 'cancel']) await admin.query(`DROP PROCEDURE \`${table}_${p}\``);
    const error = await backend.acquire(acquireRequest('dropped', 'b')).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(BackendUnavailableError);
    expect((error as Error).message).toContain('ER_SP_DOES_NOT_EXIST');
    expect(granted(await backend.acquire(acquireRequest('dropped', 'b')))).toBeGreaterThan(t1);
  });
});

describe('mysql backend: pools', () => {
  it('never ends a pool it was given; ends its own', async () => {
    const table = freshTable();
    const pool = mysql.createPool({ uri: MYSQL_URL, connectionLimit: 2 });
    try {
      const given = mysqlBackend({ pool, table });
      const locks = new Locks({ backend: given });
      const lease = await locks.acquire('given-pool', { ttlMs: 2_000 });
      const waiting = locks.acquire('given-pool', { ttlMs: 2_000, waitMs: 2_000 }); // the poller runs on the given pool
      await sleep(50);
      await lease.release();
      await (await waiting).release();
      await locks.close();
      await given.close();
      const [rows] = await pool.query('SELECT 1 AS one');
      expect(rows).toEqual([{ one: 1 }]);
    } finally {
      await pool.end();
    }
    const own = mysqlBackend({ uri: MYSQL_URL, table, poolSize: 1 });
    await own.inspect('');
    await own.close();
    await own.close(); // idempotent
    await expect(own.inspect('')).rejects.toBeInstanceOf(BackendUnavailableError);
    await expect(own.watch!('k', () => {})).rejects.toBeInstanceOf(ClosedError);
  });

  it('a statement that never gets an answer is abandoned after 10 s as BackendUnavailableError, its connection destroyed', async () => {
    const inner = mysql.createPool({ uri: MYSQL_URL, connectionLimit: 2 });
    track({ close: () => inner.end() });
    let destroyed = 0;
    // a connection whose CALLs are never answered (a server that froze mid-statement)
    const pool = {
      async getConnection() {
        const c = await inner.getConnection();
        return {
          query: (sql: { sql: string }, values?: unknown) =>
            sql.sql.startsWith('CALL')
              ? new Promise<[unknown, unknown]>(() => {})
              : (c.query as (s: unknown, v?: unknown) => Promise<[unknown, unknown]>)(sql, values),
          release: () => c.release(),
          destroy: () => {
            destroyed++;
            c.destroy();
          },
        };
      },
      query: inner.query.bind(inner) as never,
    };
    const backend = track(mysqlBackend({ pool: pool as never, table: freshTable() }));
    const started = performance.now();
    const error = await backend.acquire(acquireRequest('hangs', 'a')).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(BackendUnavailableError);
    expect((error as Error).message).toMatch(/no answer within 10000 ms/);
    expect(performance.now() - started).toBeGreaterThanOrEqual(9_900);
    expect(destroyed).toBe(1);
  }, 20_000);

  it('works on a pool whose connections are in manual-commit mode (autocommit=0): renewals commit', async () => {
    const table = freshTable();
    const pool = mysql.createPool({ uri: MYSQL_URL, connectionLimit: 1 });
    track({ close: () => pool.end() });
    pool.on('connection', (c) => {
      void c.query('SET autocommit = 0');
    });
    const backend = track(mysqlBackend({ pool, table }));
    const observer = track(mysqlBackend({ uri: MYSQL_URL, table, poolSize: 1 }));
    const token = granted(await backend.acquire(acquireRequest('manual', 'a', { ttlMs: 1_000 })));
    expect((await backend.renew({ key: 'manual', owner: 'a', token, mode: 'exclusive', ttlMs: 60_000 })).renewed).toBe(true);
    const [state] = await observer.inspect('manual');
    expect(state!.holders[0]!.expiresInMs).toBeGreaterThan(10_000); // the renewal committed: another connection sees it
    await backend.release({ key: 'manual', owner: 'a', token, mode: 'exclusive' });
    expect(granted(await observer.acquire(acquireRequest('manual', 'b')))).toBe(token + 1n);
  });

  it("a pool connection handed back with a transaction open is refused (InvalidArgumentError 'pool'), not committed", async () => {
    const table = freshTable();
    const setup = track(mysqlBackend({ uri: MYSQL_URL, table, poolSize: 1 }));
    await setup.inspect('');
    const pool = mysql.createPool({ uri: MYSQL_URL, connectionLimit: 1 });
    track({ close: () => pool.end() });
    const c = await pool.getConnection();
    await c.query('START TRANSACTION');
    c.release();
    const backend = track(mysqlBackend({ pool, table }));
    await expect(backend.acquire(acquireRequest('open-tx', 'a'))).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'pool' });
    expect(await setup.inspect('open-tx')).toEqual([]);
  });

  it('a process holding leases on its own pool, never releasing or closing, exits by itself (needs npm run build)', async () => {
    const table = freshTable();
    const script = `
      import { createLocks } from ${JSON.stringify(new URL('../../dist/index.js', import.meta.url).pathname)};
      import { mysqlBackend } from ${JSON.stringify(new URL('../../dist/mysql/index.js', import.meta.url).pathname)};
      const locks = createLocks({ backend: mysqlBackend({ uri: ${JSON.stringify(MYSQL_URL)}, table: ${JSON.stringify(table)} }) });
      const key = 'exit-' + process.argv[1];
      const held = await locks.acquire(key, { ttlMs: 60_000 });
      const busy = await locks.acquire(key, { ttlMs: 60_000, waitMs: 200 }).catch((e) => e.code);
      console.log(JSON.stringify({ token: String(held.token), busy }));
      if (process.argv[1] === 'keep-alive') setInterval(() => {}, 1_000);`;
    const run = (mode: string) =>
      new Promise<{ code: number | null | 'running'; out: string }>((resolve, reject) => {
        const child = spawn(process.execPath, ['--input-type=module', '-e', script, mode], { stdio: ['ignore', 'pipe', 'inherit'] });
        let out = '';
        let timer: ReturnType<typeof setTimeout> | undefined;
        child.stdout.on('data', (d: Buffer) => {
          out += d.toString();
          timer ??= setTimeout(() => {
            child.removeAllListeners('exit');
            child.kill('SIGKILL');
            resolve({ code: 'running', out });
          }, 5_000);
        });
        child.on('error', reject);
        child.on('exit', (code) => {
          clearTimeout(timer);
          resolve({ code, out });
        });
      });
    const exited = await run('plain');
    expect(exited.code).toBe(0);
    expect(JSON.parse(exited.out)).toEqual({ token: '1', busy: 'ACQUIRE_TIMEOUT' });
    expect((await run('keep-alive')).code).toBe('running'); // control: a timer of its own keeps it
  });
});

describe('mysql backend: contention, deadlocks and lock waits', () => {
  it('twenty contenders on three keys: no raw driver error, tokens distinct and increasing in grant order per key', async () => {
    const table = freshTable();
    const clients = Array.from({ length: 4 }, () => track(new Locks({ backend: mysqlBackend({ uri: MYSQL_URL, table, poolSize: 6 }) })));
    const keys = ['c0', 'c1', 'c2'];
    const tokens = new Map<string, bigint[]>(keys.map((k) => [k, []]));
    const errors: unknown[] = [];
    await Promise.all(
      Array.from({ length: 20 }, async (_, w) => {
        for (let i = 0; i < 6; i++) {
          const key = keys[(w + i) % 3]!;
          try {
            await clients[w % 4]!.withLock(key, { ttlMs: 5_000, waitMs: 20_000, mode: i % 3 === 2 ? 'shared' : 'exclusive' }, async (lease) => {
              tokens.get(key)!.push(lease.token);
              await sleep(Math.random() * 3);
            });
          } catch (error) {
            errors.push(error);
          }
        }
      }),
    );
    expect(errors).toEqual([]);
    let total = 0;
    for (const seen of tokens.values()) {
      total += seen.length;
      expect(new Set(seen).size).toBe(seen.length);
      // exclusive grants are pushed in grant order; shared ones may overlap, so compare sorted
      const sorted = [...seen].sort((a, b) => (a < b ? -1 : 1));
      expect(sorted[0]).toBe(1n);
      expect(sorted.at(-1)).toBe(BigInt(seen.length));
    }
    expect(total).toBe(120);
  });

  it("a deadlock that makes a call the victim is retried inside the call: the release completes (its CALL sent again; the server's deadlock count)", async () => {
    const table = freshTable();
    const inner = mysql.createPool({ uri: MYSQL_URL, connectionLimit: 2 });
    track({ close: () => inner.end() });
    const recording = recordingPool(inner);
    // The backend's connections, by thread id: to find its transaction among the server's.
    const threads = new Set<number>();
    const pool = {
      ...recording.pool,
      getConnection: async () => {
        const c = await recording.pool.getConnection();
        if (typeof c.threadId === 'number') threads.add(c.threadId);
        return c;
      },
    };
    const backend = track(mysqlBackend({ pool, table }));
    await admin.query(`CREATE TABLE \`${table}_scratch\` (id INT AUTO_INCREMENT PRIMARY KEY, pad CHAR(100) NOT NULL DEFAULT '')`);
    const deadlocks = async (): Promise<number> =>
      Number(((await admin.query(`SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'`))[0] as { Value: string }[])[0]!.Value);
    const releaseCalls = (): number => recording.statements.filter((sql) => sql.includes(`${table}_release`)).length;
    /** The backend's transaction in a lock wait. */
    const waiting = async (): Promise<boolean> => {
      if (threads.size === 0) return false;
      const [rows] = await admin.query(`SELECT COUNT(*) AS n FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT' AND trx_mysql_thread_id IN (?)`, [
        [...threads],
      ]);
      return Number((rows as { n: unknown }[])[0]!.n) >= 1;
    };
    let token = 0n;
    const seen: string[] = [];
    // The release waits for a row lock 2 s at a time (LOCK_WAIT_S) and pauses between attempts: the
    // cycle below is made only if it comes while the release waits. A round that misses that
    // moment still has to release cleanly (and then sent its CALL once, or again after a lock-wait
    // timeout without a deadlock); up to four rounds are tried, each with a new grant.
    for (let round = 1; round <= 4; round++) {
      token = granted(await backend.acquire(acquireRequest('dl', 'holder')));
      const before = await deadlocks();
      const callsBefore = releaseCalls();
      const other = await admin.getConnection();
      let settled: unknown = 'pending';
      try {
        await other.query('SET SESSION innodb_lock_wait_timeout = 30');
        // A heavy transaction (many rows written: InnoDB rolls back the lighter one) locks the holder's row...
        await other.query('START TRANSACTION');
        await other.query(
          `INSERT INTO \`${table}_scratch\` (pad) WITH RECURSIVE s (n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < 1000) SELECT 'x' FROM s`,
        );
        await other.query(`SELECT * FROM \`${table}\` WHERE \`key\` = ? FOR UPDATE`, [Buffer.from('dl')]);
        // ...the release locks the key's row and waits for the holder's...
        const release = backend.release({ key: 'dl', owner: 'holder', token, mode: 'exclusive' });
        release.then(
          () => (settled = 'released'),
          (e: unknown) => (settled = e),
        );
        // Seen in its lock wait (or, where the server's view of it lags, given 300 ms to get there).
        const inWait = await eventually(waiting, 1_500);
        if (!inWait) await sleep(300);
        // ...and the heavy one asks for the key's row: a cycle, the release's transaction is the victim.
        await other.query(`SELECT * FROM \`${table}_keys\` WHERE \`key\` = ? FOR UPDATE`, [Buffer.from('dl')]);
        await sleep(100);
        const whileHeld = settled;
        await other.query('COMMIT');
        await release;
        expect(settled).toBe('released');
        const calls = releaseCalls() - callsBefore;
        const rose = (await deadlocks()) - before;
        seen.push(`round ${round}: lock wait seen ${inWait}, release ${String(whileHeld)} while the heavy one held, CALLs ${calls}, deadlocks +${rose}`);
        if (calls >= 2 && rose > 0) {
          expect(whileHeld).toBe('pending'); // retried, then waiting behind the heavy transaction
          break;
        }
      } finally {
        await other.query('ROLLBACK').catch(() => {});
        await other.query('SET SESSION innodb_lock_wait_timeout = DEFAULT').catch(() => {});
        other.release();
      }
    }
    expect(seen.at(-1), seen.join('; ')).toMatch(/release pending .* CALLs [2-9].* deadlocks \+[1-9]/);
    expect(granted(await backend.acquire(acquireRequest('dl', 'next')))).toBe(token + 1n);
  }, 90_000);

  it('a lock wait that times out is retried; a row lock held for good ends in BackendUnavailableError after the attempts, never a raw error', async () => {
    const table = freshTable();
    const backend = track(mysqlBackend({ uri: MYSQL_URL, table, poolSize: 2 }));
    const t1 = granted(await backend.acquire(acquireRequest('lw', 'a')));
    await backend.release({ key: 'lw', owner: 'a', token: t1, mode: 'exclusive' });
    const other = await admin.getConnection();
    try {
      // held for 3 s: the first attempt's 2 s wait times out, the next one gets the row
      await other.query('START TRANSACTION');
      await other.query(`SELECT * FROM \`${table}_keys\` WHERE \`key\` = ? FOR UPDATE`, [Buffer.from('lw')]);
      const started = performance.now();
      const acquire = backend.acquire(acquireRequest('lw', 'b'));
      await sleep(3_000);
      await other.query('COMMIT');
      expect(granted(await acquire)).toBe(t1 + 1n);
      expect(performance.now() - started).toBeGreaterThanOrEqual(2_000); // it did wait out a lock-wait timeout
      await backend.release({ key: 'lw', owner: 'b', token: t1 + 1n, mode: 'exclusive' });

      // held for good: four attempts, then BackendUnavailableError with the server's error as cause
      await other.query('START TRANSACTION');
      await other.query(`SELECT * FROM \`${table}_keys\` WHERE \`key\` = ? FOR UPDATE`, [Buffer.from('lw')]);
      const error = await backend.acquire(acquireRequest('lw', 'c')).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(BackendUnavailableError);
      expect((error as Error).message).toMatch(/after 4 attempts.*ER_LOCK_WAIT_TIMEOUT/);
      expect((error as { cause?: { code?: string } }).cause?.code).toBe('ER_LOCK_WAIT_TIMEOUT');
    } finally {
      await other.query('ROLLBACK').catch(() => {});
      other.release();
    }
  }, 30_000);
});

describe('mysql backend: tokens and keys', () => {
  it('tokens survive the backend: a new instance on the same table goes on from the last one (I1)', async () => {
    const table = freshTable();
    const first = mysqlBackend({ uri: MYSQL_URL, table, poolSize: 1 });
    const t1 = granted(await first.acquire(acquireRequest('durable', 'a')));
    await first.release({ key: 'durable', owner: 'a', token: t1, mode: 'exclusive' });
    await first.close();
    const second = track(mysqlBackend({ uri: MYSQL_URL, table, poolSize: 1 }));
    expect(granted(await second.acquire(acquireRequest('durable', 'b')))).toBe(t1 + 1n);
  });

  it('keys are bytes: multibyte and 1024-byte keys round-trip; keys a collation would fold stay apart', async () => {
    const table = freshTable();
    const locks = track(new Locks({ backend: mysqlBackend({ uri: MYSQL_URL, table, poolSize: 2 }) }));
    const long = `${'é'.repeat(510)}🔒`; // 1020 + 4 = 1024 bytes
    expect(Buffer.byteLength(long)).toBe(1024);
    for (const key of ['ключ', '🔒 lock', long, 'a', 'A', 'e', 'é', 'e\u0301', 'ss', 'ß', 'trail ', 'trail']) {
      const lease = await locks.acquire(key, { ttlMs: 5_000 });
      expect(lease.token).toBe(1n); // a key of its own: no other key's counter
      const [state] = await locks.inspect(key).then((s) => s.filter((x) => x.key === key));
      expect(state?.holders.map((h) => h.token)).toEqual([1n]);
    }
    const [rows] = await admin.query(`SELECT HEX(\`key\`) AS hex FROM \`${table}_keys\` WHERE \`key\` = ?`, [Buffer.from('🔒 lock')]);
    expect(rows).toEqual([{ hex: Buffer.from('🔒 lock').toString('hex').toUpperCase() }]);
  });

  it('inspect(prefix) matches on bytes, also when the prefix ends inside a run of multibyte characters', async () => {
    const table = freshTable();
    const locks = track(new Locks({ backend: mysqlBackend({ uri: MYSQL_URL, table, poolSize: 2 }) }));
    const keys = ['p:é', 'p:éa', 'p:ê', 'p:è', 'p:e', 'p:🔒x', 'p:🔓', 'p;', 'p'];
    for (const k of keys) await locks.acquire(k, { ttlMs: 10_000 });
    const listed = async (prefix: string) => (await locks.inspect(prefix)).map((s) => s.key);
    expect(await listed('p:é')).toEqual(['p:é', 'p:éa']);
    expect(await listed('p:🔒')).toEqual(['p:🔒x']);
    expect((await listed('p:')).sort()).toEqual(['p:e', 'p:è', 'p:é', 'p:éa', 'p:ê', 'p:🔒x', 'p:🔓'].sort());
    expect(await listed('p:e')).toEqual(['p:e']);
    expect((await listed('')).length).toBe(keys.length);
  });
});

function runClient(args: string[], input: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = execFile('mysql', args, (error, _stdout, stderr) => (error ? reject(new Error(`${error.message}: ${stderr}`)) : resolve()));
    child.stdin?.end(input);
  });
}

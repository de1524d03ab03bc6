/**
 * createLocks({ url | backend }): what each URL means, against the real servers where it matters —
 * the Redis database in the URL, the MySQL URL's `?table=` and `mariadb://`, `backend: null`, scheme
 * case, and the one in-process coordinator that `memory:` URLs share (while `memoryBackend()` stays
 * private).
 */
import { Redis } from 'ioredis';
import mysql from 'mysql2/promise';
import { afterAll, describe, expect, it, vi } from 'vitest';
import { mysqlUrl } from '../../src/connect.js';
import { createLocks, InvalidArgumentError, Locks, memoryBackend } from '../../src/index.js';
import { REDIS_URL } from '../redis/servers.js';
import { MYSQL_URL, uniqueName } from '../helpers/env.js';

function thrown(fn: () => unknown): unknown {
  try {
    fn();
  } catch (error) {
    return error;
  }
  return undefined;
}

const opened: Locks[] = [];
const open = (locks: Locks): Locks => {
  opened.push(locks);
  return locks;
};
afterAll(async () => {
  await Promise.all(opened.map((l) => l.close()));
});

describe('createLocks({ backend })', () => {
  it('backend: null is an InvalidArgumentError naming backend, not the default ./leasehold.db', () => {
    const error = thrown(() => createLocks({ backend: null as never }));
    expect(error).toBeInstanceOf(InvalidArgumentError);
    expect(error).toMatchObject({ argument: 'backend' });
    expect((error as Error).message).toMatch(/got null/);
  });

  it('backend: undefined (or absent) still means the default', () => {
    expect(createLocks({ backend: undefined, url: 'memory:' })).toBeInstanceOf(Locks);
  });
});

describe('memory: URLs share one coordinator per process', () => {
  it('two createLocks({ url: "memory:" }) exclude each other and share the key\'s tokens', async () => {
    const key = uniqueName('shared');
    const a = open(createLocks({ url: 'memory:' }));
    const b = open(createLocks({ url: 'memory:' }));
    const first = await a.acquire(key, { ttlMs: 10_000 });
    expect(await b.tryAcquire(key)).toBeNull();
    // A waiter on b is woken by a's release (subscriptions reach across the clients).
    const waiting = b.acquire(key, { ttlMs: 10_000, waitMs: 5_000 });
    const started = performance.now();
    await first.release();
    const second = await waiting;
    expect(performance.now() - started).toBeLessThan(1_000);
    expect(second.token).toBe(first.token + 1n);
    await second.release();
  });

  it('MEMORY: (schemes are case-insensitive) is the same coordinator', async () => {
    const key = uniqueName('case');
    const a = open(createLocks({ url: 'memory:' }));
    const b = open(createLocks({ url: 'MEMORY:' }));
    const lease = await a.acquire(key);
    expect(await b.tryAcquire(key)).toBeNull();
    await lease.release();
    expect(thrown(() => createLocks({ url: 'Memory:x' }))).toMatchObject({ argument: 'url', message: expect.stringMatching(/takes nothing after the colon/) });
  });

  it('closing one Locks releases its leases and leaves the other working', async () => {
    const key = uniqueName('close');
    const a = createLocks({ url: 'memory:' });
    const b = open(createLocks({ url: 'memory:' }));
    const held = await a.acquire(key, { ttlMs: 60_000 });
    const waiting = b.acquire(key, { waitMs: 5_000 });
    await a.close();
    const lease = await waiting; // a's close released its lease and did not close the coordinator
    expect(lease.token).toBe(held.token + 1n);
    await lease.release();
    expect(await b.tryAcquire(key)).not.toBeNull();
    await expect(a.acquire(key)).rejects.toThrow();
    // A third client, made after a closed, still sees the same coordinator.
    const c = open(createLocks({ url: 'memory:' }));
    expect(await c.tryAcquire(key)).toBeNull();
  });

  it('memoryBackend() called directly makes a private coordinator', async () => {
    const key = uniqueName('private');
    const viaUrl = open(createLocks({ url: 'memory:' }));
    const p1 = open(new Locks({ backend: memoryBackend() }));
    const p2 = open(createLocks({ backend: memoryBackend() }));
    const l0 = await viaUrl.acquire(key);
    const l1 = await p1.acquire(key);
    const l2 = await p2.acquire(key);
    expect([l0.token, l1.token, l2.token]).toEqual([1n, 1n, 1n]);
  });
});

describe('redis:// URLs select the database in the URL', () => {
  const key = uniqueName('db');
  const admin = (db: number) => new Redis(`${REDIS_URL.replace(/\/\d*$/, '')}/${db}`, { lazyConnect: false });
  /** Keys that mention `key` in database `db` (the backend's key layout is its own business). */
  const keysIn = async (db: number): Promise<string[]> => {
    const r = admin(db);
    try {
      return await r.keys(`*${key}*`);
    } finally {
      r.disconnect();
    }
  };
  afterAll(async () => {
    for (const db of [0, 5]) {
      const r = admin(db);
      const found = await r.keys(`*${key}*`);
      if (found.length > 0) await r.del(...found);
      r.disconnect();
    }
  });

  it('storage layout: a lock taken via /5 lands in database 5, not 0 (reads the keys of both databases)', async () => {
    const locks = open(createLocks({ url: `${REDIS_URL}/5` }));
    const lease = await locks.acquire(key, { ttlMs: 10_000 });
    expect((await keysIn(5)).length).toBeGreaterThan(0);
    expect(await keysIn(0)).toEqual([]);
    await lease.release();
  });

  it('storage layout: a database the server does not have (/99) is an InvalidArgumentError on first use, and no key lands in database 0', async () => {
    const locks = open(createLocks({ url: `${REDIS_URL}/99` }));
    const error = await locks.acquire(`${key}:99`, { ttlMs: 10_000, waitMs: 0 }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(InvalidArgumentError);
    expect(error).toMatchObject({ argument: 'url', retryable: false });
    expect((error as Error).message).toMatch(/selects database 99, which the server refuses: ERR/);
    expect(await keysIn(0)).toEqual([]);
  });

  it('a path that is not a database number is refused at once', () => {
    for (const url of [`${REDIS_URL}/abc`, `${REDIS_URL}/1/2`, `${REDIS_URL}/-1`, `${REDIS_URL}?db=x`]) {
      const error = thrown(() => createLocks({ url }));
      expect(error, url).toBeInstanceOf(InvalidArgumentError);
      expect(error).toMatchObject({ argument: 'url' });
      expect((error as Error).message).toMatch(/database number/);
    }
  });
});

describe('mysql:// and mariadb:// URLs', () => {
  it('leasehold takes its own ?table= out; every other parameter goes to mysql2 as written', () => {
    expect(mysqlUrl('mysql://app:secret@db.internal:3306/app?table=jobs_locks&charset=utf8mb4')).toEqual({
      uri: 'mysql://app:secret@db.internal:3306/app?charset=utf8mb4',
      table: 'jobs_locks',
    });
    expect(mysqlUrl('mysql://app@db.internal/app?table=t')).toEqual({ uri: 'mysql://app@db.internal/app', table: 't' });
    expect(mysqlUrl('mysql://app@db.internal/app')).toEqual({ uri: 'mysql://app@db.internal/app' });
    // mariadb:// is the same URL under MariaDB's name: mysql2 ignores the scheme, so it is handed over as written.
    expect(mysqlUrl('mariadb://app@db.internal/app?table=t&ssl=%7B%7D')).toEqual({ uri: 'mariadb://app@db.internal/app?ssl=%7B%7D', table: 't' });
  });

  it('a URL without a database, without a server, or that does not parse is refused at once (argument url)', () => {
    const cases: [url: string, message: RegExp][] = [
      ['mysql://root@127.0.0.1:3306', /names no database/],
      ['mysql://root@127.0.0.1:3306/', /names no database/],
      ['MARIADB://root@127.0.0.1/?table=t', /names no database/],
      ['mysql:test', /mysql: URLs name a server/],
      ['mysql://root@[::1/test', /is not a valid mysql:\/\/ URL/],
    ];
    for (const [url, message] of cases) {
      const error = thrown(() => createLocks({ url }));
      expect(error, url).toBeInstanceOf(InvalidArgumentError);
      expect(error, url).toMatchObject({ argument: 'url', message: expect.stringMatching(message) });
    }
    // A database given as mysql2's own parameter is one too.
    expect(createLocks({ url: 'mysql://root@127.0.0.1:3306/?database=test' })).toBeInstanceOf(Locks);
  });

  describe('against the test server', () => {
    const table = uniqueName('lh_url');
    const withTable = (url: string): string => `${url}${url.includes('?') ? '&' : '?'}table=${table}`;
    afterAll(async () => {
      const c = await mysql.createConnection({ uri: MYSQL_URL });
      try {
        const like = `${table}%`;
        const [routines] = await c.query(
          'SELECT routine_name AS n, routine_type AS t FROM information_schema.routines WHERE routine_schema = DATABASE() AND routine_name LIKE ?',
          [like],
        );
        for (const r of routines as { n: string; t: string }[]) await c.query(`DROP ${r.t} IF EXISTS \`${r.n}\``);
        const [tables] = await c.query('SELECT table_name AS n FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name LIKE ?', [like]);
        await c.query('SET foreign_key_checks = 0');
        for (const t of tables as { n: string }[]) await c.query(`DROP TABLE IF EXISTS \`${t.n}\``);
      } finally {
        await c.end();
      }
    });

    it('storage layout: ?table=T puts the leases in T (its tables are read), and mysql2 never sees the parameter (no warning)', async () => {
      const warn = vi.spyOn(console, 'error');
      try {
        const key = uniqueName('url');
        const locks = open(createLocks({ url: withTable(MYSQL_URL) }));
        const lease = await locks.acquire(key, { ttlMs: 10_000 });
        const c = await mysql.createConnection({ uri: MYSQL_URL });
        try {
          const [rows] = await c.query(`SELECT CAST(token AS CHAR) AS token FROM \`${table}\` WHERE \`key\` = ?`, [Buffer.from(key)]);
          expect(rows).toEqual([{ token: lease.token.toString() }]);
        } finally {
          await c.end();
        }
        await lease.release();
        expect(warn.mock.calls.map((call) => String(call[0])).filter((m) => m.includes('Ignoring invalid configuration option'))).toEqual([]);
      } finally {
        warn.mockRestore();
      }
    });

    it('mariadb:// and MYSQL:// name the same coordinator as mysql://', async () => {
      const key = uniqueName('alias');
      const mariadbUrl = withTable(MYSQL_URL.replace(/^mysql:/i, 'mariadb:'));
      const upper = withTable(MYSQL_URL.replace(/^mysql:/i, 'MYSQL:'));
      const a = open(createLocks({ url: withTable(MYSQL_URL) }));
      const b = open(createLocks({ url: mariadbUrl }));
      const c = open(createLocks({ url: upper }));
      const first = await a.acquire(key, { ttlMs: 10_000 });
      expect(await b.tryAcquire(key)).toBeNull();
      expect(await c.tryAcquire(key)).toBeNull();
      await first.release();
      const second = await b.acquire(key, { ttlMs: 10_000 });
      expect(second.token).toBe(first.token + 1n);
      await second.release();
    });
  });

  it('an unknown scheme names mysql:// among the ones taken, and the password is masked', () => {
    const error = thrown(() => createLocks({ url: 'mongodb://app:secret@db/app' }));
    expect(error).toMatchObject({
      argument: 'url',
      message: expect.stringMatching(/expected memory:, sqlite:PATH, postgres:\/\/, mysql:\/\/ \(or mariadb:\/\/\)/),
    });
    expect((error as Error).message).not.toContain('secret');
  });
});

import Database from 'better-sqlite3';
import { afterAll, describe, expect, it } from 'vitest';
import { createLocks, InvalidArgumentError, Locks, memoryBackend, MAX_KEY_BYTES } from '../../src/index.js';
import { backendLoader } from '../../src/connect.js';
import { manualClock } from '../../src/core/clock.js';
import { postgresFence } from '../../src/postgres/index.js';
import { sqliteBackend, sqliteFence } from '../../src/sqlite/index.js';

describe('bad input is refused at the boundary, naming the problem', () => {
  const locks = new Locks({ backend: memoryBackend() });

  const cases: [string, () => Promise<unknown>, string][] = [
    ['empty key', () => locks.acquire(''), 'key'],
    ['non-string key', () => locks.acquire(42 as never), 'key'],
    ['key too long', () => locks.acquire('x'.repeat(MAX_KEY_BYTES + 1)), 'key'],
    ['key with multi-byte chars too long', () => locks.acquire('é'.repeat(MAX_KEY_BYTES / 2 + 1)), 'key'],
    ['lone surrogate', () => locks.acquire('a\uD800b'), 'key'],
    ['NUL in key', () => locks.acquire('a\0b'), 'key'],
    ['ttl not integer', () => locks.acquire('k', { ttlMs: 1.5 }), 'options.ttlMs'],
    ['ttl too small', () => locks.acquire('k', { ttlMs: 1 }), 'options.ttlMs'],
    ['ttl too large', () => locks.acquire('k', { ttlMs: 2 ** 31 }), 'options.ttlMs'],
    ['ttl as string', () => locks.acquire('k', { ttlMs: '30s' as never }), 'options.ttlMs'],
    ['waitMs negative', () => locks.acquire('k', { waitMs: -1 }), 'options.waitMs'],
    ['waitMs NaN', () => locks.acquire('k', { waitMs: NaN }), 'options.waitMs'],
    ['mode', () => locks.acquire('k', { mode: 'read' as never }), 'options.mode'],
    ['lockDelayMs', () => locks.acquire('k', { lockDelayMs: -5 }), 'options.lockDelayMs'],
    ['autoRenew', () => locks.acquire('k', { autoRenew: 'yes' as never }), 'options.autoRenew'],
    ['signal', () => locks.acquire('k', { signal: {} as never }), 'options.signal'],
    ['unknown option (typo)', () => locks.acquire('k', { ttl: 5000 } as never), 'options.ttl'],
    ['options not an object', () => locks.acquire('k', 'fast' as never), 'options'],
    ['withLock without fn', () => locks.withLock('k', {}, undefined as never), 'fn'],
    ['tryAcquire', () => locks.tryAcquire('k', { ttlMs: 0 }), 'options.ttlMs'],
    ['inspect prefix', () => locks.inspect(7 as never), 'prefix'],
  ];

  for (const [name, call, argument] of cases) {
    it(name, async () => {
      const error = await call().then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(error).toBeInstanceOf(InvalidArgumentError);
      expect(error).toMatchObject({ code: 'INVALID_ARGUMENT', argument, name: 'InvalidArgumentError' });
      expect((error as Error).message).toContain(argument);
    });
  }

  it('nothing was changed by the refused calls', async () => {
    expect(await locks.inspect()).toEqual([]);
    expect((await locks.acquire('k')).token).toBe(1n);
  });

  it('constructor options are checked too', () => {
    expect(() => new Locks({ backend: {} as never })).toThrow(/backend/);
    expect(() => new Locks({ backend: memoryBackend(), driftFactor: 2 })).toThrow(/driftFactor/);
    expect(() => new Locks({ backend: memoryBackend(), holderName: 'bad\nname' })).toThrow(/holderName/);
    expect(() => new Locks({ backend: memoryBackend(), defaults: { ttlMs: 5 } })).toThrow(/defaults.ttlMs/);
    expect(() => createLocks({ url: 'mongodb://x' })).toThrow(/unsupported scheme/);
    expect(() => createLocks({ url: 'sqlite:' })).toThrow(/file path/);
    expect(() => backendLoader('etcd://nohostport')).toThrow(/host:port/);
    expect(() => backendLoader('redlock://a:1,b')).toThrow(/host:port/);
    expect(() => createLocks({ backend: memoryBackend(), url: 'memory:' })).toThrow(/either backend or url/);
    // options that are only used later (a jitter, a coordinator's clock) are checked now, not when first called
    expect(() => new Locks({ backend: memoryBackend(), random: 0.5 as never })).toThrow(
      expect.objectContaining({ code: 'INVALID_ARGUMENT', argument: 'random' }),
    );
    expect(() => memoryBackend({ clock: { now: 0 } as never })).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT', argument: 'options.clock' }));
    expect(() => sqliteBackend({ path: ':memory:', clock: { now: () => 0 } as never })).toThrow(
      expect.objectContaining({ code: 'INVALID_ARGUMENT', argument: 'clock' }),
    );
  });

  it('defaults are documented values, frozen', async () => {
    const { DEFAULTS } = await import('../../src/index.js');
    expect(Object.isFrozen(DEFAULTS)).toBe(true);
    expect(DEFAULTS).toMatchObject({ ttlMs: 30_000, waitMs: 10_000, lockDelayMs: 0, mode: 'exclusive', autoRenew: true });
    const lease = await new Locks({ backend: memoryBackend() }).acquire('d');
    expect(lease.ttlMs).toBe(30_000);
    await lease.release();
  });
});

describe('factories and constructors refuse bad input with a typed error naming it', () => {
  const db = new Database(':memory:');
  afterAll(() => db.close());
  /** A pg Pool as postgresFence sees it (connect, query); these calls must fail before using it. */
  const pool = { connect: async () => ({}) as never, query: async () => ({ rows: [], rowCount: 0 }) };
  const clock = manualClock();

  const cases: [string, () => unknown, string][] = [
    ['sqliteFence without a database', () => sqliteFence({} as never), 'db'],
    ['sqliteFence without anything', () => sqliteFence(undefined as never), 'db'],
    ['sqliteFence table with a space', () => sqliteFence(db, { table: 'a b' }), 'table'],
    ['sqliteFence table with a quote', () => sqliteFence(db, { table: 'a"b' }), 'table'],
    ['sqliteFence unknown option', () => sqliteFence(db, { tabel: 'x' } as never), 'options.tabel'],
    ['postgresFence schema with a quote', () => postgresFence(pool, { schema: 'x"y' }), 'schema'],
    ['postgresFence table with a semicolon', () => postgresFence(pool, { table: 'marks; DROP TABLE x' }), 'table'],
    ['postgresFence without a pool', () => postgresFence({} as never), 'pool'],
    ['sqliteBackend path not a string', () => sqliteBackend({ path: 5 as never }), 'path'],
    ['sqliteBackend path empty', () => sqliteBackend({ path: '' }), 'path'],
    ['sqliteBackend options not an object', () => sqliteBackend('locks.db' as never), 'options'],
    ['sqliteBackend database null', () => sqliteBackend({ database: null as never }), 'database'],
    ['sqliteBackend database not a Database', () => sqliteBackend({ database: { prepare: 1 } as never }), 'database'],
    ['memoryBackend sessions not a boolean', () => memoryBackend({ sessions: 'x' as never }), 'options.sessions'],
    ['memoryBackend options not an object', () => memoryBackend(7 as never), 'options'],
    ['createLocks operationTimeoutMs 0', () => createLocks({ backend: memoryBackend(), operationTimeoutMs: 0 }), 'operationTimeoutMs'],
    ['createLocks operationTimeoutMs not an integer', () => createLocks({ backend: memoryBackend(), operationTimeoutMs: 1.5 }), 'operationTimeoutMs'],
    ['createLocks clock without setTimeout', () => createLocks({ backend: memoryBackend(), clock: { now: () => 0 } as never }), 'clock'],
    ['createLocks clock not an object', () => createLocks({ backend: memoryBackend(), clock: 'performance' as never }), 'clock'],
    ['createLocks defaults.fair', () => createLocks({ backend: memoryBackend(), defaults: { fair: 'x' as never } }), 'defaults.fair'],
  ];
  for (const [name, call, argument] of cases) {
    it(name, () => {
      let error: unknown;
      try {
        call();
      } catch (e) {
        error = e;
      }
      expect(error).toBeInstanceOf(InvalidArgumentError);
      expect(error).toMatchObject({ code: 'INVALID_ARGUMENT', argument, name: 'InvalidArgumentError' });
      expect((error as Error).message).toContain(argument);
    });
  }

  it('acquire option fair must be a boolean', async () => {
    const locks = createLocks({ backend: memoryBackend({ clock }), clock });
    await expect(locks.acquire('k', { fair: 'x' as never })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'options.fair' });
    await expect(locks.tryAcquire('k', { fair: 1 as never })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'options.fair' });
    expect(await locks.inspect()).toEqual([]); // nothing was taken
    await locks.close();
  });

  it('a sane-looking pg identifier is still quoted: a reserved word works as a schema name', async () => {
    const seen: string[] = [];
    const recording = {
      connect: async () => ({ query: async (sql: string) => (seen.push(sql), { rows: [], rowCount: 0 }), release: () => {} }),
      query: async (sql: string) => (seen.push(sql), { rows: [], rowCount: 0 }),
    };
    await postgresFence(recording, { schema: 'select', table: 'Marks' }).highest('r');
    expect(seen.some((sql) => sql.includes('"select"."Marks"'))).toBe(true);
  });
});

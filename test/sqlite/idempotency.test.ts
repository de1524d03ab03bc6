/**
 * sqliteIdempotencyStore on a real SQLite file: every behaviour of test/core/idempotency.test.ts
 * (test/helpers/idempotency.ts), with the coordinator on the same file (sqliteBackend), each client
 * on its own connection as another process would be.
 */
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { describe, expect, it } from 'vitest';
import { Locks } from '../../src/core/locks.js';
import { sqliteBackend, sqliteIdempotencyStore } from '../../src/sqlite/index.js';
import { tempDir } from '../helpers/env.js';
import { idempotencyScenarios } from '../helpers/idempotency.js';

idempotencyScenarios('sqlite', async () => {
  const dir = tempDir();
  const path = join(dir.path, 'app.db');
  const db = new Database(path, { timeout: 100 });
  db.pragma('journal_mode = WAL');
  db.exec('CREATE TABLE effects (seq INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL, attempt TEXT NOT NULL)');
  const dbs = [db];
  return {
    store: () => {
      const own = new Database(path, { timeout: 100 });
      dbs.push(own);
      return sqliteIdempotencyStore(own, { table: 'idem' });
    },
    locks: () => new Locks({ backend: sqliteBackend({ path }) }),
    effect: (tx, key, attempt) => tx.prepare('INSERT INTO effects (key, attempt) VALUES (?, ?)').run(key, attempt),
    effects: async (key) => (db.prepare('SELECT attempt FROM effects WHERE key = ? ORDER BY seq').all(key) as { attempt: string }[]).map((r) => r.attempt),
    rows: async (keys) =>
      (db.prepare('SELECT count(*) AS n FROM idem WHERE key IN (SELECT value FROM json_each(?))').get(JSON.stringify(keys)) as { n: number }).n,
    asyncEffect: false,
    cleanup: async () => {
      for (const d of dbs) d.close();
      dir.cleanup();
    },
  };
});

describe('sqliteIdempotencyStore', () => {
  it('refuses what is not a database, unknown options and bad table names', () => {
    const db = new Database(':memory:');
    expect(() => sqliteIdempotencyStore({} as never)).toThrow(/better-sqlite3 Database/);
    expect(() => sqliteIdempotencyStore(db, { tabel: 'x' } as never)).toThrow(/tabel/);
    expect(() => sqliteIdempotencyStore(db, { table: 'a b' })).toThrow(/SQL identifier/);
    db.close();
  });

  it('an effect that returns a promise is refused and rolled back; one that ends the transaction is refused', async () => {
    const db = new Database(':memory:');
    db.exec('CREATE TABLE effects (attempt TEXT)');
    const store = sqliteIdempotencyStore(db);
    const done = () => ({ state: 'completed', token: 1n, payloadHash: '', value: '1' }) as const;
    const async = store.transact('k', 1n, async (tx) => tx.prepare("INSERT INTO effects VALUES ('a')").run(), done, 60_000);
    await expect(async).rejects.toThrow(/synchronously/);
    await expect(store.transact('k', 1n, (tx) => tx.exec('COMMIT'), done, 60_000)).rejects.toThrow(/COMMIT/);
    expect(db.prepare('SELECT count(*) AS n FROM effects').get()).toEqual({ n: 0 });
    expect(await store.get('k')).toBeUndefined();
    db.close();
  });
});

import Database from 'better-sqlite3';
import { describe, expect, it } from 'vitest';
import { BackendUnavailableError } from '../../src/core/errors.js';
import { sqliteFence } from '../../src/sqlite/index.js';

describe('sqliteFence failures', () => {
  it("the store's own failures are BackendUnavailableError; mutate's errors pass unchanged, even SQLite ones", async () => {
    const db = new Database(':memory:');
    const fence = sqliteFence(db);
    await fence.write('r', 1n, () => {});
    // mutate's own SQLite error (a missing table) reaches the caller as it was thrown
    const own = await fence.write('r', 2n, (tx) => tx.prepare('INSERT INTO nowhere VALUES (1)').run()).catch((e: unknown) => e);
    expect(own).not.toBeInstanceOf(BackendUnavailableError);
    expect((own as { code?: string }).code).toBe('SQLITE_ERROR');
    db.close();
    await expect(fence.write('r', 3n, () => {})).rejects.toBeInstanceOf(BackendUnavailableError);
    await expect(fence.highest('r')).rejects.toBeInstanceOf(BackendUnavailableError);
  });
});

describe('sqliteFence on a fresh database', () => {
  it("a first write whose mutate throws does not take the fence's table down with it", async () => {
    const db = new Database(':memory:');
    const fence = sqliteFence(db);
    const boom = new Error('boom');
    await expect(
      fence.write('r', 5n, () => {
        throw boom;
      }),
    ).rejects.toBe(boom);
    expect(await fence.highest('r')).toBeNull();
    await fence.write('r', 1n, () => {});
    expect(await fence.highest('r')).toBe(1n);
    db.close();
  });

  it("a first write inside the user's own transaction, rolled back, leaves a working fence", async () => {
    const db = new Database(':memory:');
    db.exec('CREATE TABLE data (v INTEGER)');
    const fence = sqliteFence(db);
    db.exec('BEGIN');
    await fence.write('r', 7n, (tx) => tx.prepare('INSERT INTO data VALUES (7)').run());
    db.exec('ROLLBACK');
    expect(await fence.highest('r')).toBeNull();
    await fence.write('r', 1n, (tx) => tx.prepare('INSERT INTO data VALUES (1)').run());
    expect(await fence.highest('r')).toBe(1n);
    expect(db.prepare('SELECT v FROM data').pluck().all()).toEqual([1]);
    // the same inside a user transaction that commits
    db.exec('BEGIN');
    await fence.write('r', 2n, (tx) => tx.prepare('INSERT INTO data VALUES (2)').run());
    db.exec('COMMIT');
    expect(await fence.highest('r')).toBe(2n);
    db.close();
  });

  it('highest inside the rolled-back user transaction saw the mark; afterwards the table is back', async () => {
    const db = new Database(':memory:');
    const fence = sqliteFence(db);
    db.exec('BEGIN');
    await fence.write('r', 3n, () => {});
    expect(await fence.highest('r')).toBe(3n);
    db.exec('ROLLBACK');
    expect(await fence.highest('r')).toBeNull();
    await fence.write('r', 1n, () => {});
    expect(await fence.highest('r')).toBe(1n);
    db.close();
  });
});

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

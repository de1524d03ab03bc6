import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { describe, expect, it } from 'vitest';
import { createLocks, StaleTokenError } from '../../src/index.js';
import { sqliteBackend, sqliteFence } from '../../src/sqlite/index.js';

describe('smoke sqlite', () => {
  it('acquires, fences, releases', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'lh-'));
    try {
      const locks = createLocks({ backend: sqliteBackend({ path: join(dir, 'l.db') }) });
      const a = await locks.acquire('k', { ttlMs: 1000 });
      expect(a.token).toBe(1n);
      const db = new Database(join(dir, 'data.db'));
      const fence = sqliteFence(db);
      db.exec('create table doc(v text)');
      await fence.write('r', a.token, (d) => d.prepare("insert into doc values ('a')").run());
      const waiting = locks.acquire('k', { ttlMs: 1000, waitMs: 3000 });
      setTimeout(() => void a.release(), 50);
      const b = await waiting;
      expect(b.token).toBe(2n);
      await fence.write('r', b.token, () => {});
      await expect(fence.write('r', a.token, () => {})).rejects.toBeInstanceOf(StaleTokenError);
      expect(await fence.highest('r')).toBe(2n);
      console.log(await locks.inspect());
      await locks.close();
      db.close();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

import { join } from 'node:path';
import Database from 'better-sqlite3';
import { describe, expect, it } from 'vitest';
import { sqliteBackend } from '../../src/sqlite/index.js';
import { tempDir } from '../helpers/env.js';
import { semaphoreCases } from '../memory/semaphore-cases.js';

semaphoreCases('sqlite', async () => {
  const dir = tempDir();
  const path = join(dir.path, 'locks.db');
  // each client opens its own connection to the file, as separate processes would
  return { connect: async () => sqliteBackend({ path }), cleanup: async () => dir.cleanup() };
});

describe('sqlite: semaphore storage', () => {
  it('a table made before permits gets the permit_limit column on first use; its rows read as plain locks', async () => {
    const dir = tempDir();
    try {
      const path = join(dir.path, 'old.db');
      const old = new Database(path);
      old.exec(`CREATE TABLE leasehold_locks (key TEXT NOT NULL, owner TEXT NOT NULL, mode TEXT NOT NULL CHECK (mode IN ('exclusive', 'shared')),
        token INTEGER NOT NULL, holder TEXT NOT NULL, expires_at INTEGER NOT NULL, epoch TEXT NOT NULL, lock_delay_ms INTEGER NOT NULL,
        PRIMARY KEY (key, owner)) WITHOUT ROWID`);
      old.close();
      const backend = sqliteBackend({ path });
      const base = { mode: 'shared', ttlMs: 5_000, lockDelayMs: 0, holder: 'h', queue: false, queueTtlMs: 5_000 } as const;
      expect((await backend.acquire({ ...base, key: 'k', owner: 'a', limit: 2 })).granted).toBe(true);
      const [state] = await backend.inspect('k');
      expect(state?.limit).toBe(2);
      await backend.close();
      const db = new Database(path, { readonly: true });
      const columns = (db.prepare(`SELECT name FROM pragma_table_info('leasehold_locks')`).all() as { name: string }[]).map((c) => c.name);
      db.close();
      expect(columns).toContain('permit_limit');
    } finally {
      dir.cleanup();
    }
  });
});

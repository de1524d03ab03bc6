/**
 * The idempotency recipe with real processes on one SQLite file (test/fixtures/idempotency-worker.mjs,
 * which uses dist/: `npm run build` first): fn once for two processes at once, the takeover of a
 * SIGSTOPped attempt refused by the fence (and its effect absent in the transactional variant), and
 * the control — a plain in-progress flag with an expiry — completing twice.
 */
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { sqliteIdempotencyStore } from '../../src/sqlite/index.js';
import { tempDir } from '../helpers/env.js';
import { processScenarios } from '../helpers/idempotency.js';

processScenarios('sqlite', async () => {
  const dir = tempDir();
  const path = join(dir.path, 'app.db');
  const db = new Database(path, { timeout: 100 });
  db.pragma('journal_mode = WAL');
  db.exec(`CREATE TABLE effects (seq INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL, attempt TEXT NOT NULL);
    CREATE TABLE flags (key TEXT PRIMARY KEY, state TEXT NOT NULL, value TEXT, expires_at INTEGER NOT NULL)`);
  return {
    connection: { db: 'sqlite', path },
    effects: async (key) => (db.prepare('SELECT attempt FROM effects WHERE key = ? ORDER BY seq').all(key) as { attempt: string }[]).map((r) => r.attempt),
    store: () => sqliteIdempotencyStore(db),
    flag: async (key) => db.prepare('SELECT state, value FROM flags WHERE key = ?').get(key) as { state: string; value: string | null } | undefined,
    cleanup: async () => {
      db.close();
      dir.cleanup();
    },
  };
});

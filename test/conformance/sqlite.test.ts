import { join } from 'node:path';
import { sqliteBackend } from '../../src/sqlite/index.js';
import { tempDir } from '../helpers/env.js';
import { backendConformance } from '../../src/testing/index.js';

backendConformance('sqlite', async () => {
  const dir = tempDir();
  const path = join(dir.path, 'locks.db');
  return {
    // each client opens its own connection to the file, as separate processes would
    connect: async () => sqliteBackend({ path }),
    prefix: 'conf',
    ttlMs: 300,
    // a "coordinator restart" of an embedded store is every connection closing and reopening: nothing to do between them
    restart: async () => {},
    cleanup: async () => dir.cleanup(),
  };
});

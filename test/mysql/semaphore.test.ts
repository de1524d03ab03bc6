import { describe, expect, it } from 'vitest';
import { mysqlBackend } from '../../src/mysql/index.js';
import { MYSQL_URL, uniqueName } from '../helpers/env.js';
import { semaphoreCases } from '../memory/semaphore-cases.js';
import { dropLeaseTables } from './support.js';

semaphoreCases('mysql', async () => {
  const table = uniqueName('lh_sem');
  // each client has its own pool and poller, as separate processes would
  return { connect: async () => mysqlBackend({ uri: MYSQL_URL, table, poolSize: 4 }), cleanup: () => dropLeaseTables(table) };
});

describe('mysql: semaphore storage', () => {
  it("the key's limit is the permit_limit column of its holders, the refusal a SIGNAL the backend maps (nothing written)", async () => {
    const table = uniqueName('lh_sem_sig');
    const backend = mysqlBackend({ uri: MYSQL_URL, table, poolSize: 2 });
    try {
      const base = { key: 'k', mode: 'shared', ttlMs: 5_000, lockDelayMs: 0, holder: 'h', queue: false, queueTtlMs: 5_000 } as const;
      expect(await backend.acquire({ ...base, owner: 'p1', limit: 4 })).toMatchObject({ granted: true, token: 1n });
      const refused = await backend.acquire({ ...base, owner: 'p2', limit: 7 }).catch((e: unknown) => e);
      expect(refused).toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'limit' });
      expect((refused as Error).message).toMatch(/semaphore of 4 permits.*7 permits/);
      expect((refused as { cause?: { sqlState?: string } }).cause?.sqlState).toBe('LH001');
      const [state] = await backend.inspect('k');
      expect(state).toMatchObject({ limit: 4, lastToken: 1n, waiters: 0 });
    } finally {
      await backend.close();
      await dropLeaseTables(table);
    }
  });
});

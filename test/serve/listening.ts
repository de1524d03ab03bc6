// Lock servers listening on loopback for one test file (real HTTP), over the backends the long-poll
// tests run on: started per test and closed after it, with their SQLite directories, PostgreSQL
// schema and Redis keys removed.
import { join } from 'node:path';
import pg from 'pg';
import { afterAll, afterEach } from 'vitest';
import { memoryBackend } from '../../src/memory/index.js';
import { redisBackend } from '../../src/redis/index.js';
import { type RunningLockServer, startLockServer } from '../../src/serve/index.js';
import { PG_URL, tempDir, uniqueName } from '../helpers/env.js';
import { deleteKeys, REDIS_URL } from '../redis/servers.js';
import { http } from './helpers.js';

type ServerOptions = Parameters<typeof startLockServer>[0];

/** Registers the file's cleanup; `tag` names its PostgreSQL schema and Redis prefix. */
export function listeningServers(tag: string) {
  const servers: RunningLockServer[] = [];
  const dirs: { cleanup(): void }[] = [];
  const pgSchema = uniqueName(`lh_serve_${tag}`);
  const redisPrefix = `${uniqueName(`lhserve${tag}`)}:`;
  let usedPg = false;
  let usedRedis = false;
  afterEach(async () => {
    await Promise.allSettled(servers.splice(0).map((s) => s.close()));
    for (const d of dirs.splice(0)) d.cleanup();
  });
  afterAll(async () => {
    if (usedPg) {
      const admin = new pg.Client({ connectionString: PG_URL });
      await admin.connect();
      try {
        await admin.query(`DROP SCHEMA IF EXISTS ${pgSchema} CASCADE`);
      } finally {
        await admin.end();
      }
    }
    if (usedRedis) await deleteKeys(REDIS_URL, redisPrefix);
  });
  const sqliteUrl = (): string => {
    const dir = tempDir();
    dirs.push(dir);
    return `sqlite:${join(dir.path, 'locks.db')}`;
  };
  const redis = () => {
    usedRedis = true;
    return redisBackend({ url: REDIS_URL, prefix: redisPrefix });
  };
  const postgresUrl = (): string => {
    usedPg = true;
    return `${PG_URL}${PG_URL.includes('?') ? '&' : '?'}schema=${pgSchema}`;
  };
  return {
    /** A server on 127.0.0.1 and a free port, closed after the test. */
    async start(options: ServerOptions): Promise<RunningLockServer> {
      const s = await startLockServer({ host: '127.0.0.1', port: 0, ...options });
      servers.push(s);
      return s;
    },
    sqliteUrl,
    redis,
    /** Server options for each backend the long-poll tests run over, for `describe.each`. */
    backends: [
      ['memory', () => ({ backend: memoryBackend() })],
      ['SQLite', () => ({ url: sqliteUrl() })],
      ['PostgreSQL', () => ({ url: postgresUrl() })],
      ['Redis', () => ({ backend: redis() })],
    ] as [string, () => ServerOptions][],
  };
}

/** The key's waiters, as the listing shows them. */
export async function waitersOf(base: string, key: string): Promise<number> {
  const { body } = await http(base, 'GET', `/v1/locks?prefix=${encodeURIComponent(key)}`);
  return (body.locks as { key: string; waiters: number }[]).find((k) => k.key === key)?.waiters ?? 0;
}

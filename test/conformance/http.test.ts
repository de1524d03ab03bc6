/**
 * The backend conformance suite over the wire: each client is an `httpBackend` of a real lock
 * service (`leasehold serve`, started in process on a free port) in front of a real backend. The
 * server is stateless, so the harness's restart() stops it and starts a new one over the same
 * backend (clients connected after it use the new address), as a restarted `leasehold serve` would.
 */
import pg from 'pg';
import type { Backend } from '../../src/core/backend.js';
import { httpBackend } from '../../src/http/index.js';
import { memoryBackend } from '../../src/memory/index.js';
import { postgresBackend } from '../../src/postgres/index.js';
import { redisBackend } from '../../src/redis/index.js';
import { type RunningLockServer, startLockServer } from '../../src/serve/index.js';
import { sqliteBackend } from '../../src/sqlite/index.js';
import { backendConformance, type BackendHarness } from '../../src/testing/index.js';
import { PG_URL, tempDir, uniqueName } from '../helpers/env.js';
import { deleteKeys, REDIS_URL } from '../redis/servers.js';

/**
 * A lock service in front of `backend` (which the server never closes: `cleanup` does), with
 * clients that are httpBackends of it.
 */
async function overHttp(backend: Backend, ttlMs: number, cleanup: () => Promise<void>): Promise<BackendHarness> {
  let server: RunningLockServer = await startLockServer({ backend, port: 0 });
  return {
    connect: async () => httpBackend({ url: server.url }),
    prefix: 'conf',
    ttlMs,
    restart: async () => {
      await server.close();
      server = await startLockServer({ backend, port: 0 });
    },
    cleanup: async () => {
      await server.close();
      await backend.close();
      await cleanup();
    },
  };
}

// ttlMs: each call is a round trip through a server in this process (on a busy 2-core machine), so the
// timing tests get more room than the backends' own conformance runs give them.
backendConformance('http → memory with sessions', () => overHttp(memoryBackend({ sessions: true }), 400, async () => {}));

// The server answers 501 to POST /v1/sessions: the client keeps its sessions itself, one renewal per
// lease (the sessions test's 50 leases are 50 requests per keep-alive: a longer ttl).
backendConformance('http → memory without sessions', () => overHttp(memoryBackend(), 800, async () => {}));

backendConformance('http → sqlite', async () => {
  const dir = tempDir();
  return overHttp(sqliteBackend({ path: `${dir.path}/locks.db` }), 600, async () => dir.cleanup());
});

backendConformance('http → postgres', async () => {
  const schema = uniqueName('lh_http');
  return overHttp(postgresBackend({ connectionString: PG_URL, schema, poolSize: 8 }), 600, async () => {
    const admin = new pg.Client({ connectionString: PG_URL });
    await admin.connect();
    try {
      await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
    } finally {
      await admin.end();
    }
  });
});

backendConformance('http → redis', async () => {
  const prefix = `${uniqueName('lhhttp')}:`;
  return overHttp(redisBackend({ url: REDIS_URL, prefix }), 600, () => deleteKeys(REDIS_URL, prefix));
});

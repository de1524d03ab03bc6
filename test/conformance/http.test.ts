/**
 * The backend conformance suite over the wire: each client is an `httpBackend` of a real lock
 * service (`leasehold serve` from dist/, run `npm run build` first) in a process of its own
 * (test/http/lock-server-process.mjs) in front of a real backend, so clients and server share no
 * event loop, as in production. The server is stateless, so the harness's restart() closes it and
 * starts a new one over the same backend on the same port.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { afterAll } from 'vitest';
import { httpBackend } from '../../src/http/index.js';
import { type BackendHarness, backendConformance } from '../../src/testing/index.js';
import { startCluster } from '../fixtures/etcd-cluster.mjs';
import { MYSQL_URL, PG_URL, tempDir, uniqueName } from '../helpers/env.js';
import { dropLeaseTables } from '../mysql/support.js';
import { deleteKeys, REDIS_URL } from '../redis/servers.js';

const SERVER = fileURLToPath(new URL('../http/lock-server-process.mjs', import.meta.url));
const children = new Set<ChildProcess>();
afterAll(() => {
  for (const child of children) child.kill('SIGKILL'); // only those a failed harness left behind
});

/** Starts the lock service process over the backend `spec` describes; resolves once it listens. */
async function lockServer(spec: Record<string, unknown>): Promise<{ url: () => string; restart(): Promise<void>; stop(): Promise<void> }> {
  const child = spawn(process.execPath, [SERVER, JSON.stringify(spec)], { stdio: ['pipe', 'pipe', 'inherit'] });
  children.add(child);
  const lines = createInterface({ input: child.stdout! });
  const waiting: ((line: string) => void)[] = [];
  lines.on('line', (line) => waiting.shift()?.(line));
  const next = (): Promise<string> =>
    new Promise((resolve, reject) => {
      waiting.push((line) => resolve((JSON.parse(line) as { url: string }).url));
      child.once('exit', (code) => reject(new Error(`the lock server process exited (${code})`)));
    });
  let url = await next();
  return {
    url: () => url,
    restart: async () => {
      child.stdin!.write('restart\n');
      url = await next();
    },
    stop: async () => {
      const exited = new Promise((resolve) => child.once('exit', resolve));
      child.stdin!.write('stop\n');
      await exited;
      children.delete(child);
    },
  };
}

/** Clients of a lock service process over `spec`'s backend; `cleanup` removes what the backend stored. */
async function overHttp(spec: Record<string, unknown>, ttlMs: number, cleanup: () => Promise<void> = async () => {}): Promise<BackendHarness> {
  const server = await lockServer(spec);
  return {
    connect: async () => httpBackend({ url: server.url() }),
    prefix: 'conf',
    ttlMs,
    restart: () => server.restart(),
    cleanup: async () => {
      await server.stop();
      await cleanup();
    },
  };
}

// ttlMs: each call is a round trip through the service, and a renewal must come within 2/3 of the
// ttl. Two processes on a busy 2-core machine: a keep-alive queued at the server behind the
// sessions test's 50 acquires took 140 ms, and over 1 s with the machine saturated. The timing
// tests get more room than the backends' own conformance runs give them. (A server over a backend
// without sessions, where the client keeps them: test/http/service.test.ts.)
backendConformance('http → memory with sessions', () => overHttp({ backend: 'memory-sessions' }, 1_000));

backendConformance('http → sqlite', async () => {
  const dir = tempDir();
  return overHttp({ backend: 'sqlite', path: `${dir.path}/locks.db` }, 1_000, async () => dir.cleanup());
});

backendConformance('http → postgres', async () => {
  const schema = uniqueName('lh_http');
  return overHttp({ backend: 'postgres', url: PG_URL, schema }, 1_000, async () => {
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
  return overHttp({ backend: 'redis', url: REDIS_URL, prefix }, 1_000, () => deleteKeys(REDIS_URL, prefix));
});

backendConformance('http → mysql', async () => {
  const table = uniqueName('lh_http').slice(0, 40);
  return overHttp({ backend: 'mysql', url: MYSQL_URL, table }, 1_000, () => dropLeaseTables(table));
});

// etcd's places are granted by their position and its grants handed to a queued session by
// itself: the service's long polls do not keep places there (docs/http-api.md). One member of our
// own; its minimum lease is 1 s, so the suite's ttls get more room over the wire.
backendConformance('http → etcd', async () => {
  const cluster = await startCluster({ members: 1, heartbeatMs: 50, electionMs: 500 });
  const prefix = uniqueName('lhhttp');
  try {
    return await overHttp({ backend: 'etcd', hosts: cluster.endpoints, prefix }, 1_500, () => cluster.stop());
  } catch (error) {
    await cluster.stop();
    throw error;
  }
});

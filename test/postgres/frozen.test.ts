/**
 * close() against a PostgreSQL that accepts connections and never answers. The shared server is
 * not ours to freeze: the backend talks to it through a TCP proxy in a child process, and the proxy
 * is SIGSTOPped (the kernel keeps accepting and acknowledging, nothing is answered or closed).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import { createLocks } from '../../src/index.js';
import { postgresBackend } from '../../src/postgres/index.js';
import { eventually, PG_URL, uniqueName } from '../helpers/env.js';

const PROXY = `
const net = require('node:net');
const [host, port] = [process.argv[1], Number(process.argv[2])];
const server = net.createServer({ allowHalfOpen: true }, (client) => {
  const upstream = net.connect({ host, port, allowHalfOpen: true });
  client.pipe(upstream).on('error', () => {});
  upstream.pipe(client).on('error', () => {});
  client.on('error', () => upstream.destroy());
  upstream.on('error', () => client.destroy());
});
server.listen(0, '127.0.0.1', () => console.log(server.address().port));
`;

const children = new Set<ChildProcess>();
const schemas: string[] = [];

afterAll(async () => {
  for (const c of children) {
    c.kill('SIGCONT');
    c.kill('SIGKILL');
  }
  const admin = new pg.Client({ connectionString: PG_URL });
  await admin.connect();
  for (const s of schemas) await admin.query(`DROP SCHEMA IF EXISTS ${s} CASCADE`).catch(() => {});
  await admin.end();
});

/** A proxy to the shared PostgreSQL in a child process: its URL, and the child to SIGSTOP. */
async function startProxy(): Promise<{ url: string; child: ChildProcess }> {
  const target = new URL(PG_URL);
  const child = spawn(process.execPath, ['-e', PROXY, target.hostname, target.port || '5432'], { stdio: ['ignore', 'pipe', 'inherit'] });
  children.add(child);
  const port = await new Promise<number>((resolve, reject) => {
    child.stdout!.setEncoding('utf8').once('data', (d: string) => resolve(Number(d.trim())));
    child.once('exit', () => reject(new Error('proxy exited')));
  });
  const url = new URL(PG_URL);
  url.hostname = '127.0.0.1';
  url.port = String(port);
  return { url: url.toString(), child };
}

function tcpHandles(): number {
  return process.getActiveResourcesInfo().filter((r) => r === 'TCPWrap' || r === 'TCPSocketWrap').length;
}

describe('postgres: close() against a frozen server', () => {
  it('locks.close() resolves with a lease held and the LISTEN connection open, and leaves no socket behind', async () => {
    const { url, child } = await startProxy();
    const schema = uniqueName('frozen');
    schemas.push(schema);
    try {
      const before = tcpHandles();
      const locks = createLocks({ backend: postgresBackend({ connectionString: url, schema }) });
      const lease = await locks.acquire('frozen-pg', { ttlMs: 10_000 });
      // A waiter that times out opens the LISTEN connection (kept for a while after).
      const waited = await locks.acquire('frozen-pg', { ttlMs: 10_000, waitMs: 300 }).catch((e: unknown) => e);
      expect((waited as { code?: string }).code).toBe('ACQUIRE_TIMEOUT');
      expect(lease.held).toBe(true);
      child.kill('SIGSTOP');
      let settled = false;
      const closing = locks.close().finally(() => (settled = true));
      expect(await eventually(() => settled, 20_000, 50)).toBe(true);
      await closing;
      // Still frozen: every socket of ours is closed (none left waiting for the server's goodbye).
      expect(await eventually(() => tcpHandles() <= before, 15_000, 50)).toBe(true);
    } finally {
      child.kill('SIGCONT');
      child.kill('SIGKILL');
    }
  });
});

/**
 * redis-server instances the Redis tests start on their own free ports (to kill, restart empty,
 * or run several). Each is started without persistence; `stopAll` in afterAll kills what is left.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { sleep } from '../helpers/env.js';

export const REDIS_URL = process.env.LEASEHOLD_TEST_REDIS_URL ?? 'redis://127.0.0.1:6379';
const SERVER_BIN = process.env.LEASEHOLD_TEST_REDIS_SERVER ?? 'redis-server';

export interface RedisServer {
  readonly port: number;
  readonly url: string;
  /** Kills the process (SIGKILL by default) and waits for it to exit; its data is gone. */
  kill(signal?: NodeJS.Signals): Promise<void>;
  /** Starts it again on the same port, empty. */
  start(): Promise<void>;
  /** SIGSTOP / SIGCONT: a server that hangs without closing connections. */
  pause(): void;
  resume(): void;
}

const running = new Set<ChildProcess>();

export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address() as net.AddressInfo;
      srv.close(() => resolve(port));
    });
  });
}

async function ping(port: number): Promise<boolean> {
  const client = new Redis({
    port,
    host: '127.0.0.1',
    lazyConnect: true,
    enableOfflineQueue: false,
    maxRetriesPerRequest: 0,
    retryStrategy: () => null,
    connectTimeout: 500,
  });
  client.on('error', () => {});
  try {
    await client.connect();
    return (await client.ping()) === 'PONG';
  } catch {
    return false;
  } finally {
    client.disconnect();
  }
}

const dirs: string[] = [];

/**
 * Starts a redis-server with no persistence (`--save "" --appendonly no`) on a free port, in a
 * directory of its own that is emptied before every start: a replica's full sync writes an RDB
 * file there, and a server would load it at start-up (not empty any more).
 */
export async function startRedis(extraArgs: string[] = []): Promise<RedisServer> {
  let port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), 'leasehold-redis-'));
  dirs.push(dir);
  let child: ChildProcess | undefined;
  const start = async (): Promise<void> => {
    rmSync(join(dir, 'dump.rdb'), { force: true });
    const p = spawn(
      SERVER_BIN,
      ['--port', String(port), '--bind', '127.0.0.1', '--dir', dir, '--save', '', '--appendonly', 'no', '--logfile', '', '--loglevel', 'warning', ...extraArgs],
      { stdio: 'ignore', cwd: dir },
    );
    child = p;
    running.add(p);
    p.on('exit', () => running.delete(p));
    for (let i = 0; i < 100; i++) {
      if (await ping(port)) return;
      if (p.exitCode !== null) throw new Error(`redis-server on port ${port} exited with ${p.exitCode}`);
      await sleep(50);
    }
    throw new Error(`redis-server on port ${port} did not answer PING`);
  };
  // The port was free when picked; another process may bind it before redis-server does (it then
  // exits at once). New port, new try.
  for (let attempt = 1; ; attempt++) {
    try {
      await start();
      break;
    } catch (error) {
      if (attempt >= 3 || !/exited/.test(String(error))) throw error;
      port = await freePort();
    }
  }
  return {
    port,
    url: `redis://127.0.0.1:${port}`,
    async kill(signal = 'SIGKILL') {
      const p = child;
      if (!p || p.exitCode !== null || p.signalCode !== null) return;
      const exited = new Promise((r) => p.once('exit', r));
      p.kill('SIGCONT');
      p.kill(signal);
      await exited;
    },
    start,
    pause: () => child?.kill('SIGSTOP'),
    resume: () => child?.kill('SIGCONT'),
  };
}

/** Kills every server these tests started (afterAll, and on failure) and removes their directories. */
export async function stopAll(): Promise<void> {
  await Promise.all(
    [...running].map(async (p) => {
      if (p.exitCode !== null || p.signalCode !== null) return;
      const exited = new Promise((r) => p.once('exit', r));
      p.kill('SIGCONT');
      p.kill('SIGKILL');
      await exited;
    }),
  );
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
}

process.once('exit', () => {
  for (const p of running) p.kill('SIGKILL');
});

/** Deletes every key under `prefix` (the shared server is used by other tests: only ours). */
export async function deleteKeys(url: string, prefix: string): Promise<void> {
  const client = new Redis(url);
  client.on('error', () => {});
  try {
    let cursor = '0';
    do {
      const [next, keys] = await client.scan(cursor, 'MATCH', `${prefix.replace(/[*?[\]\\]/g, '\\$&')}*`, 'COUNT', 1000);
      cursor = next;
      if (keys.length > 0) await client.del(...keys);
    } while (cursor !== '0');
  } finally {
    client.disconnect();
  }
}

/** Calls of each command the server has executed (top-level commands and those inside scripts). */
export async function commandStats(client: Redis): Promise<Record<string, number>> {
  const info = await client.info('commandstats');
  const out: Record<string, number> = {};
  for (const m of info.matchAll(/^cmdstat_([^:]+):calls=(\d+)/gm)) out[m[1]!] = Number(m[2]);
  return out;
}

export function delta(before: Record<string, number>, after: Record<string, number>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [k, v] of Object.entries(after)) if (v - (before[k] ?? 0) > 0) out[k] = v - (before[k] ?? 0);
  return out;
}

/** Calls of leasehold's operations in a commandstats delta: FCALL (Functions) or EVALSHA/EVAL (scripts). */
export function scriptCalls(d: Record<string, number>): number {
  return (d.fcall ?? 0) + (d.evalsha ?? 0) + (d.eval ?? 0);
}

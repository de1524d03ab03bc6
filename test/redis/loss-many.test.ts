/**
 * I6 with many leases on one session (issue 13, item 3): a client holding 10,000 Redis leases is
 * cut off (a DelayProxy holds everything it sends); another process waits for some of its keys.
 * Every lease's signal must abort before that process is granted the key — including the last
 * lease of the loss pass. Times are read from this one machine's clock in both processes.
 */
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Locks } from '../../src/core/locks.js';
import type { Lease } from '../../src/core/lease.js';
import { redisBackend } from '../../src/redis/index.js';
import { DelayProxy } from '../../src/verify/proxy.js';
import { startRedis, stopAll, type RedisServer } from './servers.js';

const script = new URL('../fixtures/redis-take-over.mjs', import.meta.url).pathname;
const COUNT = 10_000;
const TTL_MS = 2_000;

let server: RedisServer;
beforeAll(async () => {
  server = await startRedis();
});
afterAll(stopAll);

describe(`redis: ${COUNT} leases on one session, cut off`, () => {
  it('every signal aborts before another process is granted any of the keys (I6)', async () => {
    const proxy = await DelayProxy.start({ host: '127.0.0.1', port: server.port });
    const locks = new Locks({ backend: redisBackend({ url: `redis://127.0.0.1:${proxy.port}` }) });
    const abortedAt = new Map<string, number>();
    let child: ReturnType<typeof spawn> | undefined;
    try {
      const leases: Lease[] = [];
      for (let i = 0; i < COUNT; i += 500) {
        leases.push(...(await Promise.all(Array.from({ length: 500 }, (_, j) => locks.acquire(`many/${i + j}`, { ttlMs: TTL_MS })))));
      }
      for (const lease of leases) {
        lease.signal.addEventListener('abort', () => abortedAt.set(lease.key, performance.timeOrigin + performance.now()), { once: true });
      }
      // The pass goes in insertion order: the first, a middle and the last lease.
      const watched = [leases[0]!.key, leases[COUNT / 2]!.key, leases[COUNT - 1]!.key];
      child = spawn(process.execPath, [script, server.url, String(TTL_MS), ...watched], { stdio: ['ignore', 'pipe', 'inherit'] });
      const lines = createInterface({ input: child.stdout! });
      const messages: Record<string, unknown>[] = [];
      const waitFor = (field: string) =>
        new Promise<Record<string, unknown>>((resolve, reject) => {
          child!.once('exit', (code) => reject(new Error(`take-over process exited with ${code}`)));
          const check = (): void => {
            const m = messages.find((x) => field in x);
            if (m) resolve(m);
          };
          lines.on('line', (line) => {
            messages.push(JSON.parse(line) as Record<string, unknown>);
            check();
          });
          check();
        });
      await waitFor('ready');
      proxy.hold(); // the partition: keep-alives no longer arrive
      const { granted } = (await waitFor('granted')) as unknown as { granted: { key: string; at: number }[] };
      expect(abortedAt.size).toBe(COUNT);
      const late = granted.map((g) => ({ key: g.key, grantedAt: g.at, abortedAt: abortedAt.get(g.key)! })).filter((g) => !(g.abortedAt < g.grantedAt));
      expect(late).toEqual([]); // a lease still "valid" while another process held its key would be listed here
    } finally {
      child?.kill('SIGKILL');
      proxy.deliver();
      await locks.close();
      await proxy.close();
    }
  }, 60_000);
});

/**
 * 1,000 sessions kept alive on one lock server for a minute, none lost (issue 19, Tests): a lock
 * server in a process of its own (the built package's startLockServer over a memory backend with
 * sessions; the command's `memory:` has none),
 * 1,000 sessions opened over HTTP with a session lease on a key of each, one keep-alive loop per
 * session at ttl/3 for 60 s from its opening, through a bounded number of requests in flight. Every
 * keep-alive is answered 200, every session is alive at the end, and every lease, two ttls after it
 * was granted, is still held (GET /v1/locks); closing the sessions then frees all of them.
 *
 * The ttl is 30 s (a keep-alive every 10 s: 100 requests/s for the server). On this 2-core machine,
 * loaded by other suites, one server answered about 160 keep-alives/s over memory and 80/s over
 * SQLite (a commit with fsync each), so a 10 s ttl (300/s) could not be served there whatever the
 * code; 30 s leaves room for a round of keep-alives delayed by seconds. A keep-alive that came later
 * than the ttl would be a 404 (the session gone), which fails the test.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type ChildProcess, spawn } from 'node:child_process';
import { join } from 'node:path';
import { requireBuild, ROOT } from '../cli/helpers.js';
import { sleep } from '../helpers/env.js';

const SESSIONS = 1_000;
const TTL_MS = 30_000;
const KEEP_ALIVE_EVERY_MS = Math.round(TTL_MS / 3);
const RUN_MS = 60_000;
/** Requests in flight at once, across all sessions. */
const IN_FLIGHT = 16;

/**
 * The server's process: the built package, a memory backend with sessions, any free loopback port;
 * prints its URL. The rate limit is per caller, and every request here is the same (anonymous) one.
 */
const SERVER = `
import { startLockServer } from ${JSON.stringify(join(ROOT, 'dist/serve/index.js'))};
import { memoryBackend } from ${JSON.stringify(join(ROOT, 'dist/memory/index.js'))};
const backend = memoryBackend({ sessions: true });
const server = await startLockServer({ backend, port: 0, rateLimit: 100_000 });
console.log('listening on ' + server.url);
process.on('SIGTERM', async () => { await server.close(); await backend.close(); process.exit(0); });
`;

let server: ChildProcess | undefined;
let base: string;

beforeAll(async () => {
  requireBuild();
  const child = spawn(process.execPath, ['--input-type=module', '-e', SERVER], { stdio: ['ignore', 'pipe', 'inherit'] });
  server = child;
  base = await new Promise<string>((resolve, reject) => {
    let out = '';
    child.stdout!.setEncoding('utf8').on('data', (d: string) => {
      out += d;
      const m = /listening on (\S+)/.exec(out);
      if (m) resolve(m[1]!);
    });
    child.on('exit', (code) => reject(new Error(`the server exited (${code}) before listening: ${out}`)));
  });
}, 30_000);
afterAll(async () => {
  if (server && server.exitCode === null) {
    const exited = new Promise((resolve) => server!.once('exit', resolve));
    server.kill('SIGTERM');
    await exited;
  }
});

/**
 * A bounded number of calls in flight; the rest wait their turn, keep-alives (`urgent`) before
 * sessions still being opened, as the clients' own keep-alives would not queue behind others' opens.
 */
function limiter(max: number): <T>(fn: () => Promise<T>, urgent?: boolean) => Promise<T> {
  let active = 0;
  const urgentQueue: (() => void)[] = [];
  const queue: (() => void)[] = [];
  return async (fn, urgent = false) => {
    if (active >= max) await new Promise<void>((resolve) => (urgent ? urgentQueue : queue).push(resolve));
    active++;
    try {
      return await fn();
    } finally {
      active--;
      (urgentQueue.shift() ?? queue.shift())?.();
    }
  };
}

async function post(path: string, body: unknown): Promise<{ status: number; body: Record<string, unknown> }> {
  const res = await fetch(base + path, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, body: text === '' ? {} : (JSON.parse(text) as Record<string, unknown>) };
}

describe('one lock server, 1,000 sessions', () => {
  it(
    'kept alive at ttl/3 for a minute: every keep-alive answered 200, every session alive and every session lease still held at the end',
    async () => {
      const limit = limiter(IN_FLIGHT);
      const answers = new Map<number, number>();
      const misses: string[] = [];
      let longestGapMs = 0;
      const begun = performance.now();
      // Each session is opened and given a lease over HTTP, then kept alive by its own loop for a
      // minute from then: a keep-alive every ttl/3, IN_FLIGHT requests at a time across all of them.
      const sessions = await Promise.all(
        Array.from({ length: SESSIONS }, async (_, i) => {
          const key = `scale/${String(i).padStart(4, '0')}`;
          const id = await limit(async () => {
            const opened = await post('/v1/sessions', { ttlMs: TTL_MS });
            expect(opened.status).toBe(201);
            const got = await post(`/v1/locks/${encodeURIComponent(key)}/acquire`, { session: opened.body.session, label: `client-${i}` });
            expect(got.status).toBe(200);
            expect(got.body.ttlMs).toBe(TTL_MS);
            return opened.body.session as string;
          });
          const opened = performance.now();
          let last = opened;
          while (performance.now() - opened < RUN_MS) {
            await sleep(Math.max(0, KEEP_ALIVE_EVERY_MS - (performance.now() - last)));
            const sent = performance.now();
            const { status } = await limit(() => post(`/v1/sessions/${encodeURIComponent(id)}/keepalive`, {}), true);
            const now = performance.now();
            answers.set(status, (answers.get(status) ?? 0) + 1);
            if (status !== 200) {
              misses.push(
                `session ${i}: ${status} at ${Math.round(now - begun)} ms, ${Math.round(now - last)} ms after its previous answer (answered in ${Math.round(now - sent)} ms)`,
              );
            }
            longestGapMs = Math.max(longestGapMs, now - last);
            last = now;
          }
          return { id, key };
        }),
      );
      // Every keep-alive of the minute found its session (a late one would have been a 404).
      expect(misses.slice(0, 10), `${misses.length} keep-alives failed`).toEqual([]);
      expect([...answers.keys()]).toEqual([200]);
      expect(answers.get(200)).toBeGreaterThanOrEqual(SESSIONS * Math.floor(RUN_MS / KEEP_ALIVE_EVERY_MS / 2));
      expect(longestGapMs, 'longest time between two keep-alives of one session').toBeLessThan(TTL_MS);

      // At the end: every session still alive, every lease still held, by its own session's client.
      const final = await Promise.all(sessions.map((s) => limit(() => post(`/v1/sessions/${encodeURIComponent(s.id)}/keepalive`, {}))));
      expect(final.filter((a) => a.status !== 200)).toEqual([]);
      const listed = await fetch(`${base}/v1/locks?prefix=scale%2F`);
      const { locks } = (await listed.json()) as { locks: { key: string; holders: { holder: string; expiresInMs: number }[] }[] };
      expect(locks).toHaveLength(SESSIONS);
      for (const [i, lock] of locks.entries()) {
        expect(lock.key).toBe(`scale/${String(i).padStart(4, '0')}`);
        expect(lock.holders).toHaveLength(1);
        expect(lock.holders[0]!.holder).toBe(`client-${i}`);
        expect(lock.holders[0]!.expiresInMs).toBeGreaterThan(0);
      }

      // Closing the sessions frees their leases.
      await Promise.all(
        sessions.map((s) =>
          limit(async () => {
            const res = await fetch(`${base}/v1/sessions/${encodeURIComponent(s.id)}`, { method: 'DELETE' });
            expect(res.status).toBe(204);
          }),
        ),
      );
      const after = (await (await fetch(`${base}/v1/locks?prefix=scale%2F`)).json()) as { locks: unknown[] };
      expect(after.locks).toEqual([]);
    },
    RUN_MS + 120_000,
  );
});

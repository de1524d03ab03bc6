/**
 * Election with real processes (issue 16): three processes campaign on Redis (a frozen process
 * holds nothing open on the server, as it would hold SQLite's write lock mid-transaction); the
 * leader is frozen with SIGSTOP past its ttl; another is elected with a higher term; the frozen one
 * learns of its loss as soon as it runs again and its late fenced write is refused; an observer
 * (this process) sees every leader in order.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { afterAll, describe, expect, it } from 'vitest';
import type { Leader } from '../../src/core/election.js';
import { Redis } from 'ioredis';
import { Locks } from '../../src/core/locks.js';
import { redisBackend } from '../../src/redis/index.js';
import { eventually, uniqueName } from '../helpers/env.js';

const script = new URL('../fixtures/election-worker.mjs', import.meta.url).pathname;
const TTL_MS = 600;
const REDIS_URL = process.env.LEASEHOLD_TEST_REDIS_URL ?? 'redis://127.0.0.1:6379';
const prefix = `${uniqueName('election')}:`;
const children: ChildProcess[] = [];
afterAll(async () => {
  for (const c of children) {
    c.kill('SIGCONT');
    c.kill('SIGKILL');
  }
  const admin = new Redis(REDIS_URL);
  const keys = await admin.keys(`*${prefix}*`);
  if (keys.length > 0) await admin.del(...keys);
  admin.disconnect();
});

interface Event {
  name: string;
  pid: number;
  at: number;
  ev: string;
  token: string;
  outcome?: string;
}

describe('election across processes', () => {
  it('a frozen leader is replaced by a higher term, learns it on waking, and its late write is refused', async () => {
    const events: Event[] = [];
    const observer = new Locks({ backend: redisBackend({ url: REDIS_URL, prefix: `${prefix}locks:` }) });
    const stop = new AbortController();
    const seen: (Leader | null)[] = [];
    const observing = (async () => {
      for await (const leader of observer.election('cluster:leader').observe({ signal: stop.signal })) seen.push(leader);
    })();

    for (const name of ['n1', 'n2', 'n3']) {
      const child = spawn(process.execPath, [script, REDIS_URL, prefix, name, String(TTL_MS)], { stdio: ['ignore', 'pipe', 'inherit'] });
      children.push(child);
      createInterface({ input: child.stdout! }).on('line', (line) => events.push(JSON.parse(line) as Event));
    }
    expect(await eventually(() => events.some((e) => e.ev === 'leader'), 15_000)).toBe(true);
    const first = events.find((e) => e.ev === 'leader')!;
    const frozen = children.find((c) => c.pid === first.pid)!;
    frozen.kill('SIGSTOP');
    // Another process is elected once the frozen leader's lease runs out, with a higher term.
    expect(await eventually(() => events.some((e) => e.ev === 'leader' && e.pid !== first.pid), 10_000)).toBe(true);
    const second = events.find((e) => e.ev === 'leader' && e.pid !== first.pid)!;
    expect(BigInt(second.token)).toBeGreaterThan(BigInt(first.token));
    // The new leader's term reaches the fence with its first write: only after that can the fence
    // refuse the old term (a late write that comes before it is simply earlier, and accepted). On a
    // loaded machine that write may lag the election, so wait for it before waking the old leader.
    const reader = new Redis(REDIS_URL);
    try {
      const wrote = `${second.name}:${second.token}`;
      expect(await eventually(async () => (await reader.lrange(`${prefix}writes`, 0, -1)).includes(wrote), 10_000)).toBe(true);
    } finally {
      reader.disconnect();
    }
    frozen.kill('SIGCONT');
    expect(await eventually(() => events.some((e) => e.ev === 'late-write' && e.pid === first.pid), 10_000)).toBe(true);
    const lost = events.find((e) => e.ev === 'lost' && e.pid === first.pid)!;
    const late = events.find((e) => e.ev === 'late-write' && e.pid === first.pid)!;
    expect(lost.token).toBe(first.token);
    expect(late.outcome).toBe('refused'); // the deposed leader's term is below the accepted one

    expect(await eventually(() => seen.some((l) => l?.token === BigInt(second.token)), 5_000)).toBe(true);
    stop.abort();
    await observing;
    await observer.close();
    const terms = seen.filter((l): l is Leader => l !== null).map((l) => l.token);
    expect(terms).toContain(BigInt(first.token));
    expect(terms).toContain(BigInt(second.token));
    expect([...terms].sort((x, y) => (x < y ? -1 : 1))).toEqual(terms); // in order
    expect(new Set(terms).size).toBe(terms.length);
    expect(seen.find((l) => l?.token === BigInt(first.token))?.value).toBe(first.name);
  }, 60_000);
});

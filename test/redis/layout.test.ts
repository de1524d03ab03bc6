/**
 * The redis backend's key layout and its garbage collection, read straight from a redis-server of
 * our own: one hash per lock whose TTL only collects garbage. It must never expire while a
 * session-bound holder lives (the session decides that holder's end), and must always get a TTL
 * once nobody holds the key, so idle keys do not pile up. The fast paths skip TTL commands where
 * they need not change; these tests pin that they are not skipped where they must run.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import type { AcquireRequest, Backend } from '../../src/core/backend.js';
import { Locks } from '../../src/core/locks.js';
import { redisBackend } from '../../src/redis/index.js';
import { startRedis, stopAll, type RedisServer } from './servers.js';

const RETAIN = 60_000;
let server: RedisServer;
let admin: Redis;
const opened: (Locks | Backend)[] = [];
const open = <T extends Locks | Backend>(x: T): T => (opened.push(x), x);
const req = (key: string, owner: string, extra: Partial<AcquireRequest> = {}): AcquireRequest => ({
  key,
  owner,
  mode: 'exclusive',
  ttlMs: 5_000,
  lockDelayMs: 0,
  holder: owner,
  queue: false,
  queueTtlMs: 2_000,
  ...extra,
});

beforeAll(async () => {
  server = await startRedis();
  admin = new Redis(server.url);
});
afterAll(async () => {
  await Promise.allSettled(opened.map((x) => x.close()));
  admin?.disconnect();
  await stopAll();
});

describe('redis key layout and garbage collection', () => {
  it('a session-bound lease: no TTL while held, the counter kept retainMs after the release', async () => {
    const locks = open(new Locks({ backend: redisBackend({ url: server.url, retainMs: RETAIN }) }));
    for (let round = 0; round < 2; round++) {
      // the second round finds the key with the TTL the first release gave it
      const lease = await locks.acquire('gc/session', { ttlMs: 5_000 });
      expect(await admin.pttl('leasehold:{gc/session}')).toBe(-1);
      expect(await admin.hget('leasehold:{gc/session}', 's')).toBe('1'); // one holder, nobody waits
      await lease.release();
      const ttl = await admin.pttl('leasehold:{gc/session}');
      expect(ttl).toBeGreaterThan(RETAIN - 5_000);
      expect(ttl).toBeLessThanOrEqual(RETAIN);
      expect(await admin.hkeys('leasehold:{gc/session}')).toEqual(['t']);
    }
  });

  it('a lease of its own: the TTL set at the grant (expiry + retainMs) stays after the release', async () => {
    const locks = open(new Locks({ backend: redisBackend({ url: server.url, retainMs: RETAIN }) }));
    const lease = await locks.acquire('gc/own', { ttlMs: 5_000, autoRenew: false }); // no session
    const held = await admin.pttl('leasehold:{gc/own}');
    expect(held).toBeGreaterThan(RETAIN);
    expect(held).toBeLessThanOrEqual(RETAIN + 5_000);
    await lease.release();
    const ttl = await admin.pttl('leasehold:{gc/own}');
    expect(ttl).toBeGreaterThan(RETAIN - 5_000);
    expect(ttl).toBeLessThanOrEqual(held);
    expect(await admin.hkeys('leasehold:{gc/own}')).toEqual(['t']);
  });

  it('a key kept for a session-bound holder gets its TTL back once that holder is gone', async () => {
    const a = open(redisBackend({ url: server.url, retainMs: RETAIN }));
    const b = open(redisBackend({ url: server.url, retainMs: RETAIN }));
    const session = await a.sessions!.open(10_000);
    const ga = await a.acquire(req('gc/mixed', 'a', { mode: 'shared', session: session.id }));
    const gb = await b.acquire(req('gc/mixed', 'b', { mode: 'shared' }));
    expect(ga.granted && gb.granted).toBe(true);
    expect(await admin.pttl('leasehold:{gc/mixed}')).toBe(-1); // a session-bound holder lives
    await admin.del(`leasehold:session:${session.id}`); // its session is lost
    const [state] = await b.inspect('gc/mixed'); // purges a
    expect(state!.holders.map((h) => h.holder)).toEqual(['b']);
    expect(await admin.pttl('leasehold:{gc/mixed}')).toBeGreaterThan(RETAIN);
    expect(await admin.hget('leasehold:{gc/mixed}', 's')).toBe('1');
    if (gb.granted) await b.release({ key: 'gc/mixed', owner: 'b', token: gb.token, mode: 'shared' }); // the fast path
    expect(await admin.pttl('leasehold:{gc/mixed}')).toBeGreaterThan(RETAIN - 5_000);
    expect(await admin.exists('leasehold:{gc/mixed}:q', 'leasehold:{gc/mixed}:w')).toBe(0);
  });
});

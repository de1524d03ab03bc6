/**
 * Two lock servers over one PostgreSQL, each opening its own backend from the URL as two processes
 * would, spoken to over plain HTTP: a waiter long-polling server 2 is woken by a release made through
 * server 1 (long before its wait ends), and a lease taken through server 1 is renewed
 * and released through server 2, and through a third started after server 1 closed.
 */
import pg from 'pg';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { type RunningLockServer, startLockServer } from '../../src/serve/index.js';
import { eventually, PG_URL, uniqueName } from '../helpers/env.js';
import { acquirePath, http } from './helpers.js';

const schema = uniqueName('lh_serve_scale');
const url = `${PG_URL}${PG_URL.includes('?') ? '&' : '?'}schema=${schema}`;

const servers: RunningLockServer[] = [];
afterEach(async () => {
  await Promise.allSettled(servers.splice(0).map((s) => s.close()));
});
afterAll(async () => {
  const admin = new pg.Client({ connectionString: PG_URL });
  await admin.connect();
  try {
    await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
  } finally {
    await admin.end();
  }
});

async function start(): Promise<RunningLockServer> {
  const s = await startLockServer({ url, host: '127.0.0.1', port: 0 });
  servers.push(s);
  return s;
}

const waitersOf = async (base: string, key: string): Promise<number> =>
  ((await http(base, 'GET', `/v1/locks?prefix=${encodeURIComponent(key)}`)).body.locks as { key: string; waiters: number }[]).find((k) => k.key === key)
    ?.waiters ?? 0;

describe('two lock servers over one PostgreSQL', () => {
  it('a waiter long-polling server 2 is woken by a release made through server 1', async () => {
    const [one, two] = [await start(), await start()];
    const key = uniqueName('handoff');
    const held = await http(one.url, 'POST', acquirePath(key), { ttlMs: 30_000 });
    expect(held.status).toBe(200);
    const waiting = http(two.url, 'POST', acquirePath(key), { ttlMs: 30_000, waitMs: 30_000 });
    expect(await eventually(async () => (await waitersOf(one.url, key)) === 1, 10_000)).toBe(true);
    const releasedAt = performance.now();
    expect((await http(one.url, 'DELETE', `/v1/leases/${held.body.lease}`)).status).toBe(204);
    const got = await waiting;
    expect(got.status).toBe(200);
    expect(BigInt(got.body.token as string)).toBeGreaterThan(BigInt(held.body.token as string));
    // Woken by the release (the backend's notification, or core's fallback poll), not by the end of its 30 s wait.
    expect(performance.now() - releasedAt).toBeLessThan(20_000);
    expect((await http(one.url, 'DELETE', `/v1/leases/${got.body.lease}`)).status).toBe(204);
  });

  it('a lease taken through server 1 is renewed and released through server 2, and through a new server after server 1 closed', async () => {
    const [one, two] = [await start(), await start()];
    const key = uniqueName('moved');
    const got = await http(one.url, 'POST', acquirePath(key), { ttlMs: 10_000 });
    expect(await http(two.url, 'POST', `/v1/leases/${got.body.lease}/renew`, { ttlMs: 20_000 })).toMatchObject({ status: 200, body: { ttlMs: 20_000 } });
    await one.close();
    servers.splice(servers.indexOf(one), 1);
    const three = await start();
    expect((await http(three.url, 'POST', `/v1/leases/${got.body.lease}/renew`)).status).toBe(200);
    expect((await http(two.url, 'POST', acquirePath(key), {})).status).toBe(409);
    expect((await http(three.url, 'DELETE', `/v1/leases/${got.body.lease}`)).status).toBe(204);
    expect((await http(two.url, 'POST', `/v1/leases/${got.body.lease}/renew`)).status).toBe(410);
    expect((await http(two.url, 'POST', acquirePath(key), {})).status).toBe(200);
  });
});

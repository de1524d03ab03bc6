/**
 * GET /metrics on a listening server: Prometheus text with the library's acquire series (the
 * acquires made for callers: outcome and wait), `leasehold_http_requests_total{route,method,status}`
 * by route pattern (never a URL, a key or a handle), `leasehold_http_open_sessions` (opened here,
 * not seen to end: closed, gone, or past their ttl without a keep-alive here) and
 * `leasehold_http_long_polls` (in flight); checked by a real `promtool check metrics`; with --auth
 * any known caller may read it; without prom-client the route is a 501 and the rest works.
 */
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { memoryBackend } from '../../src/memory/index.js';
import { type RunningLockServer, startLockServer } from '../../src/serve/index.js';
import { eventually, sleep, tempDir } from '../helpers/env.js';
import { AS_A, AS_B, AUTH, acquirePath, http } from './helpers.js';
import { askScript, runWithout } from './without-peers.js';

const servers: RunningLockServer[] = [];
const dirs: { cleanup(): void }[] = [];
afterEach(async () => {
  await Promise.allSettled(servers.splice(0).map((s) => s.close()));
  for (const d of dirs.splice(0)) d.cleanup();
});

async function start(options: Parameters<typeof startLockServer>[0]): Promise<RunningLockServer> {
  const s = await startLockServer({ host: '127.0.0.1', port: 0, ...options });
  servers.push(s);
  return s;
}

async function scrape(s: RunningLockServer, headers: Record<string, string> = {}): Promise<string> {
  const res = await fetch(`${s.url}/metrics`, { headers });
  expect(res.status).toBe(200);
  expect(res.headers.get('content-type')).toMatch(/^text\/plain; version=0\.0\.4/);
  return res.text();
}

/** The value of one sample (labels in any order), or undefined when the series has none. */
function sample(text: string, name: string, labels: Record<string, string> = {}): number | undefined {
  for (const line of text.split('\n')) {
    const m = /^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (!m || m[1] !== name) continue;
    const has = Object.fromEntries([...(m[2] ?? '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)].map((l) => [l[1], l[2]]));
    if (Object.entries(labels).every(([k, v]) => has[k] === v) && Object.keys(has).length === Object.keys(labels).length) return Number(m[3]);
  }
  return undefined;
}

const requests = (text: string, route: string, method: string, status: string) => sample(text, 'leasehold_http_requests_total', { route, method, status });

describe('GET /metrics', () => {
  it('counts requests by route pattern, method and status, never naming a key, a handle or a URL', async () => {
    const s = await start({ backend: memoryBackend() });
    const key = 'tenant-secret/42';
    const held = await http(s.url, 'POST', acquirePath(key), { ttlMs: 30_000 });
    expect(held.status).toBe(200);
    expect((await http(s.url, 'POST', acquirePath(key), {})).status).toBe(409);
    expect((await http(s.url, 'POST', `/v1/leases/${held.body.lease}/renew`, {})).status).toBe(200);
    expect((await http(s.url, 'DELETE', `/v1/leases/${held.body.lease}`)).status).toBe(204);
    expect((await http(s.url, 'GET', `/v1/nothing/${key}`)).status).toBe(404);
    expect((await http(s.url, 'POST', acquirePath('k'), { bogus: 1 })).status).toBe(400);
    const text = await scrape(s);
    expect(requests(text, '/v1/locks/:key/acquire', 'POST', '200')).toBe(1);
    expect(requests(text, '/v1/locks/:key/acquire', 'POST', '409')).toBe(1);
    expect(requests(text, '/v1/locks/:key/acquire', 'POST', '400')).toBe(1);
    expect(requests(text, '/v1/leases/:lease/renew', 'POST', '200')).toBe(1);
    expect(requests(text, '/v1/leases/:lease', 'DELETE', '204')).toBe(1);
    expect(requests(text, '(no route)', 'GET', '404')).toBe(1);
    // The acquires made for callers, on the library's series.
    expect(sample(text, 'leasehold_acquire_total', { backend: 'memory', outcome: 'acquired' })).toBe(1);
    expect(sample(text, 'leasehold_acquire_total', { backend: 'memory', outcome: 'timeout' })).toBe(1);
    expect(sample(text, 'leasehold_acquire_wait_seconds_count', { backend: 'memory' })).toBe(1);
    // The server holds nothing itself.
    expect(sample(text, 'leasehold_leases_held', { backend: 'memory' })).toBe(0);
    expect(text).not.toContain('tenant-secret');
    expect(text).not.toContain(held.body.lease as string);
    expect(text).not.toContain('/v1/nothing');
    // The scrape itself is counted by the next one.
    expect(requests(await scrape(s), '/metrics', 'GET', '200')).toBe(1);
  });

  it('open sessions: opened here, less those closed here, gone at a keep-alive here, or past their ttl without one', async () => {
    const s = await start({ backend: memoryBackend({ sessions: true }) });
    const open = async (ttlMs: number) => (await http(s.url, 'POST', '/v1/sessions', { ttlMs })).body.session as string;
    const [kept, closed, lapsing] = [await open(30_000), await open(30_000), await open(400)];
    const count = async () => sample(await scrape(s), 'leasehold_http_open_sessions');
    expect(await count()).toBe(3);
    expect((await http(s.url, 'DELETE', `/v1/sessions/${encodeURIComponent(closed)}`)).status).toBe(204);
    // A second DELETE of it (idempotent, 204 again) does not count it twice.
    expect((await http(s.url, 'DELETE', `/v1/sessions/${encodeURIComponent(closed)}`)).status).toBe(204);
    expect(await count()).toBe(2);
    expect((await http(s.url, 'POST', `/v1/sessions/${encodeURIComponent(kept)}/keepalive`, { ttlMs: 30_000 })).status).toBe(200);
    // `lapsing` is never kept alive: its ttl runs out.
    expect(await eventually(async () => (await count()) === 1, 5_000, 100)).toBe(true);
    expect((await http(s.url, 'POST', `/v1/sessions/${encodeURIComponent(lapsing)}/keepalive`, {})).status).toBe(404);
    expect(await count()).toBe(1);
    const text = await scrape(s);
    expect(text).not.toContain(kept);
    expect(text).toMatch(/# HELP leasehold_http_open_sessions Sessions opened through this server/);
  });

  it('a keep-alive answered 404 (the session expired in the backend) ends it here too', async () => {
    const s = await start({ backend: memoryBackend({ sessions: true }) });
    const session = (await http(s.url, 'POST', '/v1/sessions', { ttlMs: 300 })).body.session as string;
    await sleep(350);
    expect((await http(s.url, 'POST', `/v1/sessions/${encodeURIComponent(session)}/keepalive`, { ttlMs: 30_000 })).status).toBe(404);
    expect(sample(await scrape(s), 'leasehold_http_open_sessions')).toBe(0);
  });

  it('long polls in flight: acquires with waitMs > 0 while they wait; a client that leaves is counted aborted', async () => {
    const s = await start({ backend: memoryBackend() });
    const held = await http(s.url, 'POST', acquirePath('job'), {});
    const polls = async () => sample(await scrape(s), 'leasehold_http_long_polls');
    expect(await polls()).toBe(0);
    const first = http(s.url, 'POST', acquirePath('job'), { waitMs: 30_000 });
    const leaving = new AbortController();
    const second = http(s.url, 'POST', acquirePath('job'), { waitMs: 30_000 }, {}, leaving.signal).catch((e: unknown) => e);
    expect(await eventually(async () => (await polls()) === 2, 10_000, 50)).toBe(true);
    // One attempt (waitMs 0) is no long poll.
    expect((await http(s.url, 'POST', acquirePath('job'), {})).status).toBe(409);
    expect(await polls()).toBe(2);
    leaving.abort();
    expect(await second).toBeInstanceOf(Error);
    expect(await eventually(async () => (await polls()) === 1, 10_000, 50)).toBe(true);
    expect(await eventually(async () => requests(await scrape(s), '/v1/locks/:key/acquire', 'POST', 'aborted') === 1, 10_000, 50)).toBe(true);
    await http(s.url, 'DELETE', `/v1/leases/${held.body.lease}`);
    expect((await first).status).toBe(200);
    expect(await eventually(async () => (await polls()) === 0, 10_000, 50)).toBe(true);
  });

  it('with --auth: any known caller may scrape (no key is a label), nobody else', async () => {
    const s = await start({ backend: memoryBackend(), auth: AUTH });
    expect((await fetch(`${s.url}/metrics`)).status).toBe(401);
    expect((await fetch(`${s.url}/metrics`, { headers: { authorization: 'Bearer wrong' } })).status).toBe(401);
    await http(s.url, 'POST', acquirePath('a/1'), {}, AS_A);
    const text = await scrape(s, AS_B);
    expect(requests(text, '/v1/locks/:key/acquire', 'POST', '200')).toBe(1);
    expect(requests(text, '/metrics', 'GET', '401')).toBe(2);
    expect(text).not.toContain('svc-a');
    expect(await scrape(s, AS_A)).toContain('leasehold_http_long_polls 0');
  });

  it.skipIf(!process.env.LEASEHOLD_TEST_PROMTOOL)('passes `promtool check metrics` (LEASEHOLD_TEST_PROMTOOL unset: skipped)', async () => {
    const dir = tempDir();
    dirs.push(dir);
    const s = await start({ url: `sqlite:${join(dir.path, 'locks.db')}` });
    const held = await http(s.url, 'POST', acquirePath('a'), {});
    await http(s.url, 'POST', acquirePath('a'), { waitMs: 50 });
    await http(s.url, 'POST', '/v1/sessions', {});
    await http(s.url, 'DELETE', `/v1/leases/${held.body.lease}`);
    await http(s.url, 'GET', '/nope');
    const text = await scrape(s);
    expect(text).toContain('leasehold_http_requests_total{');
    const run = spawnSync(process.env.LEASEHOLD_TEST_PROMTOOL!, ['check', 'metrics'], { input: text, encoding: 'utf8' });
    if (run.error) throw run.error;
    expect(`${run.stdout}${run.stderr}`).toBe('');
    expect(run.status).toBe(0);
    // And promtool does catch a bad exposition (the check can fail).
    const bad = spawnSync(process.env.LEASEHOLD_TEST_PROMTOOL!, ['check', 'metrics'], { input: '# TYPE x_count counter\nx_count 1\n', encoding: 'utf8' });
    expect(bad.status).not.toBe(0);
  });

  it('without prom-client installed: GET /metrics is 501 NOT_SUPPORTED naming the package, and the server works', () => {
    const answers = JSON.parse(runWithout(['prom-client'], askScript(['/metrics', '/v1/health']))) as Record<string, [number, unknown]>;
    expect(answers.acquire?.[0]).toBe(200);
    expect(answers['/v1/health']?.[0]).toBe(200);
    expect(answers['/metrics']?.[0]).toBe(501);
    expect(JSON.parse(answers['/metrics']?.[1] as string)).toMatchObject({
      code: 'NOT_SUPPORTED',
      message: expect.stringContaining('npm install prom-client'),
    });
  });
});

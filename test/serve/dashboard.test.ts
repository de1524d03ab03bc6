/**
 * The dashboard served by the lock service at `/` (its page, `/state`, `/events` in the dashboard's
 * own formats), on a listening server: it shows the grants made over HTTP; with --auth every one of
 * its routes wants a known bearer token and shows only the caller's keys (several prefixes merged),
 * never another caller's, nor an owner id or a handle; it shares the server's Watchers with
 * /v1/events; and in headless Chromium (the header added as a proxy would) the page goes live and
 * shows the caller's lease and not the other's.
 */
import { existsSync } from 'node:fs';
import { type Browser, chromium } from 'playwright-core';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import type { Backend } from '../../src/core/backend.js';
import { memoryBackend } from '../../src/memory/index.js';
import { type RunningLockServer, startLockServer } from '../../src/serve/index.js';
import { eventually, sleep } from '../helpers/env.js';
import { AS_A, AS_B, AUTH, acquirePath, http } from './helpers.js';
import { openSse, type SseStream } from './sse.js';

const CHROMIUM = process.env.LEASEHOLD_TEST_CHROMIUM ?? '/usr/bin/chromium';

const servers: RunningLockServer[] = [];
const streams: SseStream[] = [];
let browser: Browser | undefined;
afterEach(async () => {
  for (const s of streams.splice(0)) s.close();
  await Promise.allSettled(servers.splice(0).map((s) => s.close()));
});
afterAll(async () => {
  await browser?.close();
});

async function start(options: Parameters<typeof startLockServer>[0]): Promise<RunningLockServer> {
  const s = await startLockServer({ host: '127.0.0.1', port: 0, ...options });
  servers.push(s);
  return s;
}

async function sse(url: string, headers: Record<string, string> = {}): Promise<SseStream> {
  const stream = await openSse(url, headers);
  streams.push(stream);
  return stream;
}

interface StateView {
  snapshot: { prefix: string; keys: { key: string; holders: { token: string; holder: string }[] }[] };
  history: { kind: string; key: string; token: string }[];
}

const keysOf = (state: StateView): string[] => state.snapshot.keys.map((k) => k.key);

describe('the dashboard at /', () => {
  it('serves the page, and its state and events show the leases granted over HTTP', async () => {
    const s = await start({ backend: memoryBackend() });
    const page = await fetch(`${s.url}/`);
    expect(page.status).toBe(200);
    expect(page.headers.get('content-type')).toBe('text/html; charset=utf-8');
    const html = await page.text();
    expect(html).toContain('<title>leasehold serve</title>');
    expect(html).toContain("new EventSource('events')");

    const events = await sse(`${s.url}/events`);
    expect(events.status).toBe(200);
    const first = await events.next((m) => m.event === 'snapshot');
    expect(first.data).toMatchObject({ snapshot: { prefix: '', keys: [] }, history: [] });

    const held = await http(s.url, 'POST', acquirePath('report:daily'), { label: 'web-1' });
    const update = await events.next((m) => m.event === 'update' && (m.data as { changes: unknown[] }).changes.length > 0);
    expect(update.data).toMatchObject({
      snapshot: { keys: [{ key: 'report:daily', holders: [{ token: held.body.token, holder: 'web-1' }] }] },
      changes: [{ kind: 'granted', key: 'report:daily', token: held.body.token, holder: 'web-1' }],
    });
    const state = (await http(s.url, 'GET', '/state')).body as unknown as StateView;
    expect(keysOf(state)).toEqual(['report:daily']);
    expect(state.history).toMatchObject([{ kind: 'granted', key: 'report:daily', token: held.body.token }]);
    // Labels and tokens, never the owner (derived, `http:…`) nor the lease handle.
    const wire = JSON.stringify([state, events.messages]);
    expect(wire).not.toContain(held.body.lease as string);
    expect(wire).not.toContain('http:');
  });

  it('with --auth: every route of it wants a known token, and a caller sees only its own keys', async () => {
    const s = await start({ backend: memoryBackend(), auth: AUTH });
    for (const path of ['/', '/state', '/events']) {
      expect((await fetch(`${s.url}${path}`)).status, path).toBe(401);
      expect((await fetch(`${s.url}${path}`, { headers: { authorization: 'Bearer nope' } })).status, path).toBe(401);
    }
    expect((await fetch(`${s.url}/`, { headers: AS_A })).status).toBe(200);
    await http(s.url, 'POST', acquirePath('a/1'), {}, AS_A);
    await http(s.url, 'POST', acquirePath('b/1'), {}, AS_B);
    await http(s.url, 'POST', acquirePath('shared/1'), {}, AS_B);

    const stateA = (await http(s.url, 'GET', '/state', undefined, AS_A)).body as unknown as StateView;
    expect(stateA.snapshot.prefix).toBe('a/');
    expect(keysOf(stateA)).toEqual(['a/1']);
    // Two prefixes, one view: keys in order.
    const stateB = (await http(s.url, 'GET', '/state', undefined, AS_B)).body as unknown as StateView;
    expect(stateB.snapshot.prefix).toBe('b/, shared/');
    expect(keysOf(stateB)).toEqual(['b/1', 'shared/1']);

    const eventsA = await sse(`${s.url}/events`, AS_A);
    const eventsB = await sse(`${s.url}/events`, AS_B);
    await eventsA.next((m) => m.event === 'snapshot');
    await eventsB.next((m) => m.event === 'snapshot');
    await http(s.url, 'POST', acquirePath('b/2'), {}, AS_B);
    await http(s.url, 'POST', acquirePath('a/2'), {}, AS_A);
    const seenByA = await eventsA.next((m) => m.event === 'update' && JSON.stringify(m.data).includes('"a/2"'));
    await eventsB.next((m) => m.event === 'update' && JSON.stringify(m.data).includes('"b/2"'));
    expect(keysOf(seenByA.data as StateView)).toEqual(['a/1', 'a/2']);
    await sleep(500);
    expect(JSON.stringify(eventsA.messages)).not.toMatch(/"(b|shared)\//);
    expect(JSON.stringify(eventsB.messages)).not.toContain('"a/');
  });

  it('shares the server’s Watchers with /v1/events, and reads nothing once its viewers have gone', async () => {
    const inner = memoryBackend();
    let watches = 0;
    let inspects = 0;
    const backend: Backend = {
      ...inner,
      inspect: (prefix) => {
        inspects++;
        return inner.inspect(prefix);
      },
      watch: async (key, onChange) => {
        const off = await inner.watch!(key, onChange);
        watches++;
        return () => {
          watches--;
          off?.();
        };
      },
    };
    const s = await start({ backend });
    await http(s.url, 'POST', acquirePath('one'), {});
    const page = await sse(`${s.url}/events`);
    const api = await sse(`${s.url}/v1/events`);
    await page.next((m) => m.event === 'snapshot');
    expect(api.status).toBe(200);
    await sleep(400);
    // One key shown to two viewers of the same prefix: watched once.
    expect(watches).toBe(1);
    page.close();
    api.close();
    expect(await eventually(() => watches === 0, 5_000)).toBe(true);
    await sleep(400);
    const reads = inspects;
    await sleep(800);
    expect(inspects).toBe(reads);
  });

  it.skipIf(!existsSync(CHROMIUM))('in headless Chromium (bearer token added as a proxy would): live, the caller’s lease shown, the other’s not', async () => {
    const s = await start({ backend: memoryBackend(), auth: AUTH });
    browser = await chromium.launch({
      executablePath: CHROMIUM,
      args: [
        '--headless',
        '--no-sandbox',
        '--disable-gpu',
        '--disable-quic',
        '--no-first-run',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
      ],
    });
    const context = await browser.newContext({ extraHTTPHeaders: AS_A, viewport: { width: 1000, height: 500 } });
    const page = await context.newPage();
    await page.goto(`${s.url}/`);
    await page.locator('#status', { hasText: 'live' }).waitFor({ timeout: 5_000 });
    const mine = await http(s.url, 'POST', acquirePath('a/export'), { label: 'svc-a-worker' }, AS_A);
    await http(s.url, 'POST', acquirePath('b/secret'), { label: 'svc-b-worker' }, AS_B);
    await page.locator(`tr[data-key="a/export"] .holder[data-token="${mine.body.token}"]`).waitFor({ timeout: 2_000 });
    await page.locator(`#timeline li[data-kind="granted"][data-key="a/export"]`).waitFor({ timeout: 2_000 });
    await page.waitForTimeout(500);
    expect(await page.locator('#prefix').textContent()).toBe('a/');
    const text = await page.locator('body').textContent();
    expect(text).toContain('svc-a-worker');
    expect(text).not.toContain('b/secret');
    expect(text).not.toContain('svc-b-worker');
    await context.close();
  });
});

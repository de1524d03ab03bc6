/**
 * `leasehold dashboard` and `leasehold demo --dashboard` as real processes (the built command): the
 * page's state follows the coordinator, an unreachable coordinator exits 69, and the demo's
 * take-over shows in the timeline of a page opened in headless Chromium.
 */
import { chromium, type Browser } from 'playwright-core';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { Locks } from '../../src/core/locks.js';
import { sqliteBackend } from '../../src/sqlite/index.js';
import { killAll, requireBuild, runCli, sandbox, startCli, type Sandbox } from '../cli/helpers.js';

const CHROMIUM = process.env.LEASEHOLD_TEST_CHROMIUM ?? '/usr/bin/chromium';
let sb: Sandbox;
let browser: Browser | undefined;

beforeAll(() => requireBuild());
afterEach(() => {
  killAll();
  sb?.cleanup();
});
afterAll(async () => {
  await browser?.close();
});

describe('leasehold dashboard', () => {
  it('serves the state of the coordinator at --url until SIGINT (exit 0)', async () => {
    sb = sandbox();
    const cli = startCli(['dashboard', '--url', `sqlite:${sb.db}`, '--port', '0', '--prefix', 'job:'], sb);
    const [, url] = (await cli.waitFor(/dashboard: (http:\/\/127\.0\.0\.1:\d+\/)/)) as RegExpMatchArray;
    const locks = new Locks({ backend: sqliteBackend({ path: sb.db }), holderName: 'cron-1' });
    const lease = await locks.acquire('job:nightly', { ttlMs: 10_000 });
    await locks.acquire('other', { ttlMs: 10_000 }); // outside the prefix
    let keys: string[] = [];
    for (let i = 0; i < 40 && keys.length === 0; i++) {
      const state = (await (await fetch(`${url}state`)).json()) as { snapshot: { keys: { key: string; holders: { token: string; holder: string }[] }[] } };
      keys = state.snapshot.keys.map((k) => `${k.key} ${k.holders.map((h) => `${h.holder}#${h.token}`).join(',')}`);
      if (keys.length === 0) await new Promise((r) => setTimeout(r, 50));
    }
    expect(keys).toEqual([`job:nightly cron-1#${lease.token}`]);
    expect(await (await fetch(url!)).text()).toContain('<title>leasehold — job:</title>');
    await locks.close();
    cli.child.kill('SIGINT');
    expect((await cli.done).code).toBe(0);
  });

  it('exits 69 when the coordinator cannot be reached, and 64 for a bad port', async () => {
    sb = sandbox();
    const refused = await runCli(['dashboard', '--url', 'redis://127.0.0.1:1', '--port', '0'], sb);
    expect(refused.code).toBe(69);
    expect(refused.stderr).toMatch(/coordinator unavailable/);
    const bad = await runCli(['dashboard', '--port', '70000'], sb);
    expect(bad.code).toBe(64);
    expect(bad.stderr).toMatch(/usage: leasehold dashboard/);
  });
});

describe('leasehold demo --dashboard', () => {
  it('waits for a page, shows the take-over in its timeline, and keeps serving until SIGINT', async () => {
    sb = sandbox();
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
    const cli = startCli(['demo', '--dashboard', '--port', '0'], sb);
    const [, url] = (await cli.waitFor(/dashboard: (http:\/\/127\.0\.0\.1:\d+\/)/)) as RegExpMatchArray;
    const page = await browser.newPage();
    await page.goto(url!);
    // Worker A's lease runs out while it is frozen and B takes over: an expiry, then a take-over, in each run.
    await page.locator('#timeline li[data-kind="taken-over"][data-key="doc:42:recompute"]').first().waitFor({ timeout: 30_000 });
    await cli.waitFor(/still at http/, 60_000);
    expect(await page.locator('#timeline li[data-kind="taken-over"]').count()).toBe(2);
    expect(cli.stdout).toMatch(/Result: without a fence the frozen worker overwrote the newer result; with the fence its stale token was refused/);
    cli.child.kill('SIGINT');
    expect((await cli.done).code).toBe(0);
    await page.close();
  }, 90_000);
});

/**
 * The dashboard in a real browser: Debian's chromium, headless, driven by playwright-core. The page
 * loads, a lease taken by the test shows up with its token within a second, its release shows in
 * the timeline, and a screenshot of the page is written to docs/dashboard.png (shown in the
 * README). The coordinator is SQLite (the embedded default) in a temporary file.
 */
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { chromium, type Browser } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Locks } from '../../src/core/locks.js';
import { startDashboard } from '../../src/dashboard/server.js';
import { sqliteBackend } from '../../src/sqlite/index.js';
import { tempDir } from '../helpers/env.js';

const CHROMIUM = process.env.LEASEHOLD_TEST_CHROMIUM ?? '/usr/bin/chromium';
const screenshot = new URL('../../docs/dashboard.png', import.meta.url).pathname;

let browser: Browser;
let dashboard: { url: string; close(): Promise<void> };
let viewer: Locks;
let workers: Locks[];
const dir = tempDir();

beforeAll(async () => {
  const path = join(dir.path, 'locks.db');
  viewer = new Locks({ backend: sqliteBackend({ path }) });
  workers = ['web-1', 'web-2', 'cron-7'].map((holderName) => new Locks({ backend: sqliteBackend({ path }), holderName }));
  dashboard = await startDashboard({ locks: viewer, port: 0, title: 'leasehold — locks.db' });
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    // As the environment notes give: no sandbox as root, no GPU, no background traffic to hosts this machine cannot reach.
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
});
afterAll(async () => {
  await browser?.close();
  await dashboard?.close();
  await Promise.allSettled([viewer, ...workers].map((l) => l?.close()));
  dir.cleanup();
});

describe('dashboard in headless Chromium', () => {
  it('shows a lease within a second with its token, then its release in the timeline', async () => {
    const page = await browser.newPage({ viewport: { width: 1100, height: 640 } });
    await page.goto(dashboard.url);
    await page.locator('#status', { hasText: 'live' }).waitFor({ timeout: 5_000 });

    const lease = await workers[0]!.acquire('tenant:42:export', { ttlMs: 30_000 });
    const row = page.locator(`tr[data-key="tenant:42:export"] .holder[data-token="${lease.token}"]`);
    await row.waitFor({ timeout: 1_000 }); // within a second
    expect(await row.textContent()).toContain('web-1');
    expect(await row.textContent()).toContain(`#${lease.token}`);
    const granted = page.locator(`#timeline li[data-kind="granted"][data-token="${lease.token}"]`);
    await granted.waitFor({ timeout: 1_000 });

    // More for the picture: shared readers with an exclusive writer waiting behind them, and a
    // nightly job whose holder stops renewing (a zombie), taken over when its lease runs out.
    const readers = await Promise.all([workers[1]!, workers[2]!].map((w) => w.acquire('report:daily', { mode: 'shared', ttlMs: 20_000 })));
    const writer = workers[0]!.acquire('report:daily', { ttlMs: 20_000, waitMs: 60_000 }).catch(() => undefined);
    const zombie = await workers[2]!.acquire('cron:nightly', { ttlMs: 1_200, autoRenew: false });
    const takeOver = workers[1]!.acquire('cron:nightly', { ttlMs: 20_000, waitMs: 10_000 });
    const waiting = workers[1]!.acquire('tenant:42:export', { ttlMs: 30_000, waitMs: 60_000 });

    await lease.release();
    const released = page.locator(`#timeline li[data-kind="released"][data-token="${lease.token}"]`);
    await released.waitFor({ timeout: 2_000 });
    const next = await waiting;
    await page.locator(`tr[data-key="tenant:42:export"] .holder[data-token="${next.token}"]`).waitFor({ timeout: 2_000 });
    expect(next.token).toBeGreaterThan(lease.token);

    const successor = await takeOver;
    const takenOver = page.locator(`#timeline li[data-kind="taken-over"][data-token="${successor.token}"]`);
    await takenOver.waitFor({ timeout: 2_000 });
    expect(await takenOver.textContent()).toContain(`after #${zombie.token} cron-7 expired`);

    await page.waitForTimeout(600); // let the bars run down a little
    mkdirSync(join(screenshot, '..'), { recursive: true });
    await page.screenshot({ path: screenshot, fullPage: true });
    expect(await page.locator('tr[data-key]').count()).toBe(3);
    expect(await page.locator('tr[data-key="report:daily"] td').nth(3).textContent()).toBe('1'); // the writer waits
    await Promise.all([...readers, successor, next].map((l) => l.release()));
    await (await writer)?.release();
    await page.close();
  });

  it('shows nothing secret: no owner id reaches the page', async () => {
    const lease = await workers[0]!.acquire('secret:check', { ttlMs: 10_000 });
    const res = await fetch(`${dashboard.url}state`);
    const text = await res.text();
    expect(text).toContain(lease.token.toString());
    expect(text).not.toMatch(/[0-9a-f]{32}/);
    await lease.release();
  });
});

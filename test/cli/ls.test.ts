// `leasehold ls` as a real process against a SQLite lease store that the test fills itself.
import { afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { createLocks, type Locks } from '../../src/index.js';
import { sqliteBackend } from '../../src/sqlite/index.js';
import { eventually, killAll, requireBuild, runCli, sandbox, type Sandbox } from './helpers.js';

let sb: Sandbox;
let locks: Locks;

beforeAll(requireBuild);
beforeEach(() => {
  sb = sandbox();
  locks = createLocks({ backend: sqliteBackend({ path: sb.db }), holderName: 'test-holder' });
});
afterEach(async () => {
  killAll();
  await locks.close();
  sb.cleanup();
});

/** Splits the table into rows of cells (columns are separated by two or more spaces). */
function rows(stdout: string): string[][] {
  return stdout
    .trimEnd()
    .split('\n')
    .map((line) => line.split(/ {2,}/));
}

describe('leasehold ls', () => {
  it('prints (no leases) when nothing is held', async () => {
    const r = await runCli(['ls'], sb);
    expect(r).toMatchObject({ code: 0, stdout: '(no leases)\n', stderr: '' });
  });

  it('prints one row per holder: KEY, MODE, LIMIT, TOKEN, HOLDER, EXPIRES IN, WAITERS, LOCK-DELAY', async () => {
    await locks.acquire('jobs:nightly', { ttlMs: 60_000 });
    const r = await runCli(['ls'], sb);
    expect(r.code).toBe(0);
    const table = rows(r.stdout);
    expect(table[0]).toEqual(['KEY', 'MODE', 'LIMIT', 'TOKEN', 'HOLDER', 'EXPIRES IN', 'WAITERS', 'LOCK-DELAY']);
    expect(table).toHaveLength(2);
    const [key, mode, limit, token, holder, expires, waiting, delay] = table[1]!;
    expect({ key, mode, limit, token, holder, waiting, delay }).toEqual({
      key: 'jobs:nightly',
      mode: 'exclusive',
      limit: '-',
      token: '1',
      holder: 'test-holder',
      waiting: '0',
      delay: '-',
    });
    expect(expires).toMatch(/^\d+(\.\d)?s$|^\dm\d\ds$/);
  });

  it('lists shared holders one per line and filters by PREFIX', async () => {
    await locks.acquire('jobs:report', { ttlMs: 60_000, mode: 'shared' });
    await locks.acquire('jobs:report', { ttlMs: 60_000, mode: 'shared' });
    await locks.acquire('other:thing', { ttlMs: 60_000 });
    const all = await runCli(['ls'], sb);
    expect(rows(all.stdout)).toHaveLength(4);
    const jobs = await runCli(['ls', 'jobs:'], sb);
    const table = rows(jobs.stdout);
    expect(table.slice(1).map((r) => [r[0], r[1], r[3]])).toEqual([
      ['jobs:report', 'shared', '1'],
      ['jobs:report', 'shared', '2'],
    ]);
    const none = await runCli(['ls', 'nothing:'], sb);
    expect(none.stdout).toBe('(no leases)\n');
  });

  it('shows a key with no holder but a running lock-delay', async () => {
    // Expires without a release: the key stays ungrantable for its lock-delay (I8).
    await locks.acquire('fragile', { ttlMs: 50, autoRenew: false, lockDelayMs: 60_000 });
    let out = '';
    await eventually(
      async () => {
        out = (await runCli(['ls'], sb)).stdout;
        return /\(none\)/.test(out);
      },
      15_000,
      'the holder to expire',
    );
    const [, row] = rows(out);
    expect(row?.[0]).toBe('fragile');
    expect(row?.[4]).toBe('(none)');
    expect(row?.[7]).toMatch(/^\d+s$/);
  });

  it("shows a semaphore's limit in LIMIT and each permit's label in HOLDER; --json includes the limit (null for a plain lock)", async () => {
    await locks.acquire('api:quota', { ttlMs: 60_000, limit: 3, label: 'web-1' });
    await locks.acquire('api:quota', { ttlMs: 60_000, limit: 3, label: 'web-2' });
    await locks.acquire('plain', { ttlMs: 60_000 });
    const r = await runCli(['ls'], sb);
    expect(r.code).toBe(0);
    const table = rows(r.stdout);
    expect(table.slice(1).map((row) => [row[0], row[1], row[2], row[3], row[4]])).toEqual([
      ['api:quota', 'shared', '3', '1', 'web-1'],
      ['api:quota', 'shared', '3', '2', 'web-2'],
      ['plain', 'exclusive', '-', '1', 'test-holder'],
    ]);
    const json = JSON.parse((await runCli(['ls', '--json'], sb)).stdout) as { key: string; limit: number | null; holders: { holder: string }[] }[];
    expect(json.map((s) => [s.key, s.limit, s.holders.map((h) => h.holder)])).toEqual([
      ['api:quota', 3, ['web-1', 'web-2']],
      ['plain', null, ['test-holder']],
    ]);
  });

  it('--json prints the holders with tokens as strings', async () => {
    await locks.acquire('jobs:nightly', { ttlMs: 60_000 });
    const r = await runCli(['ls', '--json'], sb);
    expect(r.code).toBe(0);
    const parsed = JSON.parse(r.stdout) as unknown;
    expect(parsed).toMatchObject([
      {
        key: 'jobs:nightly',
        lastToken: '1',
        waiters: 0,
        lockDelayRemainingMs: 0,
        limit: null,
        holders: [{ mode: 'exclusive', token: '1', holder: 'test-holder' }],
      },
    ]);
    const empty = await runCli(['ls', '--json', 'zzz'], sb);
    expect(JSON.parse(empty.stdout)).toEqual([]);
  });

  it('exits 69 with one line when the store cannot be opened', async () => {
    const r = await runCli(['ls', '--url', `sqlite:${sb.dir}/no/such/dir/l.db`], sb);
    expect(r.code).toBe(69);
    expect(r.errLines).toHaveLength(1);
  });
});

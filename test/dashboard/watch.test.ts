/**
 * The dashboard's model: what changed between two reads of `inspect` (pure), and the watcher that
 * reads a real coordinator (memory backend) and tells its listeners.
 */
import { describe, expect, it } from 'vitest';
import { diff, Watcher, type KeyView } from '../../src/dashboard/watch.js';
import { Locks } from '../../src/core/locks.js';
import { memoryBackend } from '../../src/memory/index.js';
import { eventually } from '../helpers/env.js';

const key = (k: string, holders: [token: string, holder: string, expiresInMs: number][], lastToken = holders.at(-1)?.[0] ?? '0'): KeyView => ({
  key: k,
  lastToken,
  holders: holders.map(([token, holder, expiresInMs]) => ({ mode: 'exclusive', token, holder, expiresInMs })),
  waiters: 0,
  lockDelayRemainingMs: 0,
});

describe('diff of two reads', () => {
  it('a new holder is granted; one gone before its expiry was released', () => {
    expect(diff([], [key('a', [['1', 'web-1', 30_000]])], 250, 0)).toEqual([
      { at: 0, kind: 'granted', key: 'a', mode: 'exclusive', token: '1', holder: 'web-1' },
    ]);
    expect(diff([key('a', [['1', 'web-1', 30_000]])], [], 250, 0)).toEqual([
      { at: 0, kind: 'released', key: 'a', mode: 'exclusive', token: '1', holder: 'web-1' },
    ]);
  });

  it('one gone at its expiry expired; a new holder in its place took over', () => {
    expect(diff([key('a', [['1', 'web-1', 100]])], [key('a', [['2', 'web-2', 1_000]])], 250, 0)).toEqual([
      { at: 0, kind: 'expired', key: 'a', mode: 'exclusive', token: '1', holder: 'web-1' },
      { at: 0, kind: 'taken-over', key: 'a', mode: 'exclusive', token: '2', holder: 'web-2', previous: { token: '1', holder: 'web-1' } },
    ]);
  });

  it('a holder still there is no change, whatever its time left', () => {
    expect(diff([key('a', [['1', 'web-1', 900]])], [key('a', [['1', 'web-1', 30_000]])], 250, 0)).toEqual([]);
  });
});

describe('the watcher on a real coordinator', () => {
  it('reports a grant and a release, with tokens as strings and labels, never owner ids', async () => {
    const locks = new Locks({ backend: memoryBackend(), holderName: 'watched' });
    const watcher = new Watcher({ inspect: (p) => locks.inspect(p), prefix: 'w:', pollMs: 20 });
    const seen: string[] = [];
    watcher.on(({ changes }) => seen.push(...changes.map((c) => `${c.kind} ${c.key} ${c.token} ${c.holder}`)));
    await watcher.start();
    const lease = await locks.acquire('w:job', { ttlMs: 5_000 });
    expect(await eventually(() => seen.length === 1, 2_000)).toBe(true);
    expect(watcher.snapshot.keys).toEqual([
      {
        key: 'w:job',
        lastToken: lease.token.toString(),
        holders: [expect.objectContaining({ token: lease.token.toString(), holder: 'watched', mode: 'exclusive' })],
        waiters: 0,
        lockDelayRemainingMs: 0,
      },
    ]);
    expect(JSON.stringify(watcher.snapshot)).not.toMatch(/[0-9a-f]{32}/); // no owner id (32 hex digits) anywhere
    await lease.release();
    expect(await eventually(() => seen.length === 2, 2_000)).toBe(true);
    expect(seen).toEqual([`granted w:job ${lease.token} watched`, `released w:job ${lease.token} watched`]);
    expect(watcher.history).toHaveLength(2);
    watcher.stop();
    await locks.close();
  });

  it("follows the keys shown through the backend's change notifications: a release is seen long before the next poll", async () => {
    const locks = new Locks({ backend: memoryBackend() });
    const lease = await locks.acquire('n:job', { ttlMs: 5_000 });
    const watcher = new Watcher({ inspect: (p) => locks.inspect(p), watch: (k, f) => locks.watch(k, f), prefix: 'n:', pollMs: 60_000 });
    const seen: string[] = [];
    watcher.on(({ changes }) => seen.push(...changes.map((c) => c.kind)));
    await watcher.start();
    await new Promise((r) => setTimeout(r, 50)); // the watch is set up after the first read
    await lease.release();
    expect(await eventually(() => seen.includes('released'), 2_000)).toBe(true); // the poll is a minute away
    watcher.stop();
    await locks.close();
  });

  it('a failed read is reported and the last snapshot kept; reading resumes', async () => {
    let fail = false;
    const locks = new Locks({ backend: memoryBackend() });
    const watcher = new Watcher({ inspect: async (p) => (fail ? Promise.reject(new Error('down')) : locks.inspect(p)), prefix: '', pollMs: 20 });
    const errors: string[] = [];
    watcher.on((u) => u.error && errors.push(u.error));
    const lease = await locks.acquire('k', { ttlMs: 5_000 });
    await watcher.start();
    fail = true;
    expect(await eventually(() => errors.length > 0, 2_000)).toBe(true);
    expect(watcher.snapshot.keys.map((k) => k.key)).toEqual(['k']);
    fail = false;
    await lease.release();
    expect(await eventually(() => watcher.snapshot.keys.length === 0, 2_000)).toBe(true);
    watcher.stop();
    await locks.close();
  });
});

/**
 * memoryFence against a `mutate` that misuses what it is handed (issue 13, item 4): a mutate that
 * fails halfway, a thenable without .catch. (sqliteFence: test/sqlite/fence-misuse.test.ts.)
 */
import { describe, expect, it } from 'vitest';
import { memoryFence } from '../../src/memory/index.js';

describe('memoryFence misuse', () => {
  it('a mutate that fails after changing state leaves the mark where it was; a later lower token is still judged against the old mark', async () => {
    const fence = memoryFence();
    await fence.write('r', 5n, () => {});
    await expect(fence.write('r', 9n, () => Promise.reject(new Error('halfway')))).rejects.toThrow('halfway');
    expect(await fence.highest('r')).toBe(5n);
    await fence.write('r', 6n, () => {});
    expect(await fence.highest('r')).toBe(6n);
  });

  it('a thenable without .catch is awaited like a promise: the mark is raised only once it resolves', async () => {
    const fence = memoryFence();
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    // biome-ignore lint/suspicious/noThenProperty: a thenable is what this test hands the fence
    const write = fence.write('r', 3n, () => ({ then: (ok: (v: string) => void) => void gate.then(() => ok('done')) }) as unknown as string);
    await new Promise((resolve) => setImmediate(resolve));
    expect(await fence.highest('r')).toBeNull();
    release();
    expect(await write).toBe('done');
    expect(await fence.highest('r')).toBe(3n);
  });
});

import { describe, expect, it } from 'vitest';
import { createLocks, memoryBackend, memoryFence, StaleTokenError } from '../../src/index.js';

describe('smoke', () => {
  it('acquires, fences, releases', async () => {
    const locks = createLocks({ backend: memoryBackend() });
    const a = await locks.acquire('k', { ttlMs: 1000 });
    expect(a.token).toBe(1n);
    const fence = memoryFence();
    await fence.write('r', a.token, () => {});
    await a.release();
    const b = await locks.acquire('k', { ttlMs: 1000 });
    expect(b.token).toBe(2n);
    await fence.write('r', b.sequencer, () => {});
    await expect(fence.write('r', a.token, () => {})).rejects.toBeInstanceOf(StaleTokenError);
    const waiting = locks.acquire('k', { ttlMs: 1000, waitMs: 2000 });
    setTimeout(() => void b.release(), 50);
    const c = await waiting;
    expect(c.token).toBe(3n);
    await locks.close();
  });
});

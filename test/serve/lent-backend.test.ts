/**
 * A backend passed to the lock service (`startLockServer({ backend })`) is called through, never
 * copied: a backend may be a class instance whose methods live on its prototype and use its private
 * fields (etcd's is). Copying it with a spread lost those methods, and every acquire answered 503.
 * It stays open when the server closes: it is its owner's.
 */
import { afterEach, describe, expect, it } from 'vitest';
import type { AcquireRequest, AcquireResult, Backend, KeyState, ReleaseRequest, RenewRequest, RenewResult } from '../../src/core/backend.js';
import { memoryBackend } from '../../src/memory/index.js';
import { type RunningLockServer, startLockServer } from '../../src/serve/index.js';
import { eventually, uniqueName } from '../helpers/env.js';
import { acquirePath, http } from './helpers.js';

/** A backend as a class with private state, as etcd's is. */
class ClassBackend implements Backend {
  readonly #inner = memoryBackend();
  readonly name = 'class-backed';
  readonly capabilities = this.#inner.capabilities;
  closed = false;
  acquire(req: AcquireRequest): Promise<AcquireResult> {
    return this.#inner.acquire(req);
  }
  renew(req: RenewRequest): Promise<RenewResult> {
    return this.#inner.renew(req);
  }
  release(req: ReleaseRequest): Promise<void> {
    return this.#inner.release(req);
  }
  inspect(prefix: string): Promise<KeyState[]> {
    return this.#inner.inspect(prefix);
  }
  subscribe(key: string, onChange: () => void, cursor?: unknown): Promise<() => void> {
    return this.#inner.subscribe!(key, onChange, cursor);
  }
  cancelWait(req: { key: string; owner: string }): Promise<void> {
    return this.#inner.cancelWait!(req);
  }
  async close(): Promise<void> {
    this.closed = true;
    await this.#inner.close();
  }
}

let server: RunningLockServer | undefined;
afterEach(async () => {
  await server?.close();
  server = undefined;
});

describe('a backend lent to the lock service', () => {
  it('a class instance serves acquire, wait, renew and release; closing the server leaves it open', async () => {
    const backend = new ClassBackend();
    server = await startLockServer({ backend, host: '127.0.0.1', port: 0 });
    const key = uniqueName('lent');
    const held = await http(server.url, 'POST', acquirePath(key), { ttlMs: 30_000 });
    expect(held.status).toBe(200);
    const waiting = http(server.url, 'POST', acquirePath(key), { ttlMs: 30_000, waitMs: 20_000 });
    expect(await eventually(async () => (await backend.inspect(key))[0]?.waiters === 1, 10_000)).toBe(true);
    expect((await http(server.url, 'POST', `/v1/leases/${held.body.lease}/renew`)).status).toBe(200);
    expect((await http(server.url, 'DELETE', `/v1/leases/${held.body.lease}`)).status).toBe(204);
    const next = await waiting;
    expect(next.status).toBe(200);
    expect(BigInt(next.body.token as string)).toBe(BigInt(held.body.token as string) + 1n);
    await server.close();
    server = undefined;
    expect(backend.closed).toBe(false);
    expect((await backend.inspect(key))[0]?.holders).toHaveLength(1); // still the owner's, and still answering
  });
});

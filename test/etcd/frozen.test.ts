/**
 * close() against an etcd member that accepts connections and never answers (SIGSTOP): bounded,
 * and no socket is left (a socket left open keeps the process from exiting).
 */
import { afterAll, describe, expect, it } from 'vitest';
import { createLocks } from '../../src/index.js';
import { etcdBackend } from '../../src/etcd/index.js';
import { eventually } from '../helpers/env.js';
import { startCluster, type Cluster } from '../fixtures/etcd-cluster.mjs';

const clusters: Cluster[] = [];
afterAll(async () => {
  for (const c of clusters) {
    for (const m of c.members) m.thaw();
    await c.stop();
  }
});

function tcpHandles(): number {
  return process.getActiveResourcesInfo().filter((r) => r === 'TCPWrap' || r === 'TCPSocketWrap').length;
}

describe('etcd: close() against a frozen member', () => {
  it('locks.close() resolves with a lease held and a watch open, and leaves no socket behind', async () => {
    const cluster = await startCluster({ members: 1 });
    clusters.push(cluster);
    const member = cluster.members[0]!;
    const before = tcpHandles();
    const locks = createLocks({ backend: etcdBackend({ hosts: cluster.endpoints, requestTimeoutMs: 1_000 }) });
    try {
      const lease = await locks.acquire('frozen-etcd', { ttlMs: 10_000 });
      const waited = await locks.acquire('frozen-etcd', { ttlMs: 10_000, waitMs: 300 }).catch((e: unknown) => e);
      expect((waited as { code?: string }).code).toBe('ACQUIRE_TIMEOUT');
      expect(lease.held).toBe(true);
      member.freeze();
      let settled = false;
      const closing = locks.close().finally(() => (settled = true));
      expect(await eventually(() => settled, 20_000, 50)).toBe(true);
      await closing;
      expect(await eventually(() => tcpHandles() <= before, 15_000, 50)).toBe(true);
    } finally {
      member.thaw();
      await locks.close();
    }
  });
});

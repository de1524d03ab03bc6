import { etcdBackend } from '../../src/etcd/index.js';
import { startCluster } from '../fixtures/etcd-cluster.mjs';
import { uniqueName } from '../helpers/env.js';
import { backendConformance } from '../../src/testing/index.js';

// One etcd member of our own on free ports, killed in cleanup. Its timings (50 ms heartbeat,
// 500 ms election) make the server's minimum lease 1 s, so the suite runs with 1 s ttls.
backendConformance('etcd', async () => {
  const cluster = await startCluster({ members: 1, heartbeatMs: 50, electionMs: 500 });
  return {
    connect: async () => etcdBackend({ hosts: cluster.endpoints, minTtlMs: 1_000 }),
    prefix: uniqueName('conf'),
    ttlMs: 1_000,
    // A crash and a restart on the same data directory: revisions (and so tokens) survive it.
    restart: async () => {
      const [member] = cluster.members;
      await member!.kill('SIGKILL');
      member!.start();
      await cluster.waitHealthy();
    },
    cleanup: () => cluster.stop(),
  };
});

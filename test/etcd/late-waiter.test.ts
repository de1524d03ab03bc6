/**
 * A waiter whose requests arrive late (a slow link) leaves no ghost holder on etcd (issue 13,
 * item 1): see test/helpers/late-waiter.ts.
 */
import { afterAll, beforeAll, describe, it } from 'vitest';
import { etcdBackend } from '../../src/etcd/index.js';
import { startCluster, type Cluster } from '../fixtures/etcd-cluster.mjs';
import { lateWaiterLeavesNoGhost, manyWaitersGiveUpCleanly } from '../helpers/late-waiter.js';
import { uniqueName } from '../helpers/env.js';

let cluster: Cluster;
const prefix = `${uniqueName('lh')}/`;
beforeAll(async () => {
  cluster = await startCluster({ members: 1 });
});
afterAll(async () => {
  await cluster?.stop();
});

describe('etcd: a waiter whose requests arrive after it gave up', () => {
  it('leaves no queue place: the released key goes to the next client, not to the place of the one that left', async () => {
    const url = new URL(cluster.endpoints[0]!);
    await lateWaiterLeavesNoGhost(
      {
        target: { host: url.hostname, port: Number(url.port) },
        direct: () => etcdBackend({ hosts: cluster.endpoints, prefix }),
        through: (port) => etcdBackend({ hosts: [`http://127.0.0.1:${port}`], prefix }),
      },
      { landMs: 500 },
    );
  });
  it('300 waiters that give up after 1.5 s all end with ACQUIRE_TIMEOUT and leave no place behind', async () => {
    await manyWaitersGiveUpCleanly({ direct: () => etcdBackend({ hosts: cluster.endpoints, prefix }) }, { waiters: 300, waitMs: 1_500 });
  });
});

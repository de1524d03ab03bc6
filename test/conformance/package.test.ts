/**
 * The suites as a third party gets them: `leasehold/testing` from the built package (dist/testing,
 * what package.json's "./testing" export points at; `npm test` builds first), run against the built
 * memory backend and fence the way a backend of someone else's would register them.
 */
import type * as Leasehold from '../../src/index.js';
import type * as Testing from '../../src/testing/index.js';

// Loaded by URL so that typechecking (src, test) does not need a build; typed as the sources they are built from.
const built = (path: string): string => new URL(`../../dist/${path}`, import.meta.url).href;
const { memoryBackend, memoryFence } = (await import(built('index.js'))) as typeof Leasehold;
const { backendConformance, fenceConformance } = (await import(built('testing/index.js'))) as typeof Testing;

backendConformance('memory, through the built leasehold/testing', async () => {
  const backend = memoryBackend();
  return {
    // every client of the one in-process coordinator; its close() is left to cleanup
    connect: async () => Object.create(backend, { close: { value: async () => {} } }) as Leasehold.Backend,
    prefix: 'conf-dist',
    ttlMs: 200,
    cleanup: () => backend.close(),
  };
});

fenceConformance<void>('memory, through the built leasehold/testing', async () => {
  const counters = new Map<string, number>();
  const logs = new Map<string, string[]>();
  return {
    fence: memoryFence(),
    fenceWith: (options) => memoryFence(options),
    async increment(_tx, r) {
      const n = counters.get(r) ?? 0;
      await new Promise((resolve) => setImmediate(resolve)); // let other writers interleave
      counters.set(r, n + 1);
    },
    append(_tx, r, v) {
      logs.set(r, [...(logs.get(r) ?? []), v]);
    },
    counter: async (r) => counters.get(r) ?? 0,
    log: async (r) => logs.get(r) ?? [],
    transactional: false,
    synchronous: false,
    cleanup: async () => {},
  };
});

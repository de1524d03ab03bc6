import type { Backend } from '../../src/core/backend.js';
import { memoryBackend } from '../../src/memory/index.js';
import { backendConformance } from '../../src/testing/index.js';

/** Every client of one in-process coordinator: the same backend, whose close() is left to cleanup. */
function shared(backend: Backend): () => Promise<Backend> {
  return async () => Object.create(backend, { close: { value: async () => {} } }) as Backend;
}

backendConformance('memory', async () => {
  const backend = memoryBackend();
  return { connect: shared(backend), prefix: 'conf', ttlMs: 200, cleanup: () => backend.close() };
});

backendConformance('memory with sessions', async () => {
  const backend = memoryBackend({ sessions: true });
  return { connect: shared(backend), prefix: 'conf', ttlMs: 200, cleanup: () => backend.close() };
});

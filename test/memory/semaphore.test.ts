import type { Backend } from '../../src/core/backend.js';
import { memoryBackend, sharedMemoryBackend } from '../../src/memory/backend.js';
import { semaphoreCases } from './semaphore-cases.js';

semaphoreCases('memory', async () => {
  const backend = memoryBackend();
  // every client is the one coordinator; its close() is left to cleanup
  return { connect: async () => Object.create(backend, { close: { value: async () => {} } }) as Backend, cleanup: () => backend.close() };
});

semaphoreCases('memory with sessions', async () => {
  const backend = memoryBackend({ sessions: true });
  return { connect: async () => Object.create(backend, { close: { value: async () => {} } }) as Backend, cleanup: () => backend.close() };
});

// clients of the process's one coordinator, as createLocks({ url: 'memory:' }) makes them
semaphoreCases('memory: URL', async () => ({ connect: async () => sharedMemoryBackend(), cleanup: async () => {} }));

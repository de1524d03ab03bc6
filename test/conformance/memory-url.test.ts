import { sharedMemoryBackend } from '../../src/memory/backend.js';
import { uniqueName } from '../helpers/env.js';
import { backendConformance } from '../../src/testing/index.js';

// The clients `memory:` URLs get: each connect() is a new client of the one in-process coordinator,
// closed by its Locks (which must leave the coordinator, and every other client, working).
backendConformance('memory: URL (shared in-process coordinator)', async () => ({
  connect: async () => sharedMemoryBackend(),
  prefix: uniqueName('conf'),
  ttlMs: 200,
  cleanup: async () => {},
}));

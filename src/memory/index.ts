export { memoryBackend, type MemoryBackendOptions } from './backend.js';
export { memoryFence, type MemoryFenceOptions } from './fence.js';
export { memoryIdempotencyStore, type MemoryIdempotencyStoreOptions } from './idempotency.js';

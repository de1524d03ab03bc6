export { memoryBackend, type MemoryBackendOptions } from './backend.js';
export { memoryFence } from './fence.js';

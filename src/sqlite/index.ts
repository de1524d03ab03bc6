export { sqliteBackend, type SqliteBackendOptions } from './backend.js';
export { sqliteFence, type SqliteFenceOptions } from './fence.js';
export { sqliteIdempotencyStore, type SqliteIdempotencyStoreOptions } from './idempotency.js';
export type { SqliteDatabase, MachineClock } from './util.js';

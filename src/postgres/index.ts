export { postgresBackend, type PostgresBackendOptions } from './backend.js';
export { postgresSchemaSql, SCHEMA_VERSION, type PostgresSchemaOptions } from './schema.js';
export { postgresFence, type PostgresFenceOptions } from './fence.js';
export { postgresIdempotencyStore, type PostgresIdempotencyStoreOptions } from './idempotency.js';
export type { PgClient, PgPool } from './util.js';

export { mysqlBackend, type MysqlBackendOptions } from './backend.js';
export { mysqlSchemaSql, SCHEMA_VERSION, type MysqlSchemaOptions } from './schema.js';
export type { MysqlConnection, MysqlPool } from './util.js';
export { mysqlFence, type MysqlFenceOptions } from './fence.js';
export { mysqlIdempotencyStore, type MysqlIdempotencyStoreOptions } from './idempotency.js';

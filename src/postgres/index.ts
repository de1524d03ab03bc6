export { postgresBackend } from './backend.js';
export { postgresFence, type PostgresFenceOptions } from './fence.js';
export type { PgClient, PgPool } from './util.js';

/**
 * Opens the store of a kind (store.ts describes them). Each store module is loaded only when its
 * kind is used, so a SQLite run never loads pg, mysql2 or ioredis.
 */
import type { AdminStore, StoreConfig, WorkerStore } from './store.js';

export async function openWorkerStore(config: StoreConfig): Promise<WorkerStore> {
  switch (config.kind) {
    case 'sqlite':
      return (await import('./store-sqlite.js')).sqliteWorkerStore(config);
    case 'postgres':
      return (await import('./store-postgres.js')).postgresWorkerStore(config);
    case 'mysql':
      return (await import('./store-mysql.js')).mysqlWorkerStore(config);
    case 'redis':
      return (await import('./store-redis.js')).redisWorkerStore(config);
  }
}

export async function openAdminStore(config: StoreConfig): Promise<AdminStore> {
  switch (config.kind) {
    case 'sqlite':
      return (await import('./store-sqlite.js')).sqliteAdminStore(config);
    case 'postgres':
      return (await import('./store-postgres.js')).postgresAdminStore(config);
    case 'mysql':
      return (await import('./store-mysql.js')).mysqlAdminStore(config);
    case 'redis':
      return (await import('./store-redis.js')).redisAdminStore(config);
  }
}

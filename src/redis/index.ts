export { redisBackend, REDIS_DEFAULTS, type RedisBackendOptions } from './backend.js';
export { redlockBackend, REDLOCK_DEFAULTS, type RedlockBackendOptions } from './redlock/backend.js';
export {
  redisFence,
  type NodeRedisFenceClient,
  type NodeRedisFenceMulti,
  type NodeRedisMulti,
  type RedisFenceClient,
  type RedisFenceOptions,
  type RedisMulti,
} from './fence.js';
export { redisIdempotencyStore, REDIS_IDEMPOTENCY_DEFAULTS, type RedisIdempotencyStoreOptions } from './idempotency.js';
export { CLIENT_DEFAULTS } from './conn/ioredis.js';
export type { RedisClientLike, IoredisLike, NodeRedisLike } from './conn/types.js';

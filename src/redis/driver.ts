/**
 * ioredis, the Redis driver: an optional peer dependency, loaded here and nowhere else in src/redis
 * (import `Redis` from './driver.js' instead of 'ioredis'; type-only imports from 'ioredis' are
 * fine, they are erased). Without it, importing `leasehold/redis` throws an InvalidArgumentError
 * that says to `npm install ioredis`.
 */
import { createRequire } from 'node:module';
import type * as Ioredis from 'ioredis';
import { requirePeer } from '../core/peer.js';

const driver = requirePeer<typeof Ioredis>(createRequire(import.meta.url), 'ioredis', 'leasehold/redis');

export const { Redis } = driver;
export type Redis = Ioredis.Redis;
export type { RedisOptions, ChainableCommander } from 'ioredis';

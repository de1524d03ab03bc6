import { InvalidArgumentError } from '../../core/errors.js';
import { describe } from '../../core/validate.js';
import { redisUrlDatabase } from '../url.js';
import { ioredisConn, openIoredis } from './ioredis.js';
import { nodeRedisConn } from './node-redis.js';
import type { Conn, IoredisLike, NodeRedisLike } from './types.js';

/**
 * A connection of our own to `url` (an ioredis client with CLIENT_DEFAULTS, closed by the backend).
 * A database in the URL (`/N`, `?db=N`) is checked now to be a number and on first use to exist.
 * `argument` names the URL in errors.
 */
export function connectUrl(url: unknown, argument = 'url'): Conn {
  if (typeof url !== 'string' || !/^rediss?:\/\//i.test(url)) {
    throw new InvalidArgumentError(argument, `expected a redis:// or rediss:// URL, got ${describe(url)}`);
  }
  return openIoredis(url, redisUrlDatabase(url, argument), argument);
}

/** Wraps a client the user passed in (it stays theirs); throws InvalidArgumentError when it has neither shape. */
export function wrapClient(client: unknown, argument = 'client'): Conn {
  const c = client as Record<string, unknown> | null;
  if (typeof c === 'object' && c !== null) {
    if (typeof c.call === 'function' && typeof c.duplicate === 'function') return ioredisConn(c as unknown as IoredisLike, false);
    if (typeof c.sendCommand === 'function' && typeof c.duplicate === 'function' && typeof c.connect === 'function') {
      return nodeRedisConn(c as unknown as NodeRedisLike, false);
    }
  }
  throw new InvalidArgumentError(argument, `expected an ioredis or node-redis client (call/sendCommand and duplicate), got ${describe(client)}`);
}

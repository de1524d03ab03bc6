import { LuaLibrary } from '../lua/library.js';
import { LUA_PRELUDE } from '../lua/prelude.js';
import { ACQUIRE } from './acquire.js';
import { CANCEL } from './cancel.js';
import { INSPECT } from './inspect.js';
import { LOCK_HELPERS } from './lock-hash.js';
import { QUEUE_HELPERS } from './queue.js';
import { RELEASE } from './release.js';
import { RENEW } from './renew.js';
import { SESSION_CLOSE, SESSION_KEEPALIVE, SESSION_OPEN } from './sessions.js';
import { WATCH } from './watch.js';

/**
 * The redis backend's operations as one library: a Redis Functions library (Redis 7+), or one
 * script each (see {@link LuaLibrary}). Each operation's script, KEYS, ARGV and reply are in its own
 * module here; the helpers they share are the prelude (the shared Lua, the lock hash, the queue).
 */
export const REDIS_LIBRARY = new LuaLibrary(
  'leasehold',
  [LUA_PRELUDE, LOCK_HELPERS, QUEUE_HELPERS],
  [ACQUIRE, RELEASE, RENEW, CANCEL, INSPECT, SESSION_OPEN, SESSION_KEEPALIVE, SESSION_CLOSE, WATCH],
);

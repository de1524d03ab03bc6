import { randomBytes } from 'node:crypto';
import type { SessionSupport } from '../../core/backend.js';
import { luaOp } from '../lua/library.js';
import { int } from '../lua/script.js';
import type { OpContext } from './context.js';

/**
 * session_open: a session living ttl from now (server clock): e = its expiry, ld = 0 (the longest
 * lock-delay of its leases, raised by acquire).
 * KEYS: session. ARGV: ttl (ms). Reply: 1.
 */
export const SESSION_OPEN = luaOp<[session: string], [ttl: string], 1>(
  'session_open',
  'session open',
  `
local now = clock()
local e = now + tonumber(ARGV[1])
redis.call('HSET', KEYS[1], 'e', num(e), 'ld', '0')
redis.call('PEXPIREAT', KEYS[1], num(e))
return 1`,
);

/**
 * session_keepalive: the one renewal per client per interval: extends the session, and with it
 * every lease bound to it, to now + ttl. The key outlives the expiry by the longest lock-delay of
 * its leases (a tombstone from which purge starts their lock-delay, I8).
 * KEYS: session. ARGV: ttl (ms). Reply: 1 if alive, 0 if it was already gone.
 */
export const SESSION_KEEPALIVE = luaOp<[session: string], [ttl: string], 0 | 1>(
  'session_keepalive',
  'session keep-alive',
  `
local s = redis.call('HMGET', KEYS[1], 'e', 'ld')
local now = clock()
if not s[1] or tonumber(s[1]) <= now then return 0 end
local e = now + tonumber(ARGV[1])
redis.call('HSET', KEYS[1], 'e', num(e))
redis.call('PEXPIREAT', KEYS[1], num(e + tonumber(s[2] or '0')))
return 1`,
);

/**
 * session_close: ends a live session (its leases are free at once, without lock-delay); an expired
 * one keeps its tombstone.
 * KEYS: session. ARGV: none. Reply: 1.
 */
export const SESSION_CLOSE = luaOp<[session: string], [], 1>(
  'session_close',
  'session close',
  `
local e = redis.call('HGET', KEYS[1], 'e')
if e and tonumber(e) > clock() then redis.call('DEL', KEYS[1]) end
return 1`,
);

/** Sessions over the three operations above (single node only: a lock and its holder's session live in different cluster slots). */
export function sessionSupport(ctx: OpContext): SessionSupport {
  return {
    async open(ttlMs) {
      const id = randomBytes(16).toString('hex');
      await ctx.runner.run(SESSION_OPEN, { keys: [ctx.sessionPrefix + id], args: [String(ttlMs)] });
      return { id, ttlMs };
    },
    async keepAlive(id, ttlMs) {
      return int(await ctx.runner.run(SESSION_KEEPALIVE, { keys: [ctx.sessionPrefix + id], args: [String(ttlMs)] })) === 1;
    },
    async close(id) {
      await ctx.runner.run(SESSION_CLOSE, { keys: [ctx.sessionPrefix + id], args: [] });
    },
  };
}

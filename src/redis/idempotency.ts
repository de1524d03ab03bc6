import { InvalidArgumentError, StaleTokenError } from '../core/errors.js';
import type { IdempotencyRecord, IdempotencyStore } from '../core/idempotency.js';
import { checkInteger, checkKey, checkKnownOptions, checkObject, describe } from '../core/validate.js';
import { wrapClient } from './conn/open.js';
import type { RedisClientLike } from './conn/types.js';
import { Deadlines } from './deadline.js';
import { checkKeyPrefix, lockKeyOf } from './keys.js';
import { LuaScript } from './lua/script.js';

export interface RedisIdempotencyStoreOptions {
  /** Prefix of the record keys (`<prefix>{<key>}`, one hash per idempotency key); must not contain `{` or `}`. @default 'leasehold:idem:' */
  prefix?: string;
  /** Longest wait for one Redis reply (then BackendUnavailableError). @default 2000 */
  commandTimeoutMs?: number;
}

export const REDIS_IDEMPOTENCY_DEFAULTS = Object.freeze({
  /** Beside the lock keys (`leasehold:`) and the fence marks (`leasehold:fence:`), apart from both. */
  prefix: 'leasehold:idem:',
  /** 2 s: as the Redis backend's and fence's bound on one reply. */
  commandTimeoutMs: 2_000,
});

/** The put script's ARGV. */
type PutArgs = [token: string, keepMs: string, state: string, recordToken: string, hash: string, value: string, claim: '1' | ''];

/**
 * The fenced write of one key's record, in one step. The hash holds the fence's mark `t` (the
 * highest token that wrote) and the record: state `s`, the record's token `r`, payload hash `h`,
 * value `v`. Tokens are compared as decimal strings (length, then digits: Lua numbers are doubles
 * and would round tokens above 2^53). A lower token than the mark is refused with the mark as the
 * reply, and nothing changes; otherwise the mark is raised (or kept), the record written (or, with
 * an empty state, removed: the mark stays), and the whole hash expires keepMs later by the server's
 * clock (PEXPIRE). A claim (ARGV[7] = '1') leaves a completed record as it is and answers
 * '!completed' (the hash is live while it exists: it expires whole).
 */
const PUT_SCRIPT = new LuaScript<[record: string], PutArgs>(
  'idempotency-put',
  `local high = redis.call('HGET', KEYS[1], 't')
local t = ARGV[1]
if ARGV[7] == '1' and redis.call('HGET', KEYS[1], 's') == 'completed' then return '!completed' end
if high and (#high > #t or (#high == #t and high > t)) then return high end
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[1], 's', 'r', 'h', 'v')
  redis.call('HSET', KEYS[1], 't', t)
else
  redis.call('HSET', KEYS[1], 't', t, 's', ARGV[3], 'r', ARGV[4], 'h', ARGV[5])
  if ARGV[6] == '' then redis.call('HDEL', KEYS[1], 'v') else redis.call('HSET', KEYS[1], 'v', string.sub(ARGV[6], 2)) end
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return false`,
);

/**
 * Idempotency records in Redis, for `createIdempotency({ locks, store })`. One hash per key at
 * `<prefix>{<key>}` (one cluster slot) holds the record and the fence's mark; `put` checks the mark
 * and writes the record in one script (I3), so a zombie attempt's late completion is refused
 * (StaleTokenError) and changes nothing. Expiry is Redis's own (PEXPIRE, the server's clock, I7):
 * every write sets the key to expire keepMs later, so a completed record lives keepMs, an abandoned
 * in-progress one at most keepMs, and nothing needs purging.
 *
 * - `client` is an ioredis client (`Redis` or `Cluster`) or a node-redis client (v4 and later); it
 *   stays yours (never closed; the store opens no connection of its own).
 * - The mark expires with the record: keepMs after the last write of the key. An attempt frozen for
 *   longer than keepMs (24 h by default) after the record expired is no longer refused; its result
 *   would then be stored as the key's (the key counts as new by then).
 */
export function redisIdempotencyStore(client: RedisClientLike, options?: RedisIdempotencyStoreOptions): IdempotencyStore {
  const conn = wrapClient(client, 'client');
  const o = checkObject(options, 'options');
  checkKnownOptions(o, ['prefix', 'commandTimeoutMs'], 'options');
  const prefix = o.prefix === undefined ? REDIS_IDEMPOTENCY_DEFAULTS.prefix : checkKeyPrefix(o.prefix, 'options.prefix');
  const timeoutMs =
    o.commandTimeoutMs === undefined ? REDIS_IDEMPOTENCY_DEFAULTS.commandTimeoutMs : checkInteger(o.commandTimeoutMs, 'options.commandTimeoutMs', 1, 600_000);
  const deadlines = new Deadlines(timeoutMs, 'redis idempotency store');
  const call = <T>(p: Promise<T>, what: string): Promise<T> => deadlines.bound(p, what);
  const recordKey = (key: string): string => lockKeyOf(prefix, key);

  const get = async (key: string): Promise<IdempotencyRecord | undefined> => {
    checkKey(key, 'key');
    const reply = await call(conn.command(['HMGET', recordKey(key), 's', 'r', 'h', 'v']), 'read record');
    const [state, token, hash, value] = (reply as unknown[]).map((v) => (v === null || v === undefined ? undefined : String(v)));
    if (state !== 'in-progress' && state !== 'completed') return undefined;
    const record: IdempotencyRecord = { state, token: BigInt(token ?? '0'), payloadHash: hash ?? '' };
    return value === undefined ? record : { ...record, value };
  };

  return {
    get,

    async put(key, token, record, keepMs) {
      checkKey(key, 'key');
      if (typeof token !== 'bigint' || token < 1n) throw new InvalidArgumentError('token', `expected a positive bigint, got ${describe(token)}`);
      checkInteger(keepMs, 'keepMs', 1, Number.MAX_SAFE_INTEGER);
      // The value travels with a leading '=' so an empty string stays apart from "no value".
      const t = token.toString();
      const ms = String(keepMs);
      const args: PutArgs = record
        ? [t, ms, record.state, record.token.toString(), record.payloadHash, record.value === undefined ? '' : `=${record.value}`, '']
        : [t, ms, '', '', '', '', ''];
      const high = await call(PUT_SCRIPT.run(conn, [recordKey(key)], args), 'write record');
      if (high !== null && high !== undefined) throw new StaleTokenError(`idempotency:${key}`, token, BigInt(String(high)));
    },

    async claim(key, token, record, keepMs) {
      checkKey(key, 'key');
      if (typeof token !== 'bigint' || token < 1n) throw new InvalidArgumentError('token', `expected a positive bigint, got ${describe(token)}`);
      checkInteger(keepMs, 'keepMs', 1, Number.MAX_SAFE_INTEGER);
      const args: PutArgs = [token.toString(), String(keepMs), record.state, record.token.toString(), record.payloadHash, '', '1'];
      const reply = await call(PUT_SCRIPT.run(conn, [recordKey(key)], args), 'claim record');
      if (reply === null || reply === undefined) return undefined;
      if (String(reply) === '!completed') return get(key);
      throw new StaleTokenError(`idempotency:${key}`, token, BigInt(String(reply)));
    },
  };
}

import { createRequire } from 'node:module';
import type * as Ioredis from 'ioredis';
import { requirePeer } from '../core/peer.js';
import { CLIENT_DEFAULTS, redisFence } from '../redis/index.js';
import { STORE_NAMES, bounded, type AdminStore, type FinalState, type StoreConfig, type WorkerStore } from './store.js';

/** ioredis, an optional peer of leasehold: loaded like src/redis/driver.ts loads it, so a missing one is named. */
const { Redis } = requirePeer<typeof Ioredis>(createRequire(import.meta.url), 'ioredis', 'leasehold verify --fence redis');

const PREFIX = STORE_NAMES.redisPrefix;
/** The fence's marks live under their own prefix, apart from an application's `leasehold:fence:`. */
const FENCE_PREFIX = `${PREFIX}fence:`;

/** Data keys of a resource, in the hash slot of its name (as the fence's mark is). */
function keys(resource: string): { counter: string; log: string; mark: string } {
  return { counter: `${PREFIX}{${resource}}:counter`, log: `${PREFIX}{${resource}}:log`, mark: `${FENCE_PREFIX}{${resource}}` };
}

/**
 * The fenced read-modify-write: a script queued inside the fence's MULTI (Redis transactions cannot
 * read, so the read, the increment and the append are one script, run by EXEC together with the
 * fence's raising of the mark). KEYS: counter, log. ARGV: the row without its value.
 */
const INCREMENT_AND_APPEND = `
local value = redis.call('INCR', KEYS[1])
redis.call('RPUSH', KEYS[2], ARGV[1] .. '|' .. value)
return value
`;

/** A log row as stored in the list: `token|worker|op|value`. */
function row(token: bigint, w: number, op: string): string {
  return `${token}|${w}|${op}`;
}

function client(config: StoreConfig): Ioredis.Redis {
  // leasehold's client defaults, with an offline queue (commands wait for a reconnect, bounded by
  // `timeoutMs`) but never resending a command that was in flight when the connection dropped (a
  // resent write could apply twice): such a write fails and is indeterminate.
  const c = new Redis(config.location, { ...CLIENT_DEFAULTS, enableOfflineQueue: true, maxRetriesPerRequest: 1, enableAutoPipelining: false });
  c.on('error', () => {});
  return c;
}

export function redisWorkerStore(config: StoreConfig): WorkerStore {
  const c = client(config);
  const fence = redisFence(c, { prefix: FENCE_PREFIX, connections: 1, commandTimeoutMs: config.timeoutMs });
  return {
    async fencedIncrement(resource, token, r) {
      const k = keys(resource);
      await fence.write(resource, token, (tx) => {
        tx.eval(INCREMENT_AND_APPEND, 2, k.counter, k.log, row(token, r.w, r.op));
      });
      return undefined; // the value is in EXEC's replies, which the fence does not hand back; the log has it
    },
    read: async (resource) => Number((await bounded(c.get(keys(resource).counter), config.timeoutMs, 'read counter')) ?? 0),
    async plainWrite(resource, value, r) {
      const k = keys(resource);
      const replies = await bounded(
        c
          .multi()
          .set(k.counter, String(value))
          .rpush(k.log, `${row(r.token, r.w, r.op)}|${value}`)
          .exec(),
        config.timeoutMs,
        'write',
      );
      const failed = replies?.find(([e]) => e);
      if (!replies || failed) throw failed?.[0] ?? new Error('transaction discarded');
    },
    close: async () => {
      await fence.close().catch(() => {});
      c.disconnect();
    },
  };
}

export function redisAdminStore(config: StoreConfig): AdminStore {
  const c = client(config);
  const call = <T>(p: Promise<T>, what: string): Promise<T> => bounded(p, config.timeoutMs, what);
  return {
    setup: async () => {
      await call(c.ping(), 'ping');
    },
    final: async (resource): Promise<FinalState> => {
      const k = keys(resource);
      const [counter, entries, mark] = await Promise.all([
        call(c.get(k.counter), 'read counter'),
        call(c.lrange(k.log, 0, -1), 'read log'),
        call(c.get(k.mark), 'read mark'),
      ]);
      return {
        counter: Number(counter ?? 0),
        log: entries.map((entry, i) => {
          const [token, w, op, value] = entry.split('|') as [string, string, string, string];
          return { seq: i + 1, token: BigInt(token), w: Number(w), op, value: Number(value) };
        }),
        highest: mark === null ? null : BigInt(mark),
      };
    },
    cleanup: async (resource) => {
      const k = keys(resource);
      await call(c.del(k.counter, k.log, k.mark), 'delete');
    },
    close: async () => {
      c.disconnect();
    },
  };
}

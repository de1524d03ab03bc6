import { createHash, randomBytes } from 'node:crypto';
import type {
  AcquireRequest, AcquireResult, Backend, KeyState, ReleaseRequest, RenewRequest, RenewResult, SessionSupport,
} from '../core/backend.js';
import { BackendUnavailableError, InvalidArgumentError } from '../core/errors.js';
import { checkBoolean, checkInteger, checkKnownOptions, checkObject, MAX_DURATION_MS } from '../core/validate.js';
import {
  checkKeyPrefix, connectUrl, deadline, decodeKey, encodeKey, globEscape, int, LuaScript, mapRedisError, wrapClient,
  type Conn, type RedisClientLike, type Subscriber,
} from './client.js';

export interface RedisBackendOptions {
  /** `redis://…` or `rediss://…`; leasehold opens (and closes) its own ioredis connections. Give this or `client`. */
  url?: string;
  /** An ioredis (`Redis` or `Cluster`) or node-redis client you already have; it stays yours (never closed). */
  client?: RedisClientLike;
  /** Prepended to every Redis key and channel leasehold uses; must not contain `{` or `}`. @default 'leasehold:' */
  prefix?: string;
  /**
   * One keep-alive per client keeps all its leases (a session key each lock refers to). Sessions
   * need a single Redis node: a lock and its holder's session live in different cluster slots.
   * @default true, false on a Redis Cluster client
   */
  sessions?: boolean;
  /** Longest wait for one Redis reply before the call fails with BackendUnavailableError. @default 2000 */
  commandTimeoutMs?: number;
  /**
   * How long an idle lock's token counter is kept after its last holder, waiter and lock-delay are
   * gone. Past it the key is garbage-collected and the next token comes from the server clock
   * floor alone (see {@link redisBackend}). @default 3600000 (1 hour)
   */
  retainMs?: number;
}

/** Defaults, each with its reason. */
export const REDIS_DEFAULTS = Object.freeze({
  prefix: 'leasehold:',
  /** 2 s: far above a healthy round trip, well below core's 5 s operation bound and any sane ttl. */
  commandTimeoutMs: 2_000,
  /** 1 h: a clock step back shorter than this cannot bring tokens back even for a key idle that long. */
  retainMs: 3_600_000,
});

/** A subscriber connection that failed is tried again after this long (meanwhile waiters poll). */
const SUBSCRIBER_RETRY_MS = 1_000;
/** Wake-ups that arrived before their waiter subscribed are kept this long, then dropped. */
const PENDING_WAKE_MS = 30_000;

// ---------------------------------------------------------------------------------------------
// Lua shared by the scripts below. Keys of one lock (all in the slot of its hash tag):
//   meta     hash  t = last token, d = lock-delay end (server ms), qs = queue sequence,
//                  w:<owner> = mode|expiresAt|wakeId|channel for each waiter
//   holders  hash  <owner> = mode|token|expiresAt|lockDelayMs|session|label (expiresAt 0: the session decides)
//   queue    zset  owner by arrival sequence
// Session key (own slot): hash e = expiry (server ms), ld = longest lock-delay of its leases.
// All expiry is judged by the server's TIME (I7); PEXPIREAT is only garbage collection.
// ---------------------------------------------------------------------------------------------
export const LUA_PRELUDE = `
local function num(x) return string.format('%.0f', x) end
local function clock()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return s * 1000 + math.floor(us / 1000), s * 1000000 + us
end
local function holder(v)
  local m, tok, exp, ld, ses, lab = string.match(v, '^(%a)|(%d+)|(%d+)|(%d+)|([^|]*)|(.*)$')
  if not m then return nil end
  return { mode = m, tok = tok, exp = tonumber(exp), ld = tonumber(ld), ses = ses, label = lab }
end
local function holder_record(h)
  return h.mode .. '|' .. h.tok .. '|' .. num(h.exp) .. '|' .. num(h.ld) .. '|' .. h.ses .. '|' .. h.label
end
local function session_expiry(sp, id)
  local e = redis.call('HGET', sp .. id, 'e')
  if e then return tonumber(e) end
  return -1
end
local function purge(mk, hk, sp, now, d)
  local all = redis.call('HGETALL', hk)
  local live = {}
  local nd = d
  for i = 1, #all, 2 do
    local h = holder(all[i + 1])
    if h and h.ses ~= '' then h.exp = session_expiry(sp, h.ses) end
    if not h or h.exp <= now then
      redis.call('HDEL', hk, all[i])
      if h and h.ld > 0 and h.exp >= 0 and h.exp + h.ld > nd then nd = h.exp + h.ld end
    else
      h.owner = all[i]
      live[#live + 1] = h
    end
  end
  if nd > d then redis.call('HSET', mk, 'd', num(nd)) end
  return live, nd
end
local function waiter(mk, owner)
  local v = redis.call('HGET', mk, 'w:' .. owner)
  if not v then return nil end
  local m, exp, wake, ch = string.match(v, '^(%a)|(%d+)|([^|]*)|(.*)$')
  if not m then return nil end
  return { owner = owner, mode = m, exp = tonumber(exp), wake = wake, ch = ch }
end
local function drop_waiter(mk, qk, owner)
  redis.call('ZREM', qk, owner)
  redis.call('HDEL', mk, 'w:' .. owner)
end
local function head(mk, qk, now)
  while true do
    local first = redis.call('ZRANGE', qk, 0, 0)[1]
    if not first then return nil end
    local w = waiter(mk, first)
    if w and w.exp > now then return w end
    drop_waiter(mk, qk, first)
  end
end
local function clear_ahead(mk, qk, owner, mode, queued, now)
  local start = 0
  while true do
    local batch = redis.call('ZRANGE', qk, start, start + 31)
    if #batch == 0 then return true, start == 0 end
    local kept = 0
    for _, o in ipairs(batch) do
      if o == owner then return true end
      local w = waiter(mk, o)
      if not w or w.exp <= now then
        drop_waiter(mk, qk, o)
      else
        if not queued or mode == 'e' or w.mode == 'e' then return false end
        kept = kept + 1
      end
    end
    start = start + kept
  end
end
local function compatible(live, mode)
  if #live == 0 then return true end
  if mode == 'e' then return false end
  for _, h in ipairs(live) do if h.mode ~= 's' then return false end end
  return true
end
local function wake_head(mk, qk, live, d, now)
  local w = head(mk, qk, now)
  if w and d <= now and w.wake ~= '' and compatible(live, w.mode) then redis.call('PUBLISH', w.ch, w.wake) end
  return w == nil
end
local function gc(mk, hk, qk, live, d, now, retain, queue_empty)
  local horizon = now
  for _, h in ipairs(live) do
    if h.ses ~= '' then
      redis.call('PERSIST', hk)
      redis.call('PERSIST', mk)
      if not queue_empty then redis.call('PERSIST', qk) end
      return
    end
    if h.exp + h.ld > horizon then horizon = h.exp + h.ld end
  end
  if #live > 0 then redis.call('PEXPIREAT', hk, num(horizon)) end
  if d > horizon then horizon = d end
  redis.call('PEXPIREAT', mk, num(horizon + retain))
  if not queue_empty then redis.call('PEXPIREAT', qk, num(horizon + retain)) end
end
local function extend_at(key, at, now)
  local p = redis.call('PTTL', key)
  if p >= 0 and now + p < at then redis.call('PEXPIREAT', key, num(at)) end
end
`;

/**
 * Grants, or answers busy (enqueueing the caller when it will wait). The token is raised in the
 * same script as the grant: max(counter + 1, server TIME in µs), so a counter lost with the data
 * cannot bring tokens back while the server clock moves forward (I1).
 * KEYS: meta, holders, queue[, session]. ARGV: owner, mode (e|s), ttl, lockDelay, label, queue (1|0),
 * queueTtl, session id, wake id, wake channel, session prefix, retain.
 * Returns {'G', token} | {'B', holderLabel, retryInMs or ''} | {'L'} (session gone).
 */
const ACQUIRE = new LuaScript('acquire', `${LUA_PRELUDE}
local mk, hk, qk, sk = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, mode, ttl, ld, label = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local queued, qttl, ses, wake, ch = ARGV[6] == '1', tonumber(ARGV[7]), ARGV[8], ARGV[9], ARGV[10]
local sp, retain = ARGV[11], tonumber(ARGV[12])
local now, now_us = clock()
local sexp = 0
if ses ~= '' then
  local e = redis.call('HGET', sk, 'e')
  if not e or tonumber(e) <= now then return {'L'} end
  sexp = tonumber(e)
end
local meta = redis.call('HMGET', mk, 't', 'd')
local live, d = purge(mk, hk, sp, now, tonumber(meta[2] or '0'))
for _, h in ipairs(live) do
  if h.owner == owner then
    if h.ses == '' then
      h.exp = now + ttl
      redis.call('HSET', hk, owner, holder_record(h))
    end
    gc(mk, hk, qk, live, d, now, retain)
    return {'G', h.tok}
  end
end
local clear, queue_empty = false, false
if compatible(live, mode) and now >= d then clear, queue_empty = clear_ahead(mk, qk, owner, mode, queued, now) end
if clear then
  local t = tonumber(meta[1] or '0') + 1
  if now_us > t then t = now_us end
  local h = { owner = owner, mode = mode, tok = num(t), exp = 0, ld = ld, ses = ses, label = label }
  redis.call('HSET', mk, 't', h.tok)
  if ses == '' then
    h.exp = now + ttl
  elseif ld > 0 and ld > tonumber(redis.call('HGET', sk, 'ld') or '0') then
    redis.call('HSET', sk, 'ld', num(ld))
    redis.call('PEXPIREAT', sk, num(sexp + ld))
  end
  redis.call('HSET', hk, owner, holder_record(h))
  live[#live + 1] = h
  if queued and not queue_empty and redis.call('ZREM', qk, owner) == 1 then
    redis.call('HDEL', mk, 'w:' .. owner)
    if mode == 's' then queue_empty = wake_head(mk, qk, live, d, now) end
  end
  gc(mk, hk, qk, live, d, now, retain, queue_empty)
  return {'G', h.tok}
end
if queued then
  if not redis.call('ZSCORE', qk, owner) then
    redis.call('ZADD', qk, num(redis.call('HINCRBY', mk, 'qs', 1)), owner)
  end
  redis.call('HSET', mk, 'w:' .. owner, mode .. '|' .. num(now + qttl) .. '|' .. wake .. '|' .. ch)
end
gc(mk, hk, qk, live, d, now, retain)
local soonest = -1
if d > now then soonest = d end
for _, h in ipairs(live) do
  local at = h.exp
  if d > at then at = d end
  if soonest < 0 or at < soonest then soonest = at end
end
local first = live[1]
local retry = ''
if soonest >= 0 then retry = num(soonest - now) end
return {'B', first and first.label or '', retry}
`);

/**
 * Compare-and-delete: removes the holder only if owner and token match and it has not expired
 * (an expired holder is left to purge, which starts its lock-delay, I8), then tells the head
 * waiter, and only it, that it may go.
 * KEYS: meta, holders, queue. ARGV: owner, token, session prefix, retain. Returns 1 if released.
 */
const RELEASE = new LuaScript('release', `${LUA_PRELUDE}
local mk, hk, qk = KEYS[1], KEYS[2], KEYS[3]
local owner, token, sp, retain = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local v = redis.call('HGET', hk, owner)
if not v then return 0 end
local h = holder(v)
if h and h.tok ~= token then return 0 end
local now = clock()
local released = 0
if h then
  local exp = h.exp
  if h.ses ~= '' then exp = session_expiry(sp, h.ses) end
  if exp > now then
    redis.call('HDEL', hk, owner)
    released = 1
  end
end
local d = tonumber(redis.call('HGET', mk, 'd') or '0')
local live = {}
if released == 0 or redis.call('EXISTS', hk) == 1 then live, d = purge(mk, hk, sp, now, d) end
local queue_empty = wake_head(mk, qk, live, d, now)
gc(mk, hk, qk, live, d, now, retain, queue_empty)
return released
`);

/**
 * Extends the holder's expiry to now + ttl if owner and token match and it is still live
 * (a lease bound to a session extends its session instead).
 * KEYS: meta, holders, queue. ARGV: owner, token, ttl, session prefix, retain. Returns 1 if renewed.
 */
const RENEW = new LuaScript('renew', `${LUA_PRELUDE}
local mk, hk, qk = KEYS[1], KEYS[2], KEYS[3]
local owner, token, ttl, sp, retain = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
local v = redis.call('HGET', hk, owner)
if not v then return 0 end
local h = holder(v)
if not h or h.tok ~= token then return 0 end
local now = clock()
if h.ses ~= '' then
  local sk = sp .. h.ses
  local s = redis.call('HMGET', sk, 'e', 'ld')
  if not s[1] or tonumber(s[1]) <= now then return 0 end
  redis.call('HSET', sk, 'e', num(now + ttl))
  redis.call('PEXPIREAT', sk, num(now + ttl + tonumber(s[2] or '0')))
  return 1
end
if h.exp <= now then return 0 end
h.exp = now + ttl
redis.call('HSET', hk, owner, holder_record(h))
extend_at(hk, h.exp + h.ld, now)
extend_at(mk, h.exp + h.ld + retain, now)
extend_at(qk, h.exp + h.ld + retain, now)
return 1
`);

/**
 * Leaves the wait queue; if the leaver was at the head, the new head may go now: tell it.
 * KEYS: meta, holders, queue. ARGV: owner, session prefix. Returns 1 if a place was removed.
 */
const CANCEL_WAIT = new LuaScript('cancel-wait', `${LUA_PRELUDE}
local mk, hk, qk = KEYS[1], KEYS[2], KEYS[3]
local owner, sp = ARGV[1], ARGV[2]
if not redis.call('ZSCORE', qk, owner) then
  redis.call('HDEL', mk, 'w:' .. owner)
  return 0
end
local now = clock()
local first = head(mk, qk, now)
drop_waiter(mk, qk, owner)
if first and first.owner == owner then
  local live, d = purge(mk, hk, sp, now, tonumber(redis.call('HGET', mk, 'd') or '0'))
  wake_head(mk, qk, live, d, now)
end
return 1
`);

/**
 * State of one lock (purging what expired). KEYS: meta, holders, queue. ARGV: session prefix.
 * Returns {lastToken, lockDelayRemaining, waiters, then mode, token, expiresIn, label per holder}.
 */
const INSPECT = new LuaScript('inspect', `${LUA_PRELUDE}
local mk, hk, qk = KEYS[1], KEYS[2], KEYS[3]
local sp = ARGV[1]
local now = clock()
local meta = redis.call('HMGET', mk, 't', 'd')
local live, d = purge(mk, hk, sp, now, tonumber(meta[2] or '0'))
local waiters = 0
for _, o in ipairs(redis.call('ZRANGE', qk, 0, -1)) do
  local w = waiter(mk, o)
  if w and w.exp > now then waiters = waiters + 1 else drop_waiter(mk, qk, o) end
end
local delay = 0
if d > now then delay = d - now end
local out = { meta[1] or '0', num(delay), waiters }
for _, h in ipairs(live) do
  out[#out + 1] = h.mode
  out[#out + 1] = h.tok
  out[#out + 1] = num(h.exp - now)
  out[#out + 1] = h.label
end
return out
`);

/** Opens a session living ttl from now (server clock). KEYS: session. ARGV: ttl. */
const SESSION_OPEN = new LuaScript('session-open', `${LUA_PRELUDE}
local now = clock()
local e = now + tonumber(ARGV[1])
redis.call('HSET', KEYS[1], 'e', num(e), 'ld', '0')
redis.call('PEXPIREAT', KEYS[1], num(e))
return 1
`);

/**
 * The one renewal per client per interval: extends the session, and with it every lease bound to
 * it, to now + ttl. The key outlives the expiry by the longest lock-delay of its leases (a
 * tombstone from which purge starts their lock-delay). KEYS: session. ARGV: ttl. Returns 1 if alive.
 */
const SESSION_KEEPALIVE = new LuaScript('session-keepalive', `${LUA_PRELUDE}
local s = redis.call('HMGET', KEYS[1], 'e', 'ld')
local now = clock()
if not s[1] or tonumber(s[1]) <= now then return 0 end
local e = now + tonumber(ARGV[1])
redis.call('HSET', KEYS[1], 'e', num(e))
redis.call('PEXPIREAT', KEYS[1], num(e + tonumber(s[2] or '0')))
return 1
`);

/** Ends a live session (its leases are free at once, without lock-delay); an expired one keeps its tombstone. KEYS: session. */
const SESSION_CLOSE = new LuaScript('session-close', `${LUA_PRELUDE}
local e = redis.call('HGET', KEYS[1], 'e')
if e and tonumber(e) > clock() then redis.call('DEL', KEYS[1]) end
return 1
`);

/**
 * Leases on one Redis server (or one Redis Cluster, without sessions).
 *
 * - One round trip per acquire, renew, release and session keep-alive: one script each (EVALSHA,
 *   EVAL on NOSCRIPT). Expiry is judged inside the scripts by the server's TIME (I7); key TTLs
 *   are garbage collection only. Release is compare-and-delete on owner and token (I4).
 * - Tokens: a grant's token is max(counter + 1, server TIME in µs), raised in the grant's script
 *   (I1, I2). Assumption, stated exactly: when the counter is lost (a restart without
 *   persistence, a failover to a replica that missed the last writes, or a key idle longer than
 *   `retainMs`), the next token is still larger than every earlier one provided the server's clock
 *   now reads later than it did at the key's previous grant — the clock did not step back across
 *   the loss by more than the time since that grant. (A counter only runs ahead of TIME when one
 *   key is granted more than once per microsecond, which one script per grant cannot do.)
 * - Waiting without polling: a waiter is enqueued by its busy answer with this client's channel;
 *   release, cancel and shared hand-offs PUBLISH to the head waiter only (no herd). FIFO, and a
 *   releaser or a `tryAcquire` cannot barge past waiters. Expiry has no event in Redis: the busy
 *   answer's `retryInMs` and core's bounded re-check cover it and lost messages.
 * - Sessions: one keep-alive per client and ttl keeps all of its leases (a lock refers to its
 *   session; a lock whose session is gone is free). Single node only (see `sessions`).
 */
export function redisBackend(options: RedisBackendOptions): Backend {
  const o = checkObject(options, 'options');
  checkKnownOptions(o, ['url', 'client', 'prefix', 'sessions', 'commandTimeoutMs', 'retainMs'], 'options');
  if ((o.url === undefined) === (o.client === undefined)) throw new InvalidArgumentError('options', 'give exactly one of url or client');
  const prefix = o.prefix === undefined ? REDIS_DEFAULTS.prefix : checkKeyPrefix(o.prefix, 'options.prefix');
  const commandTimeoutMs = o.commandTimeoutMs === undefined ? REDIS_DEFAULTS.commandTimeoutMs : checkInteger(o.commandTimeoutMs, 'options.commandTimeoutMs', 1, MAX_DURATION_MS);
  const retainMs = o.retainMs === undefined ? REDIS_DEFAULTS.retainMs : checkInteger(o.retainMs, 'options.retainMs', 60_000, MAX_DURATION_MS);
  const conn: Conn = o.url !== undefined ? connectUrl(o.url, 'options.url') : wrapClient(o.client, 'options.client');
  const withSessions = o.sessions === undefined ? !conn.isCluster : checkBoolean(o.sessions, 'options.sessions');
  const sessionPrefix = `${prefix}session:`;
  const retain = String(retainMs);
  let closed = false;

  const keysOf = (key: string): [meta: string, holders: string, queue: string] => {
    const meta = `${prefix}{${encodeKey(key)}}`;
    return [meta, `${meta}:h`, `${meta}:q`];
  };

  const ensureOpen = (): void => {
    if (closed) throw new InvalidArgumentError('backend', 'this redis backend was closed');
  };

  const run = async <T = unknown>(what: string, script: LuaScript, keys: readonly string[], args: readonly string[], onLate?: (value: T) => void): Promise<T> => {
    ensureOpen();
    return deadline(script.run(conn, keys, args) as Promise<T>, commandTimeoutMs, 'redis', what, onLate);
  };

  const wakes = new WakeHub(conn, `${prefix}wake:${randomBytes(12).toString('hex')}`);

  const release = async (req: ReleaseRequest): Promise<void> => {
    await run('release', RELEASE, keysOf(req.key), [req.owner, req.token.toString(), sessionPrefix, retain]);
  };

  const sessions: SessionSupport = {
    async open(ttlMs) {
      const id = randomBytes(16).toString('hex');
      await run('session open', SESSION_OPEN, [sessionPrefix + id], [String(ttlMs)]);
      return { id, ttlMs };
    },
    async keepAlive(id, ttlMs) {
      return int(await run('session keep-alive', SESSION_KEEPALIVE, [sessionPrefix + id], [String(ttlMs)])) === 1;
    },
    async close(id) {
      await run('session close', SESSION_CLOSE, [sessionPrefix + id], []);
    },
  };

  const backend: Backend = {
    name: 'redis',
    capabilities: Object.freeze({ fair: true, minTtlMs: 0 }),

    async acquire(req: AcquireRequest): Promise<AcquireResult> {
      ensureOpen();
      const keys: string[] = keysOf(req.key);
      let wake = '';
      if (req.queue && (await wakes.ready())) wake = wakeIdOf(req.owner);
      if (req.session !== undefined) keys.push(sessionPrefix + req.session);
      const reply = await run<unknown[]>(
        'acquire',
        ACQUIRE,
        keys,
        [
          req.owner, req.mode === 'shared' ? 's' : 'e', String(req.ttlMs), String(req.lockDelayMs), req.holder,
          req.queue ? '1' : '0', String(req.queueTtlMs), req.session ?? '', wake, wake ? wakes.channel : '', sessionPrefix, retain,
        ],
        // Nobody listens for this answer any more: a grant in it must not hold the key until its ttl.
        (late) => {
          if (Array.isArray(late) && late[0] === 'G') void release({ key: req.key, owner: req.owner, token: BigInt(String(late[1])), mode: req.mode }).catch(() => {});
        },
      );
      switch (reply[0]) {
        case 'G':
          if (wake) wakes.forget(wake);
          return { granted: true, token: BigInt(String(reply[1])), ttlMs: req.ttlMs };
        case 'B': {
          const holder = String(reply[1] ?? '');
          const retry = String(reply[2] ?? '');
          return {
            granted: false,
            ...(holder ? { holder } : {}),
            ...(retry ? { retryInMs: Number(retry) } : {}),
            ...(wake ? { cursor: { wake } satisfies WakeCursor } : {}),
          };
        }
        case 'L':
          return { granted: false, sessionLost: true };
        default:
          throw new BackendUnavailableError('redis', `acquire: unexpected reply ${JSON.stringify(reply)}`);
      }
    },

    async renew(req: RenewRequest): Promise<RenewResult> {
      const r = await run('renew', RENEW, keysOf(req.key), [req.owner, req.token.toString(), String(req.ttlMs), sessionPrefix, retain]);
      return int(r) === 1 ? { renewed: true, ttlMs: req.ttlMs } : { renewed: false };
    },

    release,

    async cancelWait({ key, owner }) {
      wakes.forget(wakeIdOf(owner));
      await run('cancel wait', CANCEL_WAIT, keysOf(key), [owner, sessionPrefix]);
    },

    async subscribe(_key: string, onChange: () => void, cursor?: unknown) {
      ensureOpen();
      // Only queued waiters are told (the head, on its own channel); others poll with backoff.
      if (!isWakeCursor(cursor)) throw new BackendUnavailableError('redis', 'wake-ups are sent to queued (fair) waiters only; polling instead');
      return wakes.register(cursor.wake, onChange);
    },

    async inspect(prefixOfKeys: string): Promise<KeyState[]> {
      ensureOpen();
      const pattern = `${globEscape(prefix)}{${globEscape(encodeKey(prefixOfKeys))}*`;
      const metas = new Set<string>();
      try {
        for (const target of conn.scanTargets()) {
          let cursor = '0';
          do {
            const [next, found] = (await deadline(target.command(['SCAN', cursor, 'MATCH', pattern, 'COUNT', '1000']), commandTimeoutMs, 'redis', 'scan')) as [string, string[]];
            cursor = String(next);
            for (const k of found) if (k.endsWith('}')) metas.add(k);
          } while (cursor !== '0');
        }
      } catch (error) {
        throw mapRedisError('redis', 'inspect', error);
      }
      const out: KeyState[] = [];
      const all = [...metas];
      for (let i = 0; i < all.length; i += 100) {
        const batch = all.slice(i, i + 100);
        const replies = await Promise.all(batch.map((meta) => run<unknown[]>('inspect', INSPECT, [meta, `${meta}:h`, `${meta}:q`], [sessionPrefix])));
        batch.forEach((meta, j) => {
          const r = replies[j]!;
          const holders = [];
          for (let x = 3; x + 3 < r.length; x += 4) {
            holders.push({
              mode: r[x] === 's' ? ('shared' as const) : ('exclusive' as const),
              token: BigInt(String(r[x + 1])),
              expiresInMs: Math.max(0, Number(r[x + 2])),
              holder: String(r[x + 3]),
            });
          }
          const waiters = int(r[2]);
          const lockDelayRemainingMs = Number(r[1]);
          if (holders.length === 0 && waiters === 0 && lockDelayRemainingMs === 0) return;
          out.push({ key: decodeKey(meta.slice(prefix.length + 1, -1)), lastToken: BigInt(String(r[0])), holders, waiters, lockDelayRemainingMs });
        });
      }
      return out.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
    },

    async close() {
      if (closed) return;
      closed = true;
      await wakes.close();
      await conn.close();
    },
  };
  if (withSessions) backend.sessions = sessions;
  return backend;
}

interface WakeCursor {
  readonly wake: string;
}

function isWakeCursor(value: unknown): value is WakeCursor {
  return typeof value === 'object' && value !== null && typeof (value as WakeCursor).wake === 'string' && (value as WakeCursor).wake !== '';
}

/** The public name of a waiter in wake messages: a digest of its owner id, never the id itself (I4). */
function wakeIdOf(owner: string): string {
  return createHash('sha1').update(owner).digest('base64url').slice(0, 20);
}

/**
 * This client's wake-up channel: one SUBSCRIBE per backend (on a second connection), messages
 * naming the waiter. A message that arrives before its waiter subscribed is kept, so the
 * subscription fires at once (no lost wake-up between the busy answer and the subscription).
 */
class WakeHub {
  readonly #conn: Conn;
  readonly channel: string;
  readonly #handlers = new Map<string, Set<() => void>>();
  readonly #pending = new Map<string, number>();
  #sub: Promise<Subscriber> | undefined;
  #subscriber: Subscriber | undefined;
  #failedAt = -Infinity;
  #closed = false;

  constructor(conn: Conn, channel: string) {
    this.#conn = conn;
    this.channel = channel;
  }

  /** True when wake-ups can be delivered now (subscribes on first use). */
  async ready(): Promise<boolean> {
    if (this.#closed) return false;
    if (this.#subscriber) return this.#subscriber.ready;
    if (!this.#sub) {
      if (performance.now() - this.#failedAt < SUBSCRIBER_RETRY_MS) return false;
      const opening = this.#conn.subscribe(this.channel, (message) => this.#deliver(message));
      this.#sub = opening;
      opening.catch(() => {
        this.#failedAt = performance.now();
        if (this.#sub === opening) this.#sub = undefined;
      });
    }
    try {
      const sub = await deadline(this.#sub, REDIS_DEFAULTS.commandTimeoutMs, 'redis', 'subscribe');
      if (this.#closed) return false;
      this.#subscriber = sub;
      return sub.ready;
    } catch {
      return false;
    }
  }

  #deliver(wake: string): void {
    const handlers = this.#handlers.get(wake);
    if (handlers) {
      for (const fn of [...handlers]) fn();
      return;
    }
    const now = performance.now();
    this.#pending.set(wake, now);
    if (this.#pending.size > 1_000) {
      for (const [w, at] of this.#pending) if (now - at > PENDING_WAKE_MS) this.#pending.delete(w);
    }
  }

  register(wake: string, onChange: () => void): () => void {
    let set = this.#handlers.get(wake);
    if (!set) this.#handlers.set(wake, (set = new Set()));
    set.add(onChange);
    if (this.#pending.delete(wake)) queueMicrotask(onChange);
    return () => {
      set.delete(onChange);
      if (set.size === 0 && this.#handlers.get(wake) === set) this.#handlers.delete(wake);
    };
  }

  forget(wake: string): void {
    this.#pending.delete(wake);
  }

  async close(): Promise<void> {
    this.#closed = true;
    for (const set of this.#handlers.values()) for (const fn of set) fn();
    this.#handlers.clear();
    this.#pending.clear();
    const sub = this.#sub;
    this.#sub = undefined;
    this.#subscriber = undefined;
    if (sub) await sub.then((s) => s.close()).catch(() => {});
  }
}

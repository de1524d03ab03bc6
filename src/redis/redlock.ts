import type {
  AcquireRequest, AcquireResult, Backend, HolderState, KeyState, ReleaseRequest, RenewRequest, RenewResult,
} from '../core/backend.js';
import { BackendUnavailableError, InvalidArgumentError, type LeaseholdError } from '../core/errors.js';
import { checkInteger, checkKnownOptions, checkObject, describe, MAX_DURATION_MS } from '../core/validate.js';
import { LUA_PRELUDE } from './backend.js';
import {
  checkKeyPrefix, connectUrl, deadline, decodeKey, encodeKey, globEscape, int, LuaScript, mapRedisError, wrapClient,
  type Conn, type RedisClientLike,
} from './client.js';

export interface RedlockBackendOptions {
  /** URLs of N independent Redis servers (3 or 5 recommended); leasehold opens and closes the connections. Give this or `clients`. */
  urls?: string[];
  /** Clients of N independent Redis servers you already have (ioredis or node-redis); they stay yours. */
  clients?: RedisClientLike[];
  /** Prepended to every key; must not contain `{` or `}`. @default 'leasehold:' */
  prefix?: string;
  /** Longest wait for one server's reply; a server slower than this counts as failed for that call. @default 500 */
  commandTimeoutMs?: number;
  /** How long an idle lock's token counter is kept on each server. @default 3600000 (1 hour) */
  retainMs?: number;
}

export const REDLOCK_DEFAULTS = Object.freeze({
  prefix: 'leasehold:',
  /** 0.5 s: a server slower than this is treated as down for the call, so one sick server does not slow every grant. */
  commandTimeoutMs: 500,
  retainMs: 3_600_000,
  /** node-redlock's: validity = ttl − elapsed − (ttl × 1 % + 2 ms). */
  driftFactor: 0.01,
  /**
   * Redlock has no queue; a refused caller is remembered this long as a contender (inspect's
   * `waiters`). Core's waiting loop asks again at least every ~205 ms, so a waiter stays counted.
   */
  contenderTtlMs: 500,
  /** Conflicting token commits (concurrent grants) are retried this many times with a higher proposal. */
  commitAttempts: 3,
});

// Keys per server: meta hash (t = last token, d = lock-delay end), holders hash (owner →
// mode|token|expiresAt|lockDelay||label; token 0 until the commit phase), and a contenders zset
// (digest of refused owners → expiry). Expiry is judged by each server's own TIME.

/**
 * Helpers of the per-server scripts. purge: removes expired holders (their lock-delay starts, I8)
 * and returns the live ones and the lock-delay end. gc: key TTLs from the live holders' expiry and
 * lock-delay, plus `retain` for the counter.
 */
const NODE_HELPERS = `
local function purge(mk, hk, now, d)
  local all = redis.call('HGETALL', hk)
  local live = {}
  local nd = d
  for i = 1, #all, 2 do
    local h = holder(all[i + 1])
    if not h or h.exp <= now then
      redis.call('HDEL', hk, all[i])
      if h and h.ld > 0 and h.exp + h.ld > nd then nd = h.exp + h.ld end
    else
      h.owner = all[i]
      live[#live + 1] = h
    end
  end
  if nd > d then redis.call('HSET', mk, 'd', num(nd)) end
  return live, nd
end
local function gc(mk, hk, ck, live, d, now, retain)
  local horizon = now
  for _, h in ipairs(live) do
    if h.exp + h.ld > horizon then horizon = h.exp + h.ld end
  end
  if #live > 0 then redis.call('PEXPIREAT', hk, num(horizon)) end
  if d > horizon then horizon = d end
  redis.call('PEXPIREAT', mk, num(horizon + retain))
  redis.call('PEXPIREAT', ck, num(horizon + retain))
end
`;

/**
 * Phase 1 on one server: records the holder if the key is free there (token pending) and reads
 * the server's counter and clock. KEYS: meta, holders, contenders. ARGV: owner, mode, ttl,
 * lockDelay, label, retain, contenderTtl. Returns {'G', counter, TIME µs} | {'B', label, retryInMs, counter}.
 */
const NODE_ACQUIRE = new LuaScript('redlock-acquire', `${LUA_PRELUDE}${NODE_HELPERS}
local mk, hk, ck = KEYS[1], KEYS[2], KEYS[3]
local owner, mode, ttl, ld, label = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local retain, cttl = tonumber(ARGV[6]), tonumber(ARGV[7])
local now, now_us = clock()
local meta = redis.call('HMGET', mk, 't', 'd')
local t = meta[1] or '0'
local live, d = purge(mk, hk, now, tonumber(meta[2] or '0'))
for _, h in ipairs(live) do
  if h.owner == owner then
    h.exp = now + ttl
    redis.call('HSET', hk, owner, holder_record(h))
    gc(mk, hk, ck, live, d, now, retain)
    return {'G', t, num(now_us)}
  end
end
local digest = redis.sha1hex(owner)
if compatible(live, mode) and now >= d then
  local h = { owner = owner, mode = mode, tok = '0', exp = now + ttl, ld = ld, ses = '', label = label }
  redis.call('HSET', hk, owner, holder_record(h))
  live[#live + 1] = h
  redis.call('ZREM', ck, digest)
  gc(mk, hk, ck, live, d, now, retain)
  return {'G', t, num(now_us)}
end
redis.call('ZADD', ck, num(now + cttl), digest)
gc(mk, hk, ck, live, d, now, retain)
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
return {'B', first and first.label or '', retry, t}
`);

/**
 * Phase 2 on one server: raises the key's counter to the proposal only if it is lower (strictly),
 * and stamps our holder record with it. A server that already has the proposal or more answers
 * with its counter: another grant got there first. KEYS: meta, holders. ARGV: owner, proposal, retain.
 * Returns {1} | {0, counter}.
 */
const NODE_COMMIT = new LuaScript('redlock-commit', `${LUA_PRELUDE}${NODE_HELPERS}
local mk, hk = KEYS[1], KEYS[2]
local owner, p, retain = ARGV[1], ARGV[2], tonumber(ARGV[3])
local c = redis.call('HGET', mk, 't') or '0'
if tonumber(c) >= tonumber(p) then return {0, c} end
local now = clock()
redis.call('HSET', mk, 't', p)
local pt = redis.call('PTTL', mk)
if pt < retain then redis.call('PEXPIREAT', mk, num(now + retain)) end
local v = redis.call('HGET', hk, owner)
if v then
  local h = holder(v)
  if h then
    h.tok = p
    redis.call('HSET', hk, owner, holder_record(h))
  end
end
return {1}
`);

/**
 * Extends our record on one server; where the server has none (it restarted empty, or our record
 * expired there alone) and the key is free there, records it again with the token.
 * KEYS: meta, holders, contenders. ARGV: owner, token, ttl, mode, lockDelay, label, retain. Returns 1 if held.
 */
const NODE_RENEW = new LuaScript('redlock-renew', `${LUA_PRELUDE}${NODE_HELPERS}
local mk, hk, ck = KEYS[1], KEYS[2], KEYS[3]
local owner, token, ttl, mode, ld, label, retain = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7])
local now = clock()
local v = redis.call('HGET', hk, owner)
if v then
  local h = holder(v)
  if h and h.tok ~= token and h.tok ~= '0' then return 0 end
  if h and h.exp > now then
    h.exp = now + ttl
    h.tok = token
    redis.call('HSET', hk, owner, holder_record(h))
    extend_at(hk, h.exp + h.ld, now)
    extend_at(mk, h.exp + h.ld + retain, now)
    return 1
  end
end
local meta = redis.call('HMGET', mk, 't', 'd')
local live, d = purge(mk, hk, now, tonumber(meta[2] or '0'))
if not compatible(live, mode) or now < d then return 0 end
local h = { owner = owner, mode = mode, tok = token, exp = now + ttl, ld = ld, ses = '', label = label }
redis.call('HSET', hk, owner, holder_record(h))
if tonumber(meta[1] or '0') < tonumber(token) then redis.call('HSET', mk, 't', token) end
live[#live + 1] = h
gc(mk, hk, ck, live, d, now, retain)
return 1
`);

/**
 * Compare-and-delete on one server (an expired record is left to purge: lock-delay, I8).
 * KEYS: meta, holders, contenders. ARGV: owner, token (0: whatever token, to give back an unfinished grant), retain. Returns 1 if a record of ours was there.
 */
const NODE_RELEASE = new LuaScript('redlock-release', `${LUA_PRELUDE}${NODE_HELPERS}
local mk, hk, ck = KEYS[1], KEYS[2], KEYS[3]
local owner, token, retain = ARGV[1], ARGV[2], tonumber(ARGV[3])
local v = redis.call('HGET', hk, owner)
if not v then return 0 end
local h = holder(v)
if h and token ~= '0' and h.tok ~= token and h.tok ~= '0' then return 0 end
local now = clock()
if h and h.exp > now then redis.call('HDEL', hk, owner) end
local live, d = purge(mk, hk, now, tonumber(redis.call('HGET', mk, 'd') or '0'))
gc(mk, hk, ck, live, d, now, retain)
return 1
`);

/**
 * One server's view of a key. KEYS: meta, holders, contenders. Returns {counter, delayRemaining,
 * contenders, then digest, mode, token, expiresIn, label per holder}.
 */
const NODE_INSPECT = new LuaScript('redlock-inspect', `${LUA_PRELUDE}${NODE_HELPERS}
local mk, hk, ck = KEYS[1], KEYS[2], KEYS[3]
local now = clock()
local meta = redis.call('HMGET', mk, 't', 'd')
local live, d = purge(mk, hk, now, tonumber(meta[2] or '0'))
redis.call('ZREMRANGEBYSCORE', ck, '-inf', num(now))
local delay = 0
if d > now then delay = d - now end
local out = { meta[1] or '0', num(delay), redis.call('ZCARD', ck) }
for _, h in ipairs(live) do
  out[#out + 1] = redis.sha1hex(h.owner)
  out[#out + 1] = h.mode
  out[#out + 1] = h.tok
  out[#out + 1] = num(h.exp - now)
  out[#out + 1] = h.label
end
return out
`);

type Outcome<T> = { readonly node: number; readonly ok: true; readonly value: T } | { readonly node: number; readonly ok: false; readonly error: LeaseholdError };

/**
 * Calls every server at once and resolves as soon as `enough` says the outcomes so far decide the
 * matter (a quorum reached, or no longer reachable), or when all have answered. Calls still in
 * flight finish in the background; their errors are swallowed here (never unhandled).
 */
function gather<T>(n: number, call: (node: number) => Promise<T>, enough: (outcomes: readonly Outcome<T>[]) => boolean): Promise<Outcome<T>[]> {
  return new Promise((resolve) => {
    const outcomes: Outcome<T>[] = [];
    let done = false;
    const settle = (o: Outcome<T>): void => {
      outcomes.push(o);
      if (done) return;
      if (outcomes.length === n || enough(outcomes)) {
        done = true;
        resolve([...outcomes]);
      }
    };
    for (let i = 0; i < n; i++) {
      call(i).then(
        (value) => settle({ node: i, ok: true, value }),
        (error: unknown) => settle({ node: i, ok: false, error: mapRedisError('redlock', 'call', error) }),
      );
    }
  });
}

/**
 * Redlock over N independent Redis servers, with fencing tokens.
 *
 * Acquire: phase 1 records the holder on every server where the key is free (one script each, in
 * parallel) and reads each server's token counter; with a majority, phase 2 proposes
 * max(highest counter read + 1, highest server TIME in µs read) and writes it to every server,
 * where it is accepted only if higher than the counter there; the lease is handed out once a
 * majority accepted. Validity is ttl − elapsed − drift (core counts it from before phase 1);
 * an acquire that used it up gives everything back. Renew extends on every server and needs a
 * majority; release deletes on every server. No queue: waiters poll with jittered backoff.
 *
 * What holds and what does not is in the README's Redlock section; in short: the token of a grant
 * g2 requested after g1 was handed out is larger than g1's if g2's reading majority (the servers
 * that answered its phase 1) contains a server that was in g1's writing majority (accepted g1's
 * token) and kept its data since; otherwise only if the highest TIME (µs) read in g2's phase 1
 * exceeds g1's token (clocks roughly in step). Two grants never share a token because a proposal
 * is accepted only by servers whose counter is lower, and two majorities share a server (unless
 * that server lost its data between the two commits). Clocks decide who believes it holds the
 * lease, not the order of tokens: when they misbehave and two clients hold the key, the later
 * grant still has the higher token, and the fence refuses the older holder.
 */
export function redlockBackend(options: RedlockBackendOptions): Backend {
  const o = checkObject(options, 'options');
  checkKnownOptions(o, ['urls', 'clients', 'prefix', 'commandTimeoutMs', 'retainMs'], 'options');
  if ((o.urls === undefined) === (o.clients === undefined)) throw new InvalidArgumentError('options', 'give exactly one of urls or clients');
  const list = (o.urls ?? o.clients) as unknown[];
  const listName = o.urls !== undefined ? 'options.urls' : 'options.clients';
  if (!Array.isArray(list) || list.length === 0 || list.length > 15) {
    throw new InvalidArgumentError(listName, `expected an array of 1 to 15 independent servers (3 or 5 recommended), got ${describe(list)}`);
  }
  const prefix = o.prefix === undefined ? REDLOCK_DEFAULTS.prefix : checkKeyPrefix(o.prefix, 'options.prefix');
  const commandTimeoutMs = o.commandTimeoutMs === undefined ? REDLOCK_DEFAULTS.commandTimeoutMs : checkInteger(o.commandTimeoutMs, 'options.commandTimeoutMs', 1, MAX_DURATION_MS);
  const retain = String(o.retainMs === undefined ? REDLOCK_DEFAULTS.retainMs : checkInteger(o.retainMs, 'options.retainMs', 60_000, MAX_DURATION_MS));
  const nodes: Conn[] = [];
  try {
    list.forEach((item, i) => nodes.push(o.urls !== undefined ? connectUrl(item, `${listName}[${i}]`) : wrapClient(item, `${listName}[${i}]`)));
  } catch (error) {
    for (const n of nodes) void n.close();
    throw error;
  }
  const n = nodes.length;
  const quorum = Math.floor(n / 2) + 1;
  let closed = false;
  const keysOf = (key: string): [string, string, string] => {
    const meta = `${prefix}{${encodeKey(key)}}`;
    return [meta, `${meta}:h`, `${meta}:q`];
  };
  const ensureOpen = (): void => {
    if (closed) throw new InvalidArgumentError('backend', 'this redlock backend was closed');
  };
  const on = <T>(node: number, what: string, script: LuaScript, keys: readonly string[], args: readonly string[]): Promise<T> =>
    deadline(script.run(nodes[node]!, keys, args) as Promise<T>, commandTimeoutMs, 'redlock', what);

  const releaseAll = async (req: ReleaseRequest): Promise<number> => {
    const keys = keysOf(req.key);
    // Sent to every server; answered once a majority has (a hung server is not waited for).
    const outcomes = await gather(n, (i) => on(i, 'release', NODE_RELEASE, keys, [req.owner, req.token.toString(), retain]), (xs) => xs.filter((x) => x.ok).length >= quorum);
    return outcomes.filter((x) => x.ok).length;
  };

  const unavailable = (what: string, outcomes: readonly Outcome<unknown>[]): BackendUnavailableError => {
    const failures = outcomes.filter((x): x is Extract<Outcome<unknown>, { ok: false }> => !x.ok);
    const first = failures[0]?.error;
    return new BackendUnavailableError('redlock', `${what}: ${failures.length} of ${n} servers failed, a majority of ${quorum} is out of reach${first ? ` (${first.message})` : ''}`, first ? { cause: first } : undefined);
  };

  return {
    name: 'redlock',
    capabilities: Object.freeze({ fair: false, minTtlMs: 0 }),

    async acquire(req: AcquireRequest): Promise<AcquireResult> {
      ensureOpen();
      const start = performance.now();
      const keys = keysOf(req.key);
      const mode = req.mode === 'shared' ? 's' : 'e';
      type Phase1 = ['G', string, string] | ['B', string, string, string];
      const first = await gather<Phase1>(
        n,
        (i) => on(i, 'acquire', NODE_ACQUIRE, keys, [req.owner, mode, String(req.ttlMs), String(req.lockDelayMs), req.holder, retain, String(REDLOCK_DEFAULTS.contenderTtlMs)]),
        (outs) => {
          const granted = outs.filter((x) => x.ok && x.value[0] === 'G').length;
          return granted >= quorum || outs.length - granted > n - quorum;
        },
      );
      const granted = first.filter((x) => x.ok && x.value[0] === 'G');
      const giveBack = (): void => {
        // Everywhere, including servers whose answer is still on the wire (their release queues behind it).
        void releaseAll({ key: req.key, owner: req.owner, token: 0n, mode: req.mode }).catch(() => {});
      };
      if (granted.length < quorum) {
        if (granted.length > 0) giveBack();
        const failed = first.filter((x) => !x.ok).length;
        if (failed > n - quorum) throw unavailable('acquire', first);
        // The key frees when a majority of servers is free: the quorum-th soonest of their answers (0 where we were granted).
        const waits: number[] = [];
        let holder: string | undefined;
        for (const x of first) {
          if (!x.ok) continue;
          if (x.value[0] === 'G') waits.push(0);
          else {
            holder ??= x.value[1] || undefined;
            if (x.value[2] !== '') waits.push(Number(x.value[2]));
          }
        }
        waits.sort((a, b) => a - b);
        const retryInMs = waits.length >= quorum ? waits[quorum - 1] : undefined;
        return { granted: false, ...(holder ? { holder } : {}), ...(retryInMs !== undefined ? { retryInMs } : {}) };
      }

      // Phase 2: a token above everything a majority has seen, written back to a majority.
      let proposal = 0n;
      for (const x of first) {
        if (!x.ok) continue;
        const counter = BigInt(x.value[0] === 'G' ? x.value[1] : x.value[3]);
        if (counter + 1n > proposal) proposal = counter + 1n;
        if (x.value[0] === 'G' && BigInt(x.value[2]) > proposal) proposal = BigInt(x.value[2]);
      }
      for (let attempt = 1; attempt <= REDLOCK_DEFAULTS.commitAttempts; attempt++) {
        const p = proposal.toString();
        const commits = await gather<[number, string?]>(
          n,
          (i) => on(i, 'commit token', NODE_COMMIT, keys, [req.owner, p, retain]),
          (outs) => {
            const ok = outs.filter((x) => x.ok && int(x.value[0]) === 1).length;
            return ok >= quorum || outs.length - ok > n - quorum;
          },
        );
        const accepted = commits.filter((x) => x.ok && int(x.value[0]) === 1).length;
        const elapsed = performance.now() - start;
        const validity = req.ttlMs - elapsed - (req.ttlMs * REDLOCK_DEFAULTS.driftFactor + 2);
        if (accepted >= quorum) {
          if (validity <= 0) break;
          return { granted: true, token: proposal, ttlMs: req.ttlMs };
        }
        const higher = commits.filter((x) => x.ok && int(x.value[0]) === 0).map((x) => (x.ok ? BigInt(String(x.value[1])) : 0n));
        if (higher.length === 0 || validity <= 0) {
          giveBack();
          throw unavailable('token commit', commits);
        }
        // Another grant wrote first (a concurrent grant: clocks misbehaved, or a server lost its data): go above it.
        for (const h of higher) if (h + 1n > proposal) proposal = h + 1n;
      }
      giveBack();
      return { granted: false, retryInMs: 0 };
    },

    async renew(req: RenewRequest): Promise<RenewResult> {
      ensureOpen();
      const keys = keysOf(req.key);
      // The grant's lock-delay and label (core sends them with every renewal): a server that lost the
      // holder (restarted empty) records it again exactly as granted.
      const args = [req.owner, req.token.toString(), String(req.ttlMs), req.mode === 'shared' ? 's' : 'e', String(req.lockDelayMs ?? 0), req.holder ?? '', retain];
      const outs = await gather<number>(n, (i) => on(i, 'renew', NODE_RENEW, keys, args), (xs) => {
        const ok = xs.filter((x) => x.ok && int(x.value) === 1).length;
        const no = xs.filter((x) => x.ok && int(x.value) !== 1).length;
        return ok >= quorum || no > n - quorum;
      });
      const ok = outs.filter((x) => x.ok && int(x.value) === 1).length;
      if (ok >= quorum) return { renewed: true, ttlMs: req.ttlMs };
      const refused = outs.filter((x) => x.ok && int(x.value) !== 1).length;
      if (refused > n - quorum) return { renewed: false };
      throw unavailable('renew', outs);
    },

    async release(req: ReleaseRequest): Promise<void> {
      ensureOpen();
      const answered = await releaseAll(req);
      if (answered < quorum) throw new BackendUnavailableError('redlock', `release reached ${answered} of ${n} servers; the rest free the key when its ttl runs out`);
    },

    async inspect(prefixOfKeys: string): Promise<KeyState[]> {
      ensureOpen();
      const pattern = `${globEscape(prefix)}{${globEscape(encodeKey(prefixOfKeys))}*`;
      const metas = new Set<string>();
      let reachable = 0;
      await Promise.all(
        nodes.map(async (node) => {
          try {
            for (const target of node.scanTargets()) {
              let cursor = '0';
              do {
                const [next, found] = (await deadline(target.command(['SCAN', cursor, 'MATCH', pattern, 'COUNT', '1000']), commandTimeoutMs, 'redlock', 'scan')) as [string, string[]];
                cursor = String(next);
                for (const k of found) if (k.endsWith('}')) metas.add(k);
              } while (cursor !== '0');
            }
            reachable++;
          } catch {
            // a server that is down does not vote
          }
        }),
      );
      if (reachable < quorum) throw new BackendUnavailableError('redlock', `inspect reached ${reachable} of ${n} servers; a majority of ${quorum} is needed`);
      const out: KeyState[] = [];
      for (const meta of [...metas]) {
        const views = await gather<unknown[]>(n, (i) => on(i, 'inspect', NODE_INSPECT, [meta, `${meta}:h`, `${meta}:q`], []), () => false);
        const ok = views.filter((x): x is Extract<Outcome<unknown[]>, { ok: true }> => x.ok).map((x) => x.value);
        if (ok.length < quorum) continue;
        // A value holds for the key when a majority agrees: the quorum-th largest of the servers' values.
        const kth = (values: number[]): number => values.sort((a, b) => b - a)[quorum - 1] ?? 0;
        let lastToken = 0n;
        const seen = new Map<string, { count: number; mode: HolderState['mode']; token: bigint; expires: number[]; holder: string }>();
        for (const r of ok) {
          const t = BigInt(String(r[0]));
          if (t > lastToken) lastToken = t;
          for (let x = 3; x + 4 < r.length; x += 5) {
            const id = String(r[x]);
            const s = seen.get(id) ?? { count: 0, mode: r[x + 1] === 's' ? 'shared' : 'exclusive', token: 0n, expires: [], holder: String(r[x + 4]) };
            s.count++;
            const tok = BigInt(String(r[x + 2]));
            if (tok > s.token) s.token = tok;
            s.expires.push(Number(r[x + 3]));
            seen.set(id, s);
          }
        }
        const holders: HolderState[] = [...seen.values()]
          .filter((s) => s.count >= quorum && s.token > 0n)
          .map((s) => ({ mode: s.mode, token: s.token, holder: s.holder, expiresInMs: Math.max(0, kth(s.expires)) }));
        const waiters = Math.max(...ok.map((r) => int(r[2])));
        const lockDelayRemainingMs = kth(ok.map((r) => Number(r[1])));
        if (holders.length === 0 && waiters === 0 && lockDelayRemainingMs === 0) continue;
        out.push({ key: decodeKey(meta.slice(prefix.length + 1, -1)), lastToken, holders, waiters, lockDelayRemainingMs });
      }
      return out.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
    },

    async close() {
      if (closed) return;
      closed = true;
      // Each bounded (QUIT waited for at most commandTimeoutMs, then the socket dropped), all at once.
      await Promise.all(nodes.map((c) => c.close(commandTimeoutMs)));
    },
  };
}

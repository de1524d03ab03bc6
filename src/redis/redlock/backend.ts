import type { AcquireRequest, AcquireResult, Backend, HolderState, KeyState, ReleaseRequest, RenewRequest, RenewResult } from '../../core/backend.js';
import { driftMarginMs } from '../../core/clock.js';
import { BackendUnavailableError, InvalidArgumentError, type LeaseholdError } from '../../core/errors.js';
import { DEFAULTS } from '../../core/options.js';
import { checkInteger, checkKnownOptions, checkObject, describe, MAX_DURATION_MS } from '../../core/validate.js';
import { connectUrl, wrapClient } from '../conn/open.js';
import type { Conn, RedisClientLike } from '../conn/types.js';
import { Deadlines } from '../deadline.js';
import { mapRedisError } from '../errors.js';
import { checkKeyPrefix, keyOfLock, lockKeyOf, lockPattern } from '../keys.js';
import { limitConflict } from '../limit.js';
import { int, type LuaScript } from '../lua/script.js';
import { NODE_ACQUIRE } from './acquire.js';
import { NODE_COMMIT } from './commit.js';
import { lockKeys, type LockKeys } from './helpers.js';
import { NODE_INSPECT } from './inspect.js';
import { NODE_RELEASE } from './release.js';
import { NODE_RENEW } from './renew.js';

export interface RedlockBackendOptions {
  /** URLs of N independent Redis servers (3 or 5 recommended); leasehold opens and closes the connections. Give this or `clients`. */
  urls?: string[];
  /** Clients of N independent Redis servers you already have (ioredis or node-redis); they stay yours. */
  clients?: RedisClientLike[];
  /** Prepended to every key; must not contain `{` or `}`. @default 'leasehold:' */
  prefix?: string;
  /**
   * The time limit of one server's answer: a server slower than this counts as failed for that call
   * (the others decide, if they are a majority), so one sick server does not slow every grant. A
   * call fails with BackendUnavailableError when a majority cannot be reached in time. Each backend
   * call is one round to every server at once (renew, release), or two to a few (acquire: record,
   * then commit the token, retried at most `commitAttempts` times); close() waits this long for QUIT.
   *
   * This is the one bound a Redlock call meets. `Locks` also bounds every backend call, for
   * backends without a limit of their own (`operationTimeoutMs`, 5 s); keep (1 + commitAttempts) ×
   * this below that (the default does: 2 s), and core's bound never fires on Redlock.
   * @default 500
   */
  commandTimeoutMs?: number;
  /** How long an idle lock's token counter is kept on each server. @default 3600000 (1 hour) */
  retainMs?: number;
}

export const REDLOCK_DEFAULTS = Object.freeze({
  prefix: 'leasehold:',
  /** 0.5 s: a server slower than this is treated as down for the call, so one sick server does not slow every grant. */
  commandTimeoutMs: 500,
  retainMs: 3_600_000,
  /** Core's (and node-redlock's): validity = ttl − elapsed − driftMarginMs(ttl, driftFactor), i.e. ttl × 1 % + 2 ms. */
  driftFactor: DEFAULTS.driftFactor,
  /**
   * Redlock has no queue; a refused caller is remembered this long as a contender (inspect's
   * `waiters`). Core's waiting loop asks again at least every ~205 ms, so a waiter stays counted.
   */
  contenderTtlMs: 500,
  /** Conflicting token commits (concurrent grants) are retried this many times with a higher proposal. */
  commitAttempts: 3,
  /** The permits this client holds are remembered for their renewals (see `permits` below); past this many, the lapsed ones are swept. */
  permitsSweepAt: 1_024,
});

type Outcome<T> =
  | { readonly node: number; readonly ok: true; readonly value: T }
  | { readonly node: number; readonly ok: false; readonly error: LeaseholdError };

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
 * majority accepted. Validity is ttl − elapsed − drift (core's `driftMarginMs`; core counts it
 * from before phase 1); an acquire that used it up gives everything back. Renew extends on every
 * server and needs a majority; release deletes on every server. No queue: waiters poll with
 * jittered backoff. The per-server scripts, with their KEYS, ARGV and replies, are in this folder.
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
 *
 * Semaphore permits (`AcquireRequest.limit` = L): each server admits at most L permit records at
 * once (its scripts check the limit as they do for a lock), and a permit is granted and renewed
 * only when recorded on floor(N × L / (L + 1)) + 1 of the N servers — a majority for L = 1, but
 * more for L > 1: with a bare majority three clients could each hold two of three servers while no
 * server has more than two records, three valid permits of a semaphore of two. With that quorum,
 * L + 1 valid permits would need (L + 1) × quorum > N × L records, more than N servers of at most
 * L each can hold (I9). The price: a semaphore of L ≥ 2 on three servers needs all three (on five:
 * four for L = 2 or 3, all five from L = 4). Waiters poll, as for locks: no queue, not fair.
 *
 * The closed state and inspect's order are core's (`guardBackend`).
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
  const commandTimeoutMs =
    o.commandTimeoutMs === undefined ? REDLOCK_DEFAULTS.commandTimeoutMs : checkInteger(o.commandTimeoutMs, 'options.commandTimeoutMs', 1, MAX_DURATION_MS);
  const retain = String(o.retainMs === undefined ? REDLOCK_DEFAULTS.retainMs : checkInteger(o.retainMs, 'options.retainMs', 60_000, MAX_DURATION_MS));
  const nodes: Conn[] = [];
  try {
    for (const [i, item] of list.entries()) {
      nodes.push(o.urls !== undefined ? connectUrl(item, `${listName}[${i}]`) : wrapClient(item, `${listName}[${i}]`));
    }
  } catch (error) {
    for (const n of nodes) void n.close();
    throw error;
  }
  const n = nodes.length;
  const quorum = Math.floor(n / 2) + 1;
  /** Every server's calls share one bound (commandTimeoutMs), hence one set of deadlines for the backend. */
  const deadlines = new Deadlines(commandTimeoutMs, 'redlock');
  /** Stops close() from closing twice (core's guard does that too; a direct user may not have it). */
  let closed = false;
  const keysOf = (key: string): LockKeys => lockKeys(lockKeyOf(prefix, key));
  /** Servers a grant needs: a majority, and for a permit of `limit` floor(n × limit / (limit + 1)) + 1 (see above). */
  const quorumOf = (limit: number | undefined): number => (limit === undefined ? quorum : Math.floor((n * limit) / (limit + 1)) + 1);
  /**
   * The limit of each permit this client holds, by owner, for its renewals (which must record it
   * again where a server lost it, and reach its quorum): a RenewRequest carries no limit. Removed
   * at release and at a failed renewal; a lease lost without either (not renewed, never released)
   * is swept once its ttl has passed since its grant or last renewal.
   */
  const permits = new Map<string, { limit: number; ttlMs: number; at: number }>();
  const rememberPermit = (owner: string, limit: number, ttlMs: number): void => {
    const now = performance.now();
    if (permits.size >= REDLOCK_DEFAULTS.permitsSweepAt) for (const [o, p] of permits) if (now - p.at > p.ttlMs) permits.delete(o);
    permits.set(owner, { limit, ttlMs, at: now });
  };
  /** The mode the scripts take: e, s, or s<limit> for a permit. */
  const modeOf = (mode: AcquireRequest['mode'], limit: number | undefined): 'e' | 's' | `s${number}` =>
    mode === 'exclusive' ? 'e' : limit === undefined ? 's' : `s${limit}`;
  /** One script on one server, bounded. */
  const on = <A extends readonly string[], R>(node: number, what: string, script: LuaScript<LockKeys, A, R>, keys: LockKeys, args: A): Promise<R> =>
    deadlines.bound(script.run(nodes[node]!, keys, args), what);

  const releaseAll = async (req: ReleaseRequest): Promise<number> => {
    const keys = keysOf(req.key);
    // Sent to every server; answered once a majority has (a hung server is not waited for).
    const outcomes = await gather(
      n,
      (i) => on(i, 'release', NODE_RELEASE, keys, [req.owner, req.token.toString(), retain]),
      (xs) => xs.filter((x) => x.ok).length >= quorum,
    );
    return outcomes.filter((x) => x.ok).length;
  };

  const unavailable = (what: string, outcomes: readonly Outcome<unknown>[]): BackendUnavailableError => {
    const failures = outcomes.filter((x): x is Extract<Outcome<unknown>, { ok: false }> => !x.ok);
    const first = failures[0]?.error;
    return new BackendUnavailableError(
      'redlock',
      `${what}: ${failures.length} of ${n} servers failed, a majority of ${quorum} is out of reach${first ? ` (${first.message})` : ''}`,
      first ? { cause: first } : undefined,
    );
  };

  return {
    name: 'redlock',
    capabilities: Object.freeze({ fair: false, minTtlMs: 0 }),

    async acquire(req: AcquireRequest): Promise<AcquireResult> {
      const start = performance.now();
      const keys = keysOf(req.key);
      const limit = req.mode === 'shared' ? req.limit : undefined;
      const mode = modeOf(req.mode, limit);
      const q = quorumOf(limit);
      const first = await gather(
        n,
        (i) =>
          on(i, 'acquire', NODE_ACQUIRE, keys, [
            req.owner,
            mode,
            String(req.ttlMs),
            String(req.lockDelayMs),
            req.holder,
            retain,
            String(REDLOCK_DEFAULTS.contenderTtlMs),
          ]),
        (outs) => {
          const granted = outs.filter((x) => x.ok && x.value[0] === 'G').length;
          if (granted >= q) return true;
          // Refused: answered once it is also decided whether a majority records another limit.
          const conflicts = outs.filter((x) => x.ok && x.value[0] === 'M').length;
          return outs.length - granted > n - q && (conflicts >= quorum || outs.length - conflicts > n - quorum);
        },
      );
      const granted = first.filter((x) => x.ok && x.value[0] === 'G');
      const giveBack = (): void => {
        // Everywhere, including servers whose answer is still on the wire (their release queues behind it).
        void releaseAll({ key: req.key, owner: req.owner, token: 0n, mode: req.mode }).catch(() => {});
      };
      if (granted.length < q) {
        if (granted.length > 0) giveBack();
        // A majority of servers has holders of another limit: the key is held so (nothing was written there).
        const conflicts = first.flatMap((x) => (x.ok && x.value[0] === 'M' ? [x.value[1]] : []));
        if (conflicts.length >= quorum) throw limitConflict(req.key, String(conflicts[0]), limit);
        const failed = first.filter((x) => !x.ok).length;
        if (failed > n - q) throw unavailable('acquire', first);
        // The key frees when a majority of servers is free: the quorum-th soonest of their answers (0 where we were granted).
        const waits: number[] = [];
        let holder: string | undefined;
        for (const x of first) {
          if (!x.ok) continue;
          if (x.value[0] === 'G') waits.push(0);
          else if (x.value[0] === 'B') {
            holder ??= x.value[1] || undefined;
            if (x.value[2] !== '') waits.push(Number(x.value[2]));
          }
        }
        waits.sort((a, b) => a - b);
        const retryInMs = waits.length >= q ? waits[q - 1] : undefined;
        return { granted: false, ...(holder ? { holder } : {}), ...(retryInMs !== undefined ? { retryInMs } : {}) };
      }

      // Phase 2: a token above everything a majority has seen, written back to a majority.
      let proposal = 0n;
      for (const x of first) {
        if (!x.ok) continue;
        const counter = BigInt(x.value[0] === 'G' ? x.value[1] : x.value[0] === 'B' ? x.value[3] : x.value[2]);
        if (counter + 1n > proposal) proposal = counter + 1n;
        if (x.value[0] === 'G' && BigInt(x.value[2]) > proposal) proposal = BigInt(x.value[2]);
      }
      const margin = driftMarginMs(req.ttlMs, REDLOCK_DEFAULTS.driftFactor);
      for (let attempt = 1; attempt <= REDLOCK_DEFAULTS.commitAttempts; attempt++) {
        const p = proposal.toString();
        const commits = await gather(
          n,
          (i) => on(i, 'commit token', NODE_COMMIT, keys, [req.owner, p, retain]),
          (outs) => {
            const ok = outs.filter((x) => x.ok && int(x.value[0]) === 1).length;
            return ok >= quorum || outs.length - ok > n - quorum;
          },
        );
        const accepted = commits.filter((x) => x.ok && int(x.value[0]) === 1).length;
        const validity = req.ttlMs - (performance.now() - start) - margin;
        if (accepted >= quorum) {
          if (validity <= 0) break;
          if (limit !== undefined) rememberPermit(req.owner, limit, req.ttlMs);
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
      const keys = keysOf(req.key);
      const permit = req.mode === 'shared' ? permits.get(req.owner) : undefined;
      const q = quorumOf(permit?.limit);
      // The grant's lock-delay and label (core sends them with every renewal), and a permit's limit: a
      // server that lost the holder (restarted empty) records it again exactly as granted.
      const args = [
        req.owner,
        req.token.toString(),
        String(req.ttlMs),
        modeOf(req.mode, permit?.limit),
        String(req.lockDelayMs ?? 0),
        req.holder ?? '',
        retain,
      ] as const;
      const outs = await gather(
        n,
        (i) => on(i, 'renew', NODE_RENEW, keys, args),
        (xs) => {
          const ok = xs.filter((x) => x.ok && int(x.value) === 1).length;
          const no = xs.filter((x) => x.ok && int(x.value) !== 1).length;
          return ok >= q || no > n - q;
        },
      );
      const ok = outs.filter((x) => x.ok && int(x.value) === 1).length;
      if (ok >= q) {
        if (permit) permit.at = performance.now();
        return { renewed: true, ttlMs: req.ttlMs };
      }
      const refused = outs.filter((x) => x.ok && int(x.value) !== 1).length;
      if (refused > n - q) {
        permits.delete(req.owner);
        return { renewed: false };
      }
      throw unavailable('renew', outs);
    },

    async release(req: ReleaseRequest): Promise<void> {
      permits.delete(req.owner);
      const answered = await releaseAll(req);
      if (answered < quorum)
        throw new BackendUnavailableError('redlock', `release reached ${answered} of ${n} servers; the rest free the key when its ttl runs out`);
    },

    /** Keys that a majority of servers agrees have a holder, a contender or a lock-delay. Unsorted (core sorts). */
    async inspect(prefixOfKeys: string): Promise<KeyState[]> {
      const pattern = lockPattern(prefix, prefixOfKeys);
      const metas = new Set<string>();
      let reachable = 0;
      await Promise.all(
        nodes.map(async (node) => {
          try {
            for (const target of node.scanTargets()) {
              let cursor = '0';
              do {
                const [next, found] = (await deadlines.bound(target.command(['SCAN', cursor, 'MATCH', pattern, 'COUNT', '1000']), 'scan')) as [
                  string,
                  string[],
                ];
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
        const views = await gather(
          n,
          (i) => on(i, 'inspect', NODE_INSPECT, lockKeys(meta), []),
          () => false,
        );
        const ok = views.flatMap((x) => (x.ok ? [x.value] : []));
        if (ok.length < quorum) continue;
        // A value holds for the key when a majority agrees: the quorum-th largest of the servers' values.
        const kth = (values: number[], k = quorum): number => values.sort((a, b) => b - a)[k - 1] ?? 0;
        let lastToken = 0n;
        const seen = new Map<string, { count: number; mode: HolderState['mode']; limit?: number; token: bigint; expires: number[]; holder: string }>();
        for (const r of ok) {
          const t = BigInt(String(r[0]));
          if (t > lastToken) lastToken = t;
          for (let x = 3; x + 4 < r.length; x += 5) {
            const id = String(r[x]);
            const mode = String(r[x + 1]);
            const s = seen.get(id) ?? {
              count: 0,
              mode: mode[0] === 's' ? 'shared' : 'exclusive',
              ...(mode.length > 1 && { limit: Number(mode.slice(1)) }),
              token: 0n,
              expires: [],
              holder: String(r[x + 4]),
            };
            s.count++;
            const tok = BigInt(String(r[x + 2]));
            if (tok > s.token) s.token = tok;
            s.expires.push(Number(r[x + 3]));
            seen.set(id, s);
          }
        }
        // A holder counts where its grant's quorum records it (a permit's is larger, see above).
        const valid = [...seen.values()].filter((s) => s.count >= quorumOf(s.limit) && s.token > 0n);
        const holders: HolderState[] = valid.map((s) => ({
          mode: s.mode,
          token: s.token,
          holder: s.holder,
          expiresInMs: Math.max(0, kth(s.expires, quorumOf(s.limit))),
        }));
        const limit = valid.find((s) => s.limit !== undefined)?.limit;
        const waiters = Math.max(...ok.map((r) => int(r[2])));
        const lockDelayRemainingMs = kth(ok.map((r) => Number(r[1])));
        if (holders.length === 0 && waiters === 0 && lockDelayRemainingMs === 0) continue;
        out.push({ key: keyOfLock(prefix, meta), lastToken, holders, waiters, lockDelayRemainingMs, ...(limit !== undefined && { limit }) });
      }
      return out;
    },

    async close() {
      if (closed) return;
      closed = true;
      // Each bounded (QUIT waited for at most commandTimeoutMs, then the socket dropped), all at once.
      await Promise.all(nodes.map((c) => c.close(commandTimeoutMs)));
    },
  };
}

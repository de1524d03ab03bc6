import { randomBytes } from 'node:crypto';
import { Etcd3, EtcdLeaseInvalidError, type IKeyValue, type ICompare, type IRequestOp } from 'etcd3';
import type {
  AcquireRequest, AcquireResult, Backend, HandOff, HolderState, KeyState, ReleaseRequest, RenewRequest, RenewResult, SessionSupport,
} from '../core/backend.js';
import { InvalidArgumentError } from '../core/errors.js';
import { checkInteger, checkKnownOptions, checkObject, describe, type LockMode } from '../core/validate.js';
import { KeyLayout, decodePart, encodePart, parseKey, rangeEnd } from './keys.js';
import {
  cmp, deadline, deletedKvs, isLeaseNotFound, keepAliveOnce, mapError, op, ownClientOptions, readKvs, revoke, type EtcdClient,
} from './rpc.js';
import { LeaderRoute } from './route.js';
import { LockWatches, Wake, type Follow, type WatchTarget } from './wake.js';

export interface EtcdBackendOptions {
  /** etcd client URLs (`http://h1:2379`, …), every member: requests fail over between them. Give this or `client`. */
  hosts?: string | readonly string[];
  /** An `Etcd3` client you already have (a root client, not a namespace: use `prefix`); never closed by `close()`. */
  client?: EtcdClient;
  /** Every key the backend writes starts with this. @default 'leasehold/' */
  prefix?: string;
  /**
   * Deadline of each etcd request. A request to a member that is down or has lost its leader fails
   * after this long and is retried on another member (the etcd3 client's retry policy). @default 2000
   */
  requestTimeoutMs?: number;
  /**
   * The server's smallest lease ttl: etcd raises shorter ones to 1.5 × its election timeout,
   * rounded up to whole seconds (2 s with the default 1 s election timeout). Tell the backend when
   * your cluster runs with other timings. Ttls are whole seconds either way; the effective ttl is
   * reported in `lease.ttlMs`. @default 2000
   */
  minTtlMs?: number;
  /**
   * How long the watch a client keeps on a lock its waiters follow stays open after the last of
   * them got the key or left. A client that waits on the same lock again within it (a worker in a
   * loop) joins the running watch: no new watch and no read per wait. 0: close it at once. @default 10000
   */
  watchLingerMs?: number;
  /**
   * With several `hosts`: send requests and watches to the member that leads (looked up with
   * `Status` at the start and every 5 s), falling back to every member while it is unknown or
   * unreachable. A write sent to a follower costs one more round, and a follower's watch sees a
   * change later. Ignored with `client`. @default true
   */
  preferLeader?: boolean;
}

/** Defaults, each with its reason. */
export const ETCD_DEFAULTS = Object.freeze({
  /** One directory for everything leasehold writes, easy to find with `etcdctl get --prefix leasehold/`. */
  prefix: 'leasehold/',
  /** 2 s: longer than an etcd leader election with default timings (1 s), well inside core's 5 s operation timeout. */
  requestTimeoutMs: 2_000,
  /** 2 s: etcd's minimum lease with its default 100 ms heartbeat and 1 s election timeout. */
  minTtlMs: 2_000,
  /** 10 s: a worker that takes the same lock again within seconds keeps its watch; an open watch costs etcd little. */
  watchLingerMs: 10_000,
  /** Writes and watches on the leader: a hand-off is one replication round shorter. */
  preferLeader: true,
});

/**
 * Rounds of "try the grant, else read" one acquire call makes before it answers busy. Each lost
 * round means the key's queue changed under us; the waiter's watch and core's re-check pick it up.
 */
const MAX_ROUNDS = 4;
/**
 * A shared grant next to shared holders that have lock-delay markers checks each of their entries
 * in its transaction; past this many it waits (etcd allows 128 operations per transaction).
 */
const MAX_DELAY_GUARDS = 64;
/** A queued request nobody asked about for this long is forgotten and its leases revoked (core asks every ~0.5 s). */
const PENDING_FORGET_MS = 30_000;
/**
 * A write whose outcome is unknown (its answer timed out) may have taken effect. Writes that could
 * leave a key held on a session lease nobody will release (a release, a cancelled wait, a grant to
 * a caller that gave up) are followed up in the background until they are known to be done, for at
 * most this long; after that, the session ending frees the key.
 */
const FOLLOW_UP_LIMIT_MS = 120_000;
/** An acquire that failed with an unknown outcome is cleaned up if its caller has not asked again after this long (core asks within ~1 s). */
const ABANDONED_AFTER_MS = 2_000;
/** Names given back by confirmed deletions, kept for reuse (across all lock keys; the oldest lock's go first past this). */
const MAX_FREE_NAMES = 1_024;
/** How often acquire sweeps the names of requests that ended without telling the backend (a lease lost, not released). */
const NAME_SWEEP_MS = 1_000;
/** Extra second on lock-delay leases: covers the gap between refreshing a delay lease and its lock's lease (see `sessions`). */
const DELAY_MARGIN_S = 1;

/** A request in a key's queue, as read from etcd. */
interface Entry {
  readonly key: string;
  readonly encOwner: string;
  readonly mode: LockMode;
  /** Create revision: place in the queue, and the token once granted. */
  readonly rev: bigint;
  readonly lease: string;
  /** Written as granted (a grant on a free key, or one next to lock-delay markers); others are inferred from their place. */
  readonly granted: boolean;
  readonly holder: string;
  /** The entry's lease belongs to this lock alone (no session): release revokes it. */
  readonly ownLease: boolean;
}

/** A lock-delay marker: while its holder's entry exists it is dormant; once the entry is gone, it blocks the key until it expires. */
interface DelayMark {
  readonly key: string;
  readonly encOwner: string;
  readonly lease: string;
  readonly holder: string;
  readonly token: bigint;
}

/** Everything under one lock key at one revision. */
interface View {
  readonly revision: bigint;
  /** In queue order (create revision). */
  readonly entries: readonly Entry[];
  readonly delays: readonly DelayMark[];
}

/** A queued request between two calls of the same acquire (same owner). */
interface Pending {
  readonly key: string;
  readonly mode: LockMode;
  /** No session: the lease of this lock, granted on the first call, refreshed by each call. */
  lockLease?: { id: string; ttlMs: number };
  /** No session, lockDelayMs > 0: the lease of the lock-delay marker. */
  delayLease?: string;
  /** What the last call read (the next call starts from it). */
  view?: View;
  touchedAt: number;
}

/**
 * The name a request's keys carry (`<tag>.<n>`, see `#nameFor`), in place of its owner id. One name
 * per owner for as long as the backend may still act on that owner's keys.
 */
interface RequestName {
  readonly key: string;
  readonly name: string;
  /** The session of the owner's latest call: the name is retired when that session ends. */
  session: string | undefined;
  /** For a request on a lease of its own: past this (monotonic ms) the lease is certainly gone and the name is retired. */
  ownUntil: number | undefined;
  /** A call of this owner failed with an unknown outcome: something under the name may yet be written. Never reused. */
  tainted: boolean;
  /**
   * The caller gave up (cancelWait) while a call of its was still running: what that call writes
   * (a place, a grant) is nobody's, and is deleted again when it ends.
   */
  cancelled?: boolean;
}

/** The busy answer's cursor: who waits, and what to watch from which revision. */
interface Cursor extends WatchTarget {
  readonly owner?: string;
}

interface SessionRecord {
  /** The session's effective ttl; 0 until known (a session opened by another backend object). */
  ttlMs: number;
  /** lockDelayMs → the lease of lock-delay markers of this session's locks. */
  readonly delays: Map<number, Promise<string>>;
  /** Last open, keep-alive or acquire (monotonic ms): a session core stopped using (lost by validity) is forgotten. */
  usedAt: number;
}

const entryValue = (holder: string, ownLease: boolean, granted: boolean): string =>
  JSON.stringify({ h: holder, o: ownLease ? 1 : 0, g: granted ? 1 : 0 });
const delayValue = (holder: string, token: bigint | undefined): string => JSON.stringify({ h: holder, t: token?.toString() ?? '' });

function parseJson(kv: IKeyValue): Record<string, unknown> {
  try {
    const v = JSON.parse(kv.value.toString('utf8')) as unknown;
    return typeof v === 'object' && v !== null ? (v as Record<string, unknown>) : {};
  } catch {
    return {};
  }
}

/**
 * Leases in etcd (v3 API, etcd ≥ 3.3), through the `etcd3` client.
 *
 * **Sessions.** One etcd lease per client session (core opens one per ttl per `Locks` and reuses
 * it) carries every lock of that client: renewal is one LeaseKeepAlive per session every ttl/3,
 * however many locks it holds. Core drives the keep-alives (`sessions.keepAlive` is one round
 * trip) instead of etcd3's automatic loop, so a keep-alive that fails or finds the lease gone
 * reaches core's loss detection at once (I6) and validity is counted from the request (I5). A lock
 * acquired with `autoRenew: false` gets a lease of its own, revoked on release.
 *
 * **Queue.** A request is a key `<prefix><key>/q/<e|s>/<name>` on the client's session lease (the
 * name: this backend's tag and a number, reused once its keys are deleted, see `#nameFor`);
 * its create revision is its place. An exclusive request is granted when no request is ahead of
 * it, a shared one when no exclusive request is ahead: FIFO, no barging (a `tryAcquire` never
 * jumps a queue). On a free key the first call is the grant: one transaction (guards: key free, no
 * lock-delay; else, for a waiter, a nested put of its entry and a read). A waiter blocked by
 * requests ahead follows every change under the lock after the revision it read (`follower`,
 * `Wake`), so when the release lands it knows it holds the key by its place — nothing ahead of its
 * entry, no expired holder's marker, its own entry still there (etcd issue 11456) — and is handed
 * the grant through the wake-up hook, with no read and no write; nobody can get ahead of it
 * afterwards. Only that waiter acts on a release, so there is no herd of requests. Where that is
 * not enough (a broken watch, lock-delay, markers around) the waiter is woken and asks: its grant is
 * then a linearizable read that finds its own entry first, its own entry read in the same step. A crashed waiter's
 * place ends with its session (its ttl); a waiter that gives up deletes its entry (`cancelWait`,
 * retried in the background until done), and one whose call failed with an unknown outcome and
 * that does not ask again is cleaned up after 2 s.
 *
 * **Fencing token = the create revision of the request's key.** etcd's revision is a cluster-wide
 * counter, raised by every write, agreed through raft and persisted before a write is
 * acknowledged. I1: a grant completes after its key was created; a later request creates its key
 * later, at a higher revision, whatever happened in between (releases, restarts, leader changes).
 * I2: each request key is created by its own transaction, and two transactions never share a
 * revision. Revisions start at 1 and are int64: [1, 2^63). Restoring a snapshot (`etcdutl
 * snapshot restore`; `etcdctl snapshot restore` in 3.4) *without* `--bump-revision` puts the
 * revision back to the snapshot's, so new grants repeat or undercut tokens already accepted:
 * fences refuse them (StaleTokenError) until the revision passes the fences' marks. A liveness
 * failure, never a safety one. Restore with `--bump-revision <N> --mark-compacted` (etcd ≥ 3.5.10),
 * N larger than the number of writes since the snapshot (a generous 1e9 is common); the marked
 * compaction makes watches from old revisions fail instead of silently missing events.
 *
 * **Lock-delay (I8).** etcd deletes the keys of an expired lease without saying it expired, so a
 * holder with `lockDelayMs` > 0 also writes a marker `<prefix><key>/d/<name>` on a second lease
 * that outlives its own lease by lockDelayMs (+1 s margin, rounded up to seconds): the delay lease
 * is refreshed in the same keep-alive stream right before the lock's lease, so it never expires
 * earlier than lockDelayMs after it. Release deletes both keys in one transaction (no delay); a
 * marker without its entry means "expired without release" and blocks new grants until it expires.
 *
 * **Time (I5, I7).** Expiry is the etcd leader's lease clock. A lease lives its TTL from the
 * moment the leader handles the grant or keep-alive, which is after the client sent it; a new
 * leader gives every lease at least its remaining TTL again (by default it restarts them in full),
 * never less. Etcd notices expiries on a 500 ms tick, so keys go up to ~0.5 s after their TTL.
 *
 * Every request has a deadline (`requestTimeoutMs`, per attempt); the client built from `hosts`
 * knows every member and tries a failed request on up to three of them (see `ownClientOptions` for
 * why etcd3's default circuit breaker is not used). With several hosts, requests and watches go to
 * the leader while it is known and answers (`preferLeader`, see route.ts). Errors become `BackendUnavailableError` by
 * error class and gRPC status, never by message text.
 */
export function etcdBackend(options: EtcdBackendOptions): Backend {
  const o = checkObject(options, 'options');
  checkKnownOptions(o, ['hosts', 'client', 'prefix', 'requestTimeoutMs', 'minTtlMs', 'watchLingerMs', 'preferLeader'], 'options');
  if ((o.hosts === undefined) === (o.client === undefined)) throw new InvalidArgumentError('options', 'give exactly one of hosts or client');
  const prefix = checkPrefixOption(o.prefix ?? ETCD_DEFAULTS.prefix);
  const timeoutMs = o.requestTimeoutMs === undefined ? ETCD_DEFAULTS.requestTimeoutMs : checkInteger(o.requestTimeoutMs, 'requestTimeoutMs', 1, 600_000);
  const minTtlMs = o.minTtlMs === undefined ? ETCD_DEFAULTS.minTtlMs : checkInteger(o.minTtlMs, 'minTtlMs', 1_000, 3_600_000);
  if (o.minTtlMs !== undefined && minTtlMs % 1000 !== 0) throw new InvalidArgumentError('minTtlMs', `etcd leases are whole seconds; got ${minTtlMs}`);
  const lingerMs = o.watchLingerMs === undefined ? ETCD_DEFAULTS.watchLingerMs : checkInteger(o.watchLingerMs, 'watchLingerMs', 0, 3_600_000);
  if (o.preferLeader !== undefined && typeof o.preferLeader !== 'boolean') throw new InvalidArgumentError('preferLeader', `expected a boolean, got ${describe(o.preferLeader)}`);
  let client: EtcdClient;
  let owned: (() => void) | undefined;
  if (o.hosts !== undefined) {
    const hosts = checkHosts(o.hosts);
    const pool = new Etcd3(ownClientOptions(hosts));
    if (hosts.length > 1 && (o.preferLeader ?? ETCD_DEFAULTS.preferLeader)) {
      // One client per member, each trying its member once: the route picks the next member itself.
      const route = new LeaderRoute(pool, hosts, (h) => ownClientOptions([h], 1), timeoutMs);
      client = route.client;
      owned = () => {
        route.close();
        pool.close();
      };
    } else {
      client = pool;
      owned = () => pool.close();
    }
  } else {
    const c = o.client as EtcdClient;
    if (typeof c !== 'object' || c === null || typeof c.kv?.txn !== 'function' || typeof c.leaseClient?.leaseGrant !== 'function' || typeof c.watch !== 'function') {
      throw new InvalidArgumentError('client', `expected an Etcd3 client, got ${describe(c)}`);
    }
    client = c;
  }
  return new EtcdBackend(client, owned, prefix, timeoutMs, minTtlMs, lingerMs);
}

class EtcdBackend implements Backend {
  readonly name = 'etcd';
  readonly capabilities: Backend['capabilities'];
  readonly sessions: SessionSupport;
  readonly #client: EtcdClient;
  /** Closes the client(s) the backend built; undefined for a client passed in. */
  readonly #closeClient: (() => void) | undefined;
  readonly #prefix: string;
  readonly #timeoutMs: number;
  readonly #pending = new Map<string, Pending>();
  readonly #wakes = new Map<string, Wake>();
  readonly #lockWatches: LockWatches;
  readonly #sessionTable = new Map<string, SessionRecord>();
  /** Owners whose last (non-queued, session) acquire failed with an unknown outcome; see `#abandonLater`. */
  readonly #uncertain = new Map<string, { cleanup?: Promise<void> }>();
  /** This backend object's part of request names: random, so no two clients' names meet under a lock. */
  readonly #tag = randomBytes(6).toString('hex');
  #nameSeq = 0;
  readonly #names = new Map<string, RequestName>();
  /** Owner → its acquire calls still running here (a caller that timed one out may cancel meanwhile). */
  readonly #running = new Map<string, number>();
  /** Lock key → names whose keys are known deleted there, ready for the next request on that lock. */
  readonly #freeNames = new Map<string, string[]>();
  #freeCount = 0;
  #sweptAt = 0;
  readonly #timers = new Set<ReturnType<typeof setTimeout>>();
  readonly #cancels = new Map<ReturnType<typeof setTimeout>, () => void>();
  #closed = false;

  constructor(client: EtcdClient, closeClient: (() => void) | undefined, prefix: string, timeoutMs: number, minTtlMs: number, lingerMs: number) {
    this.#client = client;
    this.#lockWatches = new LockWatches(client, timeoutMs, lingerMs);
    this.#closeClient = closeClient;
    this.#prefix = prefix;
    this.#timeoutMs = timeoutMs;
    this.capabilities = Object.freeze({ fair: true, minTtlMs });
    this.sessions = {
      open: (ttlMs) => this.#sessionOpen(ttlMs),
      keepAlive: (id) => this.#sessionKeepAlive(id),
      close: (id) => this.#sessionClose(id),
    };
  }

  // ---- acquire -------------------------------------------------------------------------------

  async acquire(req: AcquireRequest): Promise<AcquireResult> {
    this.#ensureOpen();
    this.#running.set(req.owner, (this.#running.get(req.owner) ?? 0) + 1);
    try {
      let result: AcquireResult;
      try {
        result = await this.#acquire(req);
      } catch (error) {
        await this.#dropIfCancelled(req);
        throw error;
      }
      return (await this.#dropIfCancelled(req)) ? { granted: false } : result;
    } finally {
      const left = (this.#running.get(req.owner) ?? 1) - 1;
      if (left > 0) this.#running.set(req.owner, left);
      else this.#running.delete(req.owner);
    }
  }

  /**
   * A call that ends after its caller gave up (cancelWait came while it ran; its transaction may
   * have reached etcd after the cancel's delete, on another HTTP/2 stream): deletes what it wrote
   * under the name, and answers "not granted" (core gives back nothing it does not know of).
   */
  async #dropIfCancelled(req: AcquireRequest): Promise<boolean> {
    const nm = this.#names.get(req.owner);
    if (!nm?.cancelled || nm.key !== req.key) return false;
    const p = this.#pending.get(req.owner);
    this.#pending.delete(req.owner);
    if (p?.lockLease) this.#revokeLater(p.lockLease.id, p.delayLease);
    const layout = new KeyLayout(this.#prefix, req.key);
    const attempt = () => this.#deleteNamed(layout, nm.name);
    const deleted = await attempt().then(() => true, () => (this.#followUp(attempt), false));
    // The last call of the owner has ended: nothing more can be written under the name, which goes
    // back for reuse once deleted (a call that failed with an unknown outcome tainted it).
    if ((this.#running.get(req.owner) ?? 0) <= 1) this.#nameDone(req.owner, deleted);
    return true;
  }

  async #acquire(req: AcquireRequest): Promise<AcquireResult> {
    // The caller is back after a failed call: whatever happens now decides, but first let a
    // clean-up of that call finish (it must not delete what this call finds granted).
    const uncertain = this.#uncertain.get(req.owner);
    if (uncertain) {
      this.#uncertain.delete(req.owner);
      await uncertain.cleanup;
    }
    const now = performance.now();
    this.#forgetStale(now);
    const layout = new KeyLayout(this.#prefix, req.key);
    const nm = this.#nameFor(req);
    const entryKey = layout.entry(req.mode, nm.name);
    let p = this.#pending.get(req.owner);
    if (p && (p.key !== req.key || p.mode !== req.mode)) p = undefined;
    p ??= { key: req.key, mode: req.mode, touchedAt: now };
    p.touchedAt = now;

    try {
      // The lease the request hangs on (as a waiter, then as the holder), and the lease of its lock-delay marker.
      let hold: { id: string; ttlMs: number; own: boolean };
      let delayLease: string | undefined;
      if (req.session !== undefined) {
        hold = { id: req.session, ttlMs: this.#sessionTable.get(req.session)?.ttlMs || req.ttlMs, own: false };
        if (req.lockDelayMs > 0) delayLease = await this.#sessionDelayLease(req.session, req.lockDelayMs);
      } else {
        hold = { ...(await this.#lockLease(p, req)), own: true };
        delayLease = p.delayLease;
      }
      nm.session = req.session;
      nm.ownUntil = hold.own ? performance.now() + hold.ttlMs + this.#timeoutMs : undefined;
      const base = op.getRange(layout.base, rangeEnd(Buffer.from(layout.base)));
      const value = entryValue(req.holder, hold.own, false);
      const grantedValue = entryValue(req.holder, hold.own, true);
      const granted = (token: bigint): AcquireResult => {
        this.#pending.delete(req.owner);
        return { granted: true, token, ttlMs: hold.ttlMs };
      };

      let view: View | undefined;
      for (let round = 0; round < MAX_ROUNDS; round++) {
        if (!view) {
          if (round === 0 && p.view?.entries.some((e) => e.key === entryKey)) {
            // A waiter asking again (woken, or core's periodic check): a linearizable read, no write.
            view = await this.#read(layout);
          } else {
            // One transaction: on a free key, the grant; otherwise (when the caller waits) a place at
            // the end of the queue; and in both failing cases, the key's state.
            const success = [op.put(entryKey, grantedValue, hold.id)];
            if (delayLease !== undefined) success.push(op.put(layout.delay(nm.name), delayValue(req.holder, undefined), delayLease));
            const enqueue: IRequestOp[] = req.queue ? [op.txn([cmp.createdAt(entryKey, 0n)], [op.put(entryKey, value, hold.id)])] : [];
            const r = await this.#txn('acquire', freeKeyGuards(layout, req.mode, entryKey), success, [...enqueue, base]);
            if (r.succeeded) return granted(BigInt(r.header.revision));
            view = parseView(this.#prefix, readKvs(r), BigInt(r.header.revision));
          }
        }
        const own = view.entries.find((e) => e.key === entryKey);
        if (own) {
          // Granted when nothing is ahead of our entry at a linearizable read: nobody can get ahead of
          // it later (later requests have later revisions), so this stays true until we release.
          // Our entry is read in the same step, so a waiter whose lease expired while it waited is
          // not granted (etcd issue 11456).
          if (!grantable(view, own, req.mode)) {
            if (!req.queue) break;
            return await this.#wait(req.owner, p, view, own, req.mode, layout, req.lockDelayMs === 0 ? req.session : undefined);
          }
          // An earlier call of this caller was granted but its answer was lost: its entry hangs on
          // that call's lease, not refreshed since. Put it on this call's lease (a put keeps the
          // create revision, so the token stays) so expiry counts from this request (I5); the old
          // leases go once the move is done.
          const moved = own.lease !== hold.id;
          if (delayLease === undefined && !moved) {
            // Next to lock-delay markers, a grant must be written down: once a marker's holder expires,
            // the place alone no longer tells a holder from a waiter (inspect). Not on the hand-off path.
            if (view.delays.length > 0) {
              void this.#txn('mark grant', [cmp.createdAt(entryKey, own.rev)], [op.put(entryKey, grantedValue, hold.id)], []).catch(() => {});
            }
            return granted(own.rev);
          }
          // Lock-delay: the marker goes in before the grant is reported, while our entry is still there.
          const writes = moved ? [op.put(entryKey, grantedValue, hold.id)] : [];
          if (delayLease !== undefined) writes.push(op.put(layout.delay(nm.name), delayValue(req.holder, own.rev), delayLease));
          const r = await this.#txn(moved ? 'move grant' : 'lock-delay marker', [cmp.createdAt(entryKey, own.rev)], writes, [base]);
          if (r.succeeded) {
            if (moved && own.ownLease) this.#revokeLater(own.lease, view.delays.find((d) => d.encOwner === own.encOwner)?.lease);
            return granted(own.rev);
          }
          view = parseView(this.#prefix, readKvs(r), BigInt(r.header.revision));
          continue;
        }
        if (req.queue) {
          // Our place is gone (its lease expired during a pause, or an operator removed it): a new one at the end.
          view = undefined;
          continue;
        }
        // Not queued (tryAcquire, fair: false), nothing in our way that the first guards did not
        // allow for: shared next to shared holders with lock-delay markers. Guarded grant.
        if (!grantable(view, undefined, req.mode)) break;
        const success = [op.put(entryKey, grantedValue, hold.id)];
        if (delayLease !== undefined) success.push(op.put(layout.delay(nm.name), delayValue(req.holder, undefined), delayLease));
        const r = await this.#txn('acquire', viewGuards(layout, view, req.mode, entryKey), success, [base]);
        if (r.succeeded) return granted(BigInt(r.header.revision));
        view = parseView(this.#prefix, readKvs(r), BigInt(r.header.revision));
      }
      if (!view) view = await this.#read(layout);
      const own = view.entries.find((e) => e.key === entryKey);
      if (req.queue && own) return await this.#wait(req.owner, p, view, own, req.mode, layout, req.lockDelayMs === 0 ? req.session : undefined);
      if (own) {
        // A not-queued request's entry left by an earlier call of this caller whose answer was lost: not ours to keep.
        const attempt = () => this.#deleteNamed(layout, nm.name);
        const deleted = await attempt().then(() => true, () => (this.#followUp(attempt), false));
        this.#nameDone(req.owner, deleted);
      } else {
        // Nothing of ours under the name at this read (a refusal writes nothing; an earlier call that
        // may have written would have tainted it).
        this.#nameDone(req.owner, !view.delays.some((d) => d.encOwner === encodePart(nm.name)));
      }
      return await this.#refuse(req.owner, p, view, layout);
    } catch (error) {
      if (isLeaseNotFound(error)) {
        // The session (or its lock-delay lease) is gone: core ends the session and opens a new one.
        if (req.session !== undefined) return { granted: false, sessionLost: true };
        // Our own lock lease vanished between its refresh and the transaction: start over next call.
        p.lockLease = undefined;
        p.view = undefined;
      }
      // A lease granted in this call for a request that is not queued would be nobody's.
      if (p.lockLease && this.#pending.get(req.owner) !== p) {
        this.#revokeLater(p.lockLease.id, p.delayLease);
        p.lockLease = undefined;
      }
      const mapped = mapError('acquire', error);
      if (mapped.retryable) {
        nm.tainted = true;
        this.#abandonLater(req);
      }
      throw mapped;
    }
  }

  async #read(layout: KeyLayout): Promise<View> {
    const r = await this.#client.kv.range({ key: Buffer.from(layout.base), range_end: rangeEnd(Buffer.from(layout.base)) }, deadline(this.#timeoutMs));
    return parseView(this.#prefix, r.kvs, BigInt(r.header.revision));
  }

  /** No session: the lock's own lease, granted on the first call and refreshed on every later one (I5: after the request was sent). */
  async #lockLease(p: Pending, req: AcquireRequest): Promise<{ id: string; ttlMs: number }> {
    if (p.lockLease) {
      const ids = p.delayLease !== undefined ? [p.delayLease, p.lockLease.id] : [p.lockLease.id];
      const ttls = await keepAliveOnce(this.#client, ids, this.#timeoutMs);
      const lockTtl = ttls.get(p.lockLease.id) ?? 0;
      const delayTtl = p.delayLease !== undefined ? (ttls.get(p.delayLease) ?? 0) : 1;
      if (lockTtl > 0 && delayTtl > 0) return p.lockLease;
      // Gone (the process paused past its ttl, or an operator revoked it): the queue place went with it.
      this.#revokeLater(p.lockLease.id, p.delayLease);
      p.lockLease = undefined;
      p.delayLease = undefined;
      p.view = undefined;
    }
    const ttlS = Math.ceil(req.ttlMs / 1000);
    const [lock, delay] = await Promise.all([
      this.#client.leaseClient.leaseGrant({ TTL: ttlS }, deadline(this.#timeoutMs)),
      req.lockDelayMs > 0
        ? this.#client.leaseClient.leaseGrant({ TTL: ttlS + Math.ceil(req.lockDelayMs / 1000) + DELAY_MARGIN_S }, deadline(this.#timeoutMs))
        : undefined,
    ]);
    p.lockLease = { id: String(lock.ID), ttlMs: Number(lock.TTL) * 1000 };
    p.delayLease = delay ? String(delay.ID) : undefined;
    return p.lockLease;
  }

  /** Busy, and the caller does not queue (tryAcquire, fair: false): nothing of ours stays behind. */
  async #refuse(owner: string, p: Pending, view: View, layout: KeyLayout): Promise<AcquireResult> {
    this.#pending.delete(owner);
    if (p.lockLease) this.#revokeLater(p.lockLease.id, p.delayLease);
    // Without a place in the queue there is no predecessor: any deletion under the key may free it.
    return this.#busy(view, undefined, 'exclusive', { keys: [], prefix: layout.base, afterRevision: view.revision });
  }

  /** Busy, queued: remember the view for the next call and point this waiter's watch at what it waits for. */
  async #wait(owner: string, p: Pending, view: View, own: Entry, mode: LockMode, layout: KeyLayout, session: string | undefined): Promise<AcquireResult> {
    p.view = view;
    this.#pending.set(owner, p);
    const target = watchTarget(this.#prefix, view, own, mode, layout, session);
    void this.#wakes.get(owner)?.target(target).catch(() => {});
    return this.#busy(view, own, mode, { ...target, owner });
  }

  async #busy(view: View, own: Entry | undefined, mode: LockMode, cursor: Cursor): Promise<AcquireResult> {
    const holder = holders(view)[0]?.holder ?? orphans(view)[0]?.holder;
    let retryInMs: number | undefined;
    const delays = orphans(view);
    if (ahead(view, own, mode).length === 0 && delays.length > 0) {
      // Blocked only by lock-delay: it ends when the last marker's lease expires.
      const ttls = await Promise.all(delays.map((d) => this.#remainingMs(d.lease)));
      retryInMs = Math.max(0, ...ttls);
    }
    const result: { granted: false; holder?: string; retryInMs?: number; cursor: Cursor } = { granted: false, cursor };
    if (holder !== undefined) result.holder = holder;
    if (retryInMs !== undefined) result.retryInMs = retryInMs;
    return result;
  }

  // ---- renew, release, cancel ------------------------------------------------------------------

  async renew(req: RenewRequest): Promise<RenewResult> {
    this.#ensureOpen();
    const layout = new KeyLayout(this.#prefix, req.key);
    const nm = this.#names.get(req.owner);
    const name = this.#nameOf(req.key, req.owner);
    const entryKey = layout.entry(req.mode, name);
    try {
      const r = await this.#txn('renew', [], [op.get(entryKey), op.get(layout.delay(name))], []);
      const kvs = readKvs(r);
      const entry = kvs.find((kv) => kv.key.toString('utf8') === entryKey);
      const value = entry ? parseJson(entry) : {};
      // The token is the entry's create revision: only the grant that was told it can name it.
      if (!entry || BigInt(entry.create_revision) !== req.token) return { renewed: false };
      if (value.o !== 1) {
        // A lease of a session: renewing it is the session's keep-alive (with its lock-delay leases).
        return (await this.#sessionKeepAlive(entry.lease)) ? { renewed: true, ttlMs: this.#sessionTable.get(entry.lease)?.ttlMs || req.ttlMs } : { renewed: false };
      }
      const marker = kvs.find((kv) => kv.key.toString('utf8') !== entryKey);
      // The delay lease first, then the lock's: the marker then outlives the entry by its full delay (see the class comment).
      const ids = marker ? [marker.lease, entry.lease] : [entry.lease];
      const ttls = await keepAliveOnce(this.#client, ids, this.#timeoutMs);
      const ttl = ttls.get(entry.lease) ?? 0;
      if (ttl <= 0 || (marker && (ttls.get(marker.lease) ?? 0) <= 0)) return { renewed: false };
      if (nm) nm.ownUntil = performance.now() + ttl * 1000 + this.#timeoutMs;
      return { renewed: true, ttlMs: ttl * 1000 };
    } catch (error) {
      throw mapError('renew', error);
    }
  }

  async release(req: ReleaseRequest): Promise<void> {
    this.#ensureOpen();
    if (req.token < 1n) return;
    const layout = new KeyLayout(this.#prefix, req.key);
    const name = this.#nameOf(req.key, req.owner);
    const entryKey = layout.entry(req.mode, name);
    this.#pending.delete(req.owner);
    // Only the holder's own entry, at its token (I4); its lock-delay marker goes in the same step (no delay after a release).
    let released = false;
    const attempt = async (): Promise<void> => {
      const r = await this.#txn('release', [cmp.createdAt(entryKey, req.token)], [op.del(entryKey), op.del(layout.delay(name))], []);
      if (!r.succeeded) return;
      released = true;
      const [entry, marker] = deletedKvs(r);
      if (entry && parseJson(entry).o === 1) this.#revokeLater(entry.lease, marker?.lease);
    };
    try {
      await attempt();
      // Both keys of the name are gone when this release deleted them. A release that found nothing
      // at its token keeps the name as it is: the token may be wrong while the owner still holds, or
      // the grant ended without release and its lock-delay marker may still run under the name (a
      // session's end, or the sweep of leases of their own, retires it then).
      if (released) this.#nameDone(req.owner, true);
    } catch (error) {
      const nm = this.#names.get(req.owner);
      if (nm) nm.tainted = true;
      const mapped = mapError('release', error);
      // An entry on a session lease would outlive this failure as long as the session lives: keep trying.
      if (mapped.retryable) this.#followUp(attempt);
      throw mapped;
    }
  }

  async cancelWait({ key, owner }: { key: string; owner: string }): Promise<void> {
    if (this.#closed) return;
    const p = this.#pending.get(owner);
    this.#pending.delete(owner);
    if (p?.lockLease) this.#revokeLater(p.lockLease.id, p.delayLease);
    const layout = new KeyLayout(this.#prefix, key);
    const name = this.#nameOf(key, owner);
    // A call of this owner still running may write under the name after this delete: it deletes
    // again when it ends (#dropIfCancelled), and only then is the name done with.
    const running = (this.#running.get(owner) ?? 0) > 0;
    const nm = this.#names.get(owner);
    if (running && nm && nm.key === key) nm.cancelled = true;
    const attempt = () => this.#deleteNamed(layout, name);
    try {
      await attempt();
      if (!running) this.#nameDone(owner, true);
    } catch (error) {
      if (!running) this.#nameDone(owner, false);
      const mapped = mapError('cancel wait', error);
      // A grant that landed after the caller gave up may sit on its session lease: keep trying.
      if (mapped.retryable) this.#followUp(attempt);
      throw mapped;
    }
  }

  /** Deletes every key of one request (either mode, and its lock-delay marker): the keys under its name are its alone. */
  async #deleteNamed(layout: KeyLayout, name: string): Promise<void> {
    await this.#txn('delete request', [], [op.del(layout.entry('exclusive', name)), op.del(layout.entry('shared', name)), op.del(layout.delay(name))], []);
  }

  // ---- request names ---------------------------------------------------------------------------

  /**
   * The name of `req`'s keys: the owner's name if it has one, else a name given back on this lock
   * (its keys known deleted), else a new one. Owners are new for every acquire call, and naming
   * keys after them would leave etcd one more key under the lock for every request ever made: etcd
   * keeps a deleted key in its index until the next compaction, and every transaction that ranges
   * over the lock (the guards of a grant, a waiter's read) walks all of them. Measured without
   * compaction, one lock slowed from 900 to 265 acquire+release pairs/s after 23,000 grants. With
   * names reused, the keys under a lock stay as many as the requests of each client that were ever
   * in flight at once. A name is used again only once the transaction that deleted both its keys
   * has answered, and never after a call under it may have written without our knowing (a timeout,
   * a lost answer) or after a grant may have expired with a lock-delay marker still running: such
   * names are retired, and the next request gets a new one.
   */
  #nameFor(req: AcquireRequest): RequestName {
    const existing = this.#names.get(req.owner);
    if (existing && existing.key === req.key) return existing;
    if (existing) this.#nameDone(req.owner, false);
    const free = this.#freeNames.get(req.key);
    let name = free?.pop();
    if (name !== undefined) {
      this.#freeCount--;
      if (free!.length === 0) this.#freeNames.delete(req.key);
    } else name = `${this.#tag}.${(++this.#nameSeq).toString(36)}`;
    const nm: RequestName = { key: req.key, name, session: req.session, ownUntil: undefined, tainted: false };
    this.#names.set(req.owner, nm);
    return nm;
  }

  /** The name an owner's keys carry; for an owner this backend does not know, one under which nothing exists. */
  #nameOf(key: string, owner: string): string {
    const nm = this.#names.get(owner);
    return nm && nm.key === key ? nm.name : `${this.#tag}-${encodePart(owner)}`;
  }

  /** The owner is done with its name: given back for reuse when its keys are known deleted, else retired. */
  #nameDone(owner: string, deleted: boolean): void {
    const nm = this.#names.get(owner);
    if (!nm) return;
    this.#names.delete(owner);
    if (!deleted || nm.tainted || this.#closed) return;
    let free = this.#freeNames.get(nm.key);
    if (free) this.#freeNames.delete(nm.key); // re-inserted last: the lock used most recently
    else free = [];
    free.push(nm.name);
    this.#freeNames.set(nm.key, free);
    this.#freeCount++;
    while (this.#freeCount > MAX_FREE_NAMES) {
      const [oldest, names] = this.#freeNames.entries().next().value as [string, string[]];
      this.#freeNames.delete(oldest);
      this.#freeCount -= names.length;
    }
  }

  /** Retires the names bound to a session that ended (its entries went with its lease; lock-delay markers may stay). */
  #retireSession(session: string): void {
    for (const [owner, nm] of this.#names) if (nm.session === session) this.#nameDone(owner, false);
  }

  /**
   * An acquire call failed after its transaction may have committed (a grant, or a place in the
   * queue). If the caller gave up (a tryAcquire does at once; a waiter whose first call failed
   * never gets to cancel), that entry would sit on the session's lease, owned by nobody, for as
   * long as the session lives, and block the key. Core asks again within about a second when it
   * still wants the key; if it has not after ABANDONED_AFTER_MS, delete the request's keys. A call
   * that comes back later waits for this clean-up and then starts over.
   */
  #abandonLater(req: AcquireRequest): void {
    const mark: { cleanup?: Promise<void> } = {};
    this.#uncertain.set(req.owner, mark);
    this.#later(ABANDONED_AFTER_MS, () => {
      if (this.#uncertain.get(req.owner) !== mark) return; // the caller came back
      const p = this.#pending.get(req.owner);
      this.#pending.delete(req.owner);
      if (p?.lockLease) this.#revokeLater(p.lockLease.id, p.delayLease);
      const layout = new KeyLayout(this.#prefix, req.key);
      const name = this.#nameOf(req.key, req.owner);
      mark.cleanup = this.#untilDone(() => this.#deleteNamed(layout, name)).finally(() => {
        if (this.#uncertain.get(req.owner) === mark) this.#uncertain.delete(req.owner);
        this.#nameDone(req.owner, false);
      });
    });
  }

  /** Runs an idempotent write again in the background until it succeeds (see FOLLOW_UP_LIMIT_MS). */
  #followUp(attempt: () => Promise<void>): void {
    void this.#untilDone(attempt, 100);
  }

  /** Tries `attempt` (now, or after `firstDelayMs`) and again with backoff while it fails with a retryable error. Never rejects. */
  #untilDone(attempt: () => Promise<void>, firstDelayMs = 0): Promise<void> {
    const started = performance.now();
    return new Promise<void>((resolve) => {
      const run = async (delay: number): Promise<void> => {
        if (this.#closed) return resolve();
        try {
          await attempt();
          resolve();
        } catch (error) {
          if (!mapError('follow-up', error).retryable || performance.now() - started > FOLLOW_UP_LIMIT_MS) return resolve();
          this.#later(delay, () => void run(Math.min(Math.max(delay, 50) * 2, 2_000)), resolve);
        }
      };
      if (firstDelayMs > 0) this.#later(firstDelayMs, () => void run(firstDelayMs), resolve);
      else void run(100);
    });
  }

  /** An unref'd timer that `close()` cancels (calling `onCancel`). */
  #later(ms: number, fn: () => void, onCancel?: () => void): void {
    if (this.#closed) {
      onCancel?.();
      return;
    }
    const timer = setTimeout(() => {
      this.#timers.delete(timer);
      this.#cancels.delete(timer);
      fn();
    }, ms);
    timer.unref();
    this.#timers.add(timer);
    if (onCancel) this.#cancels.set(timer, onCancel);
  }

  // ---- wake-ups --------------------------------------------------------------------------------

  async subscribe(key: string, onChange: (handOff?: HandOff) => void, cursor?: unknown): Promise<() => void> {
    this.#ensureOpen();
    const c = isCursor(cursor) ? cursor : undefined;
    const wake = new Wake(this.#client, onChange, this.#timeoutMs, this.#lockWatches);
    if (c?.owner !== undefined) {
      this.#wakes.get(c.owner)?.close();
      this.#wakes.set(c.owner, wake);
    }
    // Without a cursor, watch every deletion under the key from now on (core re-checks right after).
    await wake.target(c ?? { keys: [], prefix: new KeyLayout(this.#prefix, key).base });
    return () => {
      wake.close();
      if (c?.owner !== undefined && this.#wakes.get(c.owner) === wake) this.#wakes.delete(c.owner);
    };
  }

  // ---- inspect ---------------------------------------------------------------------------------

  async inspect(prefix: string): Promise<KeyState[]> {
    this.#ensureOpen();
    const start = `${this.#prefix}${encodePart(prefix)}`;
    try {
      const r = await this.#client.kv.range({ key: Buffer.from(start), range_end: rangeEnd(Buffer.from(start)) }, deadline(this.#timeoutMs));
      const groups = new Map<string, IKeyValue[]>();
      for (const kv of r.kvs) {
        const parsed = parseKey(this.#prefix, kv.key.toString('utf8'));
        if (!parsed) continue;
        let list = groups.get(parsed.encKey);
        if (!list) groups.set(parsed.encKey, (list = []));
        list.push(kv);
      }
      const revision = BigInt(r.header.revision);
      const views = [...groups].map(([encKey, kvs]) => ({ key: decodePart(encKey), view: parseView(this.#prefix, kvs, revision) }));
      const leases = new Set<string>();
      for (const { view } of views) {
        for (const e of holders(view)) leases.add(e.lease);
        for (const d of orphans(view)) leases.add(d.lease);
      }
      const remaining = new Map(await Promise.all([...leases].map(async (id) => [id, await this.#remainingMs(id)] as const)));
      const out: KeyState[] = [];
      for (const { key, view } of views) {
        const held = holders(view);
        const holderStates: HolderState[] = held.map((e) => ({ mode: e.mode, token: e.rev, holder: e.holder, expiresInMs: remaining.get(e.lease) ?? 0 }));
        const delays = orphans(view);
        const delayMs = Math.max(0, ...delays.map((d) => remaining.get(d.lease) ?? 0));
        const waiters = view.entries.length - held.length;
        if (held.length === 0 && waiters === 0 && delayMs === 0) continue;
        let lastToken = 0n;
        for (const h of holderStates) if (h.token > lastToken) lastToken = h.token;
        for (const d of delays) if (d.token > lastToken) lastToken = d.token;
        out.push({ key, lastToken, holders: holderStates, waiters, lockDelayRemainingMs: delayMs });
      }
      return out.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
    } catch (error) {
      throw mapError('inspect', error);
    }
  }

  // ---- sessions --------------------------------------------------------------------------------

  async #sessionOpen(ttlMs: number): Promise<{ id: string; ttlMs: number }> {
    this.#ensureOpen();
    try {
      const r = await this.#client.leaseClient.leaseGrant({ TTL: Math.ceil(ttlMs / 1000) }, deadline(this.#timeoutMs));
      const id = String(r.ID);
      const effective = Number(r.TTL) * 1000; // etcd raises a ttl below its minimum
      this.#sessionTable.set(id, { ttlMs: effective, delays: new Map(), usedAt: performance.now() });
      return { id, ttlMs: effective };
    } catch (error) {
      throw mapError('open session', error);
    }
  }

  /**
   * One LeaseKeepAlive stream: the session's lock-delay leases first, then the session's lease, so
   * a delay lease is never refreshed earlier than its session (its marker outlives the session's
   * entries by at least lockDelayMs). False when the session's lease is gone, or when a delay lease
   * is (revoked by someone: the lock-delay of this session's locks could no longer be kept).
   */
  async #sessionKeepAlive(id: string): Promise<boolean> {
    this.#ensureOpen();
    const s = this.#sessionTable.get(id);
    if (s) s.usedAt = performance.now();
    try {
      const delayIds = s ? (await Promise.allSettled(s.delays.values())).flatMap((r) => (r.status === 'fulfilled' ? [r.value] : [])) : [];
      const ttls = await keepAliveOnce(this.#client, [...delayIds, id], this.#timeoutMs);
      if ((ttls.get(id) ?? 0) <= 0 || delayIds.some((d) => (ttls.get(d) ?? 0) <= 0)) {
        // Gone: its delay leases are left to expire (that is the lock-delay of an expiry).
        this.#sessionTable.delete(id);
        this.#retireSession(id);
        return false;
      }
      return true;
    } catch (error) {
      if (isLeaseNotFound(error)) {
        this.#retireSession(id);
        return false;
      }
      throw mapError('session keep-alive', error);
    }
  }

  /** Revokes the session's lease and its lock-delay leases: its locks are freed at once, without lock-delay (closed on purpose). */
  async #sessionClose(id: string): Promise<void> {
    this.#ensureOpen();
    const s = this.#sessionTable.get(id);
    this.#sessionTable.delete(id);
    this.#retireSession(id);
    const delays = s ? (await Promise.allSettled(s.delays.values())).flatMap((r) => (r.status === 'fulfilled' ? [r.value] : [])) : [];
    try {
      await Promise.all([id, ...delays].map((lease) => revoke(this.#client, lease, this.#timeoutMs)));
    } catch (error) {
      throw mapError('close session', error);
    }
  }

  /** The lease of lock-delay markers of `session`'s locks with `lockDelayMs`: ttl = session ttl + delay + 1 s. */
  #sessionDelayLease(session: string, lockDelayMs: number): Promise<string> {
    let s = this.#sessionTable.get(session);
    if (!s) this.#sessionTable.set(session, (s = { ttlMs: 0, delays: new Map(), usedAt: performance.now() }));
    s.usedAt = performance.now();
    const record = s;
    let lease = record.delays.get(lockDelayMs);
    if (!lease) {
      lease = (async () => {
        if (record.ttlMs <= 0) {
          const info = await this.#client.leaseClient.leaseTimeToLive({ ID: session }, deadline(this.#timeoutMs));
          if (!(Number(info.TTL) > 0)) throw new EtcdLeaseInvalidError(session); // the session is gone
          record.ttlMs = Number(info.grantedTTL) * 1000;
        }
        const sessionTtlS = record.ttlMs / 1000;
        const r = await this.#client.leaseClient.leaseGrant({ TTL: sessionTtlS + Math.ceil(lockDelayMs / 1000) + DELAY_MARGIN_S }, deadline(this.#timeoutMs));
        return String(r.ID);
      })();
      record.delays.set(lockDelayMs, lease);
      lease.catch(() => {
        if (record.delays.get(lockDelayMs) === lease) record.delays.delete(lockDelayMs);
      });
    }
    return lease;
  }

  // ---- plumbing --------------------------------------------------------------------------------

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    for (const timer of this.#timers) clearTimeout(timer);
    this.#timers.clear();
    for (const cancel of this.#cancels.values()) cancel();
    this.#cancels.clear();
    for (const wake of this.#wakes.values()) wake.close();
    this.#wakes.clear();
    this.#lockWatches.close();
    const leases: string[] = [];
    for (const p of this.#pending.values()) {
      if (p.lockLease) leases.push(p.lockLease.id);
      if (p.delayLease) leases.push(p.delayLease);
    }
    this.#pending.clear();
    this.#names.clear();
    this.#freeNames.clear();
    this.#freeCount = 0;
    await Promise.allSettled(leases.map((id) => revoke(this.#client, id, this.#timeoutMs)));
    this.#closeClient?.();
  }

  async #txn(what: string, compare: ICompare[], success: IRequestOp[], failure: IRequestOp[]) {
    try {
      return await this.#client.kv.txn({ compare, success, failure }, deadline(this.#timeoutMs));
    } catch (error) {
      if (isLeaseNotFound(error)) throw error; // callers tell a lost session from an outage
      throw mapError(what, error);
    }
  }

  /** Milliseconds left of a lease (0 when gone), by the leader's lease clock, in whole seconds. */
  async #remainingMs(id: string): Promise<number> {
    const r = await this.#client.leaseClient.leaseTimeToLive({ ID: id }, deadline(this.#timeoutMs));
    return Math.max(0, Number(r.TTL)) * 1000;
  }

  /** Revokes leases nobody needs any more, in the background (they expire on their own if this fails). */
  #revokeLater(...ids: (string | undefined)[]): void {
    for (const id of ids) if (id !== undefined && id !== '0') void revoke(this.#client, id, this.#timeoutMs).catch(() => {});
  }

  #forgetStale(now: number): void {
    for (const [id, s] of this.#sessionTable) {
      // Not kept alive for several ttls: core gave it up (its delay leases expire on their own, as they should).
      if (now - s.usedAt > Math.max(3 * s.ttlMs, PENDING_FORGET_MS)) {
        this.#sessionTable.delete(id);
        this.#retireSession(id);
      }
    }
    for (const [owner, p] of this.#pending) {
      if (now - p.touchedAt < PENDING_FORGET_MS) continue;
      this.#pending.delete(owner);
      this.#nameDone(owner, false);
      if (p.lockLease) this.#revokeLater(p.lockLease.id, p.delayLease);
    }
    // A lease of its own that nobody released (lost, or left to expire) is certainly over by its ownUntil.
    if (now - this.#sweptAt < NAME_SWEEP_MS) return;
    this.#sweptAt = now;
    for (const [owner, nm] of this.#names) {
      if (nm.ownUntil !== undefined && nm.ownUntil < now && !this.#pending.has(owner)) this.#nameDone(owner, false);
    }
  }

  #ensureOpen(): void {
    if (this.#closed) throw new InvalidArgumentError('backend', 'this etcd backend was closed');
  }
}

// ---- the queue, as pure functions of a view ------------------------------------------------------

function parseView(prefix: string, kvs: readonly IKeyValue[], revision: bigint): View {
  const entries: Entry[] = [];
  const delays: DelayMark[] = [];
  for (const kv of kvs) {
    const key = kv.key.toString('utf8');
    const parsed = parseKey(prefix, key);
    if (!parsed) continue;
    const v = parseJson(kv);
    const holder = typeof v.h === 'string' ? v.h : '';
    if (parsed.kind === 'entry') {
      entries.push({ key, encOwner: parsed.encOwner, mode: parsed.mode, rev: BigInt(kv.create_revision), lease: String(kv.lease), granted: v.g === 1, holder, ownLease: v.o === 1 });
    } else {
      const token = typeof v.t === 'string' && /^[0-9]+$/.test(v.t) ? BigInt(v.t) : BigInt(kv.create_revision);
      delays.push({ key, encOwner: parsed.encOwner, lease: String(kv.lease), holder, token });
    }
  }
  entries.sort((a, b) => (a.rev < b.rev ? -1 : a.rev > b.rev ? 1 : 0));
  return { revision, entries, delays };
}

/** Lock-delay markers whose holder's entry is gone: the holder expired without releasing. */
function orphans(view: View): DelayMark[] {
  const owners = new Set(view.entries.map((e) => e.encOwner));
  return view.delays.filter((d) => !owners.has(d.encOwner));
}

/** Markers of holders that still hold. */
function liveDelays(view: View): DelayMark[] {
  const owners = new Set(view.entries.map((e) => e.encOwner));
  return view.delays.filter((d) => owners.has(d.encOwner));
}

/** The requests a request of `mode` must wait for: everyone ahead (exclusive), or every exclusive ahead (shared). */
function ahead(view: View, own: Entry | undefined, mode: LockMode): Entry[] {
  return view.entries.filter((e) => (own === undefined || e.rev < own.rev) && e.key !== own?.key && (mode === 'exclusive' || e.mode === 'exclusive'));
}

function grantable(view: View, own: Entry | undefined, mode: LockMode): boolean {
  if (ahead(view, own, mode).length > 0 || orphans(view).length > 0) return false;
  // Without an entry, a shared grant guards every marker's holder in its transaction (viewGuards).
  return own !== undefined || mode === 'exclusive' || liveDelays(view).length <= MAX_DELAY_GUARDS;
}

/**
 * The guards of the first transaction of a request: our entry does not exist yet, nobody is queued
 * that we would have to wait for (everyone, or every exclusive request for a shared one), and no
 * lock-delay marker exists (of an expired holder, or of a live one: a shared request next to shared
 * holders with markers takes the slower `viewGuards` path).
 */
function freeKeyGuards(layout: KeyLayout, mode: LockMode, entryKey: string): ICompare[] {
  const end = (k: string): Buffer => rangeEnd(Buffer.from(k));
  const queue = mode === 'exclusive' ? layout.queue : layout.exclusive;
  return [cmp.createdAt(entryKey, 0n), cmp.createdAt(queue, 0n, end(queue)), cmp.createdAt(layout.delays, 0n, end(layout.delays))];
}

/**
 * Guards of a grant without a place in the queue, decided on `view`: what made it grantable still
 * holds. For a shared request: no exclusive request, no lock-delay marker written since the view,
 * and the holder of every marker still there (so none became an expired holder's delay).
 */
function viewGuards(layout: KeyLayout, view: View, mode: LockMode, entryKey: string): ICompare[] {
  if (mode === 'exclusive') return freeKeyGuards(layout, mode, entryKey);
  const end = (k: string): Buffer => rangeEnd(Buffer.from(k));
  const guards = [cmp.createdAt(entryKey, 0n), cmp.createdAt(layout.exclusive, 0n, end(layout.exclusive)), cmp.modifiedBy(layout.delays, view.revision, end(layout.delays))];
  for (const d of liveDelays(view)) {
    const holder = view.entries.find((e) => e.encOwner === d.encOwner)!;
    guards.push(cmp.createdAt(holder.key, holder.rev));
  }
  return guards;
}

/**
 * Who holds the key in `view`: entries written as granted, entries with their own lock-delay
 * marker (written at the grant), and, when no expired holder's marker is in the way, every entry
 * with nothing ahead of it (granted, or about to learn it on its next look).
 */
function holders(view: View): Entry[] {
  const marked = new Set(view.delays.map((d) => d.encOwner));
  const free = orphans(view).length === 0;
  return view.entries.filter((e) => e.granted || marked.has(e.encOwner) || (free && ahead(view, e, e.mode).length === 0));
}

/**
 * What a queued waiter watches. Blocked by requests ahead of it: every change under the lock from
 * the revision it read (see `follower`), so it knows it holds the key the moment its turn comes,
 * without a read; only that waiter then acts (every waiter receives the lock's changes, but a
 * release sets off one request at most, never a herd). Blocked by an expired holder's lock-delay
 * markers: their deletion.
 */
function watchTarget(prefix: string, view: View, own: Entry, mode: LockMode, layout: KeyLayout, session: string | undefined): WatchTarget {
  const blockers = ahead(view, own, mode);
  const last = blockers[blockers.length - 1];
  if (last && orphans(view).length === 0) {
    return { keys: [last.key], revisions: [last.rev.toString()], afterRevision: view.revision, follow: follower(prefix, view, own, mode, layout, session) };
  }
  if (last) return { keys: [last.key], revisions: [last.rev.toString()], afterRevision: view.revision };
  const delays = orphans(view);
  if (delays.length > 0) return { keys: delays.map((d) => d.key), afterRevision: view.revision };
  // Only too many shared lock-delay holders (MAX_DELAY_GUARDS): any deletion under the key may help.
  return { keys: [], prefix: layout.base, afterRevision: view.revision };
}

/**
 * The next waiter's view, kept exact by a watch of every change under the lock after `view`'s
 * revision (see `Follow`). When a change frees the key for it, it holds the key by the same rule a
 * read would apply at that revision — nothing ahead of its entry, no expired holder's marker, its
 * entry still there (etcd issue 11456) — and nothing written later can get ahead of it. It is then
 * handed the grant (token: its entry's create revision) without a read, when its entry hangs on
 * `session` (a session-bound request without lock-delay: nothing more to write before the grant)
 * and no lock-delay marker is around (the grant would have to be written down, see `acquire`).
 * Anything else that changes what it waits for wakes it to ask.
 */
function follower(prefix: string, view: View, own: Entry, mode: LockMode, layout: KeyLayout, session: string | undefined): Follow {
  let entries = new Map(view.entries.map((e) => [e.key, e]));
  let delays = new Map(view.delays.map((d) => [d.key, d]));
  let done = false;
  const decide = (): HandOff | 'wake' | undefined => {
    const now: View = { revision: 0n, entries: [...entries.values()].sort((a, b) => (a.rev < b.rev ? -1 : a.rev > b.rev ? 1 : 0)), delays: [...delays.values()] };
    const mine = now.entries.find((e) => e.key === own.key);
    // Still behind other requests, and nothing else in the way: keep following, say nothing.
    if (mine && ahead(now, mine, mode).length > 0 && orphans(now).length === 0) return undefined;
    done = true;
    if (mine && session !== undefined && mine.lease === session && now.delays.length === 0 && grantable(now, mine, mode)) return { token: mine.rev, session };
    return 'wake';
  };
  return {
    id: own.key,
    prefix: layout.base,
    from: view.revision,
    apply(events) {
      if (done) return undefined;
      let changed = false;
      for (const ev of events) {
        const key = ev.kv.key.toString('utf8');
        if (!key.startsWith(layout.base)) continue;
        if (ev.type === 'Delete') {
          const e = entries.get(key);
          if ((e && e.rev <= own.rev) || delays.has(key)) changed = true;
          entries.delete(key);
          delays.delete(key);
          continue;
        }
        const parsed = parseView(prefix, [ev.kv], 0n);
        for (const e of parsed.entries) {
          if (e.rev <= own.rev) changed = true;
          entries.set(e.key, e);
        }
        for (const d of parsed.delays) {
          changed = true;
          delays.set(d.key, d);
        }
      }
      return changed ? decide() : undefined;
    },
    restart(kvs) {
      if (done) return undefined;
      const fresh = parseView(prefix, kvs, 0n);
      entries = new Map(fresh.entries.map((e) => [e.key, e]));
      delays = new Map(fresh.delays.map((d) => [d.key, d]));
      return decide();
    },
  };
}

function isCursor(value: unknown): value is Cursor {
  if (typeof value !== 'object' || value === null) return false;
  const c = value as Cursor;
  return Array.isArray(c.keys) && (c.afterRevision === undefined || typeof c.afterRevision === 'bigint');
}

function checkPrefixOption(value: unknown): string {
  if (typeof value !== 'string' || value.length === 0 || value.includes('\0') || !value.isWellFormed()) {
    throw new InvalidArgumentError('prefix', `expected a non-empty string, got ${describe(value)}`);
  }
  return value;
}

/**
 * Checks `hosts` now, so that a configuration error is an InvalidArgumentError at once instead of a
 * retryable BackendUnavailableError on every call, and returns each host in the one form etcd3
 * (grpc) can dial: `http://HOST:PORT` or `https://HOST:PORT`. A trailing slash is dropped and the
 * scheme and host are lower-cased; a path, query, fragment, user or password, a missing or bad port
 * (grpc would dial 443 for `http://host`) and an empty host are refused, naming the element.
 */
function checkHosts(value: unknown): string[] {
  const example = 'like http://127.0.0.1:2379';
  if (typeof value === 'string') return [checkHost(value, 'hosts')];
  if (!Array.isArray(value)) throw new InvalidArgumentError('hosts', `expected an etcd client URL or an array of them, ${example}, got ${describe(value)}`);
  if (value.length === 0) throw new InvalidArgumentError('hosts', `expected at least one etcd client URL, ${example}, got an empty array`);
  return (value as unknown[]).map((h, i) => checkHost(h, `hosts[${i}]`));
}

function checkHost(h: unknown, where: string): string {
  const bad = (problem: string): InvalidArgumentError => new InvalidArgumentError('hosts', `${where} ${problem}`);
  if (typeof h !== 'string') throw bad(`must be an etcd client URL string like http://127.0.0.1:2379, got ${describe(h)}`);
  const shown = JSON.stringify(h.length > 100 ? `${h.slice(0, 100)}…` : h);
  const scheme = /^([a-z][a-z0-9+.-]*):\/\//i.exec(h)?.[1]?.toLowerCase();
  if (scheme === undefined) throw bad(`= ${shown} has no scheme: write it as a URL, like http://127.0.0.1:2379 (or https://…)`);
  if (scheme !== 'http' && scheme !== 'https') throw bad(`= ${shown}: the scheme must be http:// or https://, not ${scheme}://`);
  // WHATWG URL forgives what grpc does not (tabs and newlines dropped, "\\" read as "/", extra
  // slashes skipped, a default port dropped), so the text itself is checked first.
  if (/[\s\x00-\x1f\x7f]/.test(h)) throw bad(`= ${shown} contains whitespace or control characters`);
  const authority = h.slice(scheme.length + 3).split(/[/?#\\]/, 1)[0]!;
  const rest = h.slice(scheme.length + 3 + authority.length);
  if (authority === '' || authority.startsWith(':')) throw bad(`= ${shown} has no host`);
  if (rest !== '' && rest !== '/') throw bad(`= ${shown} has a path, query or fragment (${JSON.stringify(rest)}): an etcd client URL is scheme://host:port`);
  const port = /:(\d+)$/.exec(authority)?.[1];
  if (port !== undefined && (Number(port) < 1 || Number(port) > 65_535)) throw bad(`= ${shown}: the port must be from 1 to 65535, got ${port}`);
  let url: URL;
  try {
    url = new URL(h);
  } catch {
    throw bad(`= ${shown} is not a valid URL (a host, and a port from 1 to 65535)`);
  }
  if (url.username !== '' || url.password !== '' || authority.includes('@')) {
    throw bad(`= ${shown} has a user or password: etcd credentials do not go in the URL (pass a configured Etcd3 as client)`);
  }
  if (port === undefined) throw bad(`= ${shown} has no port: etcd listens on 2379 by default, e.g. ${scheme}://${url.hostname}:2379`);
  return `${scheme}://${url.hostname}:${Number(port)}`;
}


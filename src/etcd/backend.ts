/**
 * The etcd backend: acquire (the queue's transactions), renew, release, cancelWait, inspect and the
 * wake-up hook. What stands alone is in the files beside it: the queue's rules as pure functions of
 * a view (view.ts), request names (names.ts), background follow-ups (follow-ups.ts), sessions and
 * their lock-delay leases (sessions.ts), the options (options.ts), the calls and their errors
 * (rpc.ts), leader routing (route.ts) and watches (wake.ts).
 *
 * One piece, past 500 lines (a hundred of them the design, on `etcdBackend`): acquire, release,
 * cancelWait and the wake-up hook act on the same per-owner state (the pending wait, the calls still
 * running, the request's name), and their rules for each other — a cancel while a call runs, a
 * grant whose answer was lost, a place given up — are only checkable side by side.
 */
import { Etcd3, type ICompare, type IRequestOp } from './driver.js';
import type { AcquireRequest, AcquireResult, Backend, HandOff, KeyState, ReleaseRequest, RenewRequest, RenewResult, SessionSupport } from '../core/backend.js';
import { limitConflict } from '../core/errors.js';
import type { LockMode } from '../core/validate.js';
import { FollowUps } from './follow-ups.js';
import { KeyLayout, encodePart, rangeEnd } from './keys.js';
import { RequestNames, type RequestName } from './names.js';
import { checkEtcdOptions, type EtcdBackendOptions } from './options.js';
import { LeaderRoute } from './route.js';
import { cmp, deadline, deletedKvs, isLeaseNotFound, keepAliveOnce, mapError, op, ownClientOptions, readKvs, revoke, type EtcdClient } from './rpc.js';
import { DELAY_MARGIN_S, SessionTable } from './sessions.js';
import {
  ahead,
  conflict,
  delayValue,
  entryValue,
  freeKeyGuards,
  grantable,
  holders,
  inspectedLeases,
  keyState,
  orphans,
  parseJson,
  parseView,
  parseViews,
  viewGuards,
  watchTarget,
  type Entry,
  type View,
  type Waiter,
} from './view.js';
import { KeyWatch, LockWatches, Wake, type WatchTarget } from './wake.js';

/**
 * Rounds of "try the grant, else read" one acquire call makes before it answers busy. Each lost
 * round means the key's queue changed under us; the waiter's watch and core's re-check pick it up.
 */
const MAX_ROUNDS = 4;
/** A queued request nobody asked about for this long is forgotten and its leases revoked (core asks every ~0.5 s). */
const PENDING_FORGET_MS = 30_000;

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

/** The busy answer's cursor: who waits, and what to watch from which revision. */
interface Cursor extends WatchTarget {
  readonly owner?: string;
}

/** What the backend is made of: the client and the checked options. */
interface EtcdBackendParts {
  readonly client: EtcdClient;
  /** Closes the client(s) the backend built; undefined for a client passed in (never closed). */
  readonly closeClient: (() => void) | undefined;
  readonly prefix: string;
  readonly timeoutMs: number;
  readonly minTtlMs: number;
  readonly lingerMs: number;
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
 * name: this backend's tag and a number, reused once its keys are deleted, see names.ts);
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
 * **Semaphore permits** (`limit`). A permit request is a key `<prefix><key>/q/p/<name>`, its limit
 * in the value: granted when no exclusive request and no shared request of another kind (a plain
 * shared one, a permit of another limit) is ahead of it and fewer than its limit of permits are
 * (it is among the first N), so each permit's token is its own create revision. The first permit
 * on a free key is granted by the first transaction (guard: the whole queue empty); the next ones
 * by their place, which the same transaction writes and reads back with the queue (one round trip),
 * or, not queued, by a transaction guarded on the view it read (no exclusive or plain shared
 * request, no permit created since: fewer than N are still there). A waiter is handed its permit
 * when fewer than N permits are ahead of it, whichever of them leaves. A shared request that finds
 * holders of another kind is refused (`InvalidArgumentError` naming both), and the place the first
 * transaction wrote for it is deleted before the answer. A plain shared grant's guards require no
 * permit request, so it can never slip in next to permits.
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
  const settings = checkEtcdOptions(options);
  const parts = { prefix: settings.prefix, timeoutMs: settings.timeoutMs, minTtlMs: settings.minTtlMs, lingerMs: settings.lingerMs };
  if (settings.client !== undefined) return new EtcdBackend({ ...parts, client: settings.client, closeClient: undefined });
  const { hosts } = settings;
  const pool = new Etcd3(ownClientOptions(hosts));
  if (hosts.length > 1 && settings.preferLeader) {
    // One client per member, each trying its member once: the route picks the next member itself.
    const route = new LeaderRoute(pool, hosts, (h) => ownClientOptions([h], 1), settings.timeoutMs);
    const closeClient = (): void => {
      route.close();
      pool.close();
    };
    return new EtcdBackend({ ...parts, client: route.client, closeClient });
  }
  return new EtcdBackend({ ...parts, client: pool, closeClient: () => pool.close() });
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
  /** Owner → its queued request, between two calls of the same acquire. */
  readonly #pending = new Map<string, Pending>();
  readonly #wakes = new Map<string, Wake>();
  readonly #lockWatches: LockWatches;
  readonly #names = new RequestNames();
  readonly #sessionTable: SessionTable;
  readonly #followUps = new FollowUps();
  /** Owner → its acquire calls still running here (a caller that timed one out may cancel meanwhile). */
  readonly #running = new Map<string, number>();
  /** Set by close(): the backend's timers, watches and follow-ups stop (calls after close() are refused by core's guardBackend). */
  #closed = false;

  constructor(options: EtcdBackendParts) {
    const { client, timeoutMs } = options;
    this.#client = client;
    this.#lockWatches = new LockWatches(client, timeoutMs, options.lingerMs);
    this.#closeClient = options.closeClient;
    this.#prefix = options.prefix;
    this.#timeoutMs = timeoutMs;
    this.capabilities = Object.freeze({ fair: true, minTtlMs: options.minTtlMs });
    const sessions = new SessionTable({ client, timeoutMs, onEnd: (session) => this.#names.retireSession(session) });
    this.#sessionTable = sessions;
    this.sessions = {
      open: (ttlMs) => sessions.open(ttlMs),
      keepAlive: (id) => sessions.keepAlive(id),
      close: (id) => sessions.close(id),
    };
  }

  // ---- acquire -------------------------------------------------------------------------------

  async acquire(req: AcquireRequest): Promise<AcquireResult> {
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
    await this.#drop(req, nm);
    return true;
  }

  /**
   * Deletes everything a request wrote under its name (its place, a grant) and revokes its lock
   * lease (the pending one, and `p`'s: granted in this call, maybe not pending yet). The name goes
   * back for reuse once deleted, when no other call of the owner still runs.
   */
  async #drop(req: AcquireRequest, nm: RequestName, p?: Pending): Promise<void> {
    const pending = this.#pending.get(req.owner);
    this.#pending.delete(req.owner);
    for (const q of new Set([pending, p])) {
      if (!q?.lockLease) continue;
      this.#revokeLater(q.lockLease.id, q.delayLease);
      q.lockLease = undefined;
      q.delayLease = undefined;
    }
    const layout = new KeyLayout(this.#prefix, req.key);
    const attempt = () => this.#deleteNamed(layout, nm.name);
    const deleted = await attempt().then(
      () => true,
      () => (this.#followUps.followUp(attempt), false),
    );
    // The last call of the owner has ended: nothing more can be written under the name, which goes
    // back for reuse once deleted (a call that failed with an unknown outcome tainted it).
    if ((this.#running.get(req.owner) ?? 0) <= 1) this.#names.done(req.owner, deleted);
  }

  async #acquire(req: AcquireRequest): Promise<AcquireResult> {
    // The caller is back after a failed call: a clean-up of that call finishes first. Otherwise no
    // await before the name is taken: a cancelWait right after this call started must find it.
    const cleanup = this.#followUps.resume(req.owner);
    if (cleanup) await cleanup;
    const now = performance.now();
    this.#forgetStale(now);
    const layout = new KeyLayout(this.#prefix, req.key);
    // A semaphore permit's limit; undefined for a plain lock.
    const limit = req.mode === 'shared' ? req.limit : undefined;
    const nm = this.#names.for(req);
    const entryKey = layout.entry(req.mode, nm.name, limit !== undefined);
    let p = this.#pending.get(req.owner);
    if (p && (p.key !== req.key || p.mode !== req.mode)) p = undefined;
    p ??= { key: req.key, mode: req.mode, touchedAt: now };
    p.touchedAt = now;

    try {
      // The lease the request hangs on (as a waiter, then as the holder), and the lease of its lock-delay marker.
      let hold: { id: string; ttlMs: number; own: boolean };
      let delayLease: string | undefined;
      if (req.session !== undefined) {
        hold = { id: req.session, ttlMs: this.#sessionTable.ttlMs(req.session) ?? req.ttlMs, own: false };
        if (req.lockDelayMs > 0) delayLease = await this.#sessionTable.delayLease(req.session, req.lockDelayMs);
      } else {
        hold = { ...(await this.#lockLease(p, req)), own: true };
        delayLease = p.delayLease;
      }
      nm.session = req.session;
      nm.ownUntil = hold.own ? performance.now() + hold.ttlMs + this.#timeoutMs : undefined;
      const base = op.getRange(layout.base, rangeEnd(Buffer.from(layout.base)));
      const value = entryValue(req.holder, hold.own, false, limit);
      const grantedValue = entryValue(req.holder, hold.own, true, limit);
      const granted = (token: bigint): AcquireResult => {
        this.#pending.delete(req.owner);
        return { granted: true, token, ttlMs: hold.ttlMs };
      };
      // A waiter may be handed its grant without a write only on its session without lock-delay (see `follower`).
      const handOff = req.lockDelayMs === 0 ? req.session : undefined;
      const waiter = (view: View, own: Entry): Waiter => ({ prefix: this.#prefix, layout, view, own, mode: req.mode, session: handOff });
      // A shared request on a key held by shared holders of another kind (another limit, a permit
      // against plain shared or the reverse) is refused, and what it wrote (its place) is deleted first.
      const refuseConflict = async (view: View): Promise<void> => {
        const held = conflict(
          view,
          view.entries.find((e) => e.key === entryKey),
          req.mode,
          limit,
        );
        if (!held) return;
        // An earlier call of the owner still running may write under the name after this: it deletes again when it ends.
        if ((this.#running.get(req.owner) ?? 0) > 1) nm.cancelled = true;
        await this.#drop(req, nm, p);
        throw limitConflict(req.key, held.limit, limit);
      };

      let view: View | undefined;
      for (let round = 0; round < MAX_ROUNDS; round++) {
        // The caller gave up while this call ran (cancelWait deleted the place): nothing more is
        // written, not even a new place for one the cancel removed (acquire deletes what was).
        if (nm.cancelled) return { granted: false };
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
            const r = await this.#txn('acquire', freeKeyGuards(layout, req.mode, entryKey, limit), success, [...enqueue, base]);
            if (r.succeeded) return granted(BigInt(r.header.revision));
            view = parseView(this.#prefix, readKvs(r), BigInt(r.header.revision));
          }
        }
        await refuseConflict(view);
        const own = view.entries.find((e) => e.key === entryKey);
        if (own) {
          // Granted when nothing is ahead of our entry at a linearizable read: nobody can get ahead of
          // it later (later requests have later revisions), so this stays true until we release.
          // Our entry is read in the same step, so a waiter whose lease expired while it waited is
          // not granted (etcd issue 11456).
          if (!grantable(view, own, req.mode, limit)) {
            if (!req.queue) break;
            return await this.#wait(req.owner, p, waiter(view, own));
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
        if (!grantable(view, undefined, req.mode, limit)) break;
        const success = [op.put(entryKey, grantedValue, hold.id)];
        if (delayLease !== undefined) success.push(op.put(layout.delay(nm.name), delayValue(req.holder, undefined), delayLease));
        const r = await this.#txn('acquire', viewGuards(layout, view, req.mode, entryKey, limit), success, [base]);
        if (r.succeeded) return granted(BigInt(r.header.revision));
        view = parseView(this.#prefix, readKvs(r), BigInt(r.header.revision));
      }
      if (!view) view = await this.#read(layout);
      await refuseConflict(view);
      const own = view.entries.find((e) => e.key === entryKey);
      if (req.queue && own) return await this.#wait(req.owner, p, waiter(view, own));
      if (own) {
        // A not-queued request's entry left by an earlier call of this caller whose answer was lost: not ours to keep.
        const attempt = () => this.#deleteNamed(layout, nm.name);
        const deleted = await attempt().then(
          () => true,
          () => (this.#followUps.followUp(attempt), false),
        );
        this.#names.done(req.owner, deleted);
      } else {
        // Nothing of ours under the name at this read (a refusal writes nothing; an earlier call that
        // may have written would have tainted it).
        this.#names.done(req.owner, !view.delays.some((d) => d.encOwner === encodePart(nm.name)));
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
        this.#followUps.abandonLater(req.owner, () => this.#abandon(req));
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
  async #wait(owner: string, p: Pending, waiter: Waiter): Promise<AcquireResult> {
    p.view = waiter.view;
    this.#pending.set(owner, p);
    const target = watchTarget(waiter);
    void this.#wakes
      .get(owner)
      ?.target(target)
      .catch(() => {});
    return this.#busy(waiter.view, waiter.own, waiter.mode, { ...target, owner });
  }

  async #busy(view: View, own: Entry | undefined, mode: LockMode, cursor: Cursor): Promise<AcquireResult> {
    const holder = holders(view)[0]?.holder ?? orphans(view)[0]?.holder;
    let retryInMs: number | undefined;
    const delays = orphans(view);
    if (ahead(view, own, mode, own?.limit).length === 0 && delays.length > 0) {
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
    const layout = new KeyLayout(this.#prefix, req.key);
    const nm = this.#names.get(req.owner);
    const name = this.#names.of(req.key, req.owner);
    const entryKey = layout.entry(req.mode, name, nm?.permit);
    try {
      const r = await this.#txn('renew', [], [op.get(entryKey), op.get(layout.delay(name))], []);
      const kvs = readKvs(r);
      const entry = kvs.find((kv) => kv.key.toString('utf8') === entryKey);
      const value = entry ? parseJson(entry) : {};
      // The token is the entry's create revision: only the grant that was told it can name it.
      if (!entry || BigInt(entry.create_revision) !== req.token) return { renewed: false };
      if (value.o !== 1) {
        // A lease of a session: renewing it is the session's keep-alive (with its lock-delay leases).
        if (!(await this.#sessionTable.keepAlive(entry.lease))) return { renewed: false };
        return { renewed: true, ttlMs: this.#sessionTable.ttlMs(entry.lease) ?? req.ttlMs };
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
    if (req.token < 1n) return;
    const layout = new KeyLayout(this.#prefix, req.key);
    const name = this.#names.of(req.key, req.owner);
    const entryKey = layout.entry(req.mode, name, this.#names.get(req.owner)?.permit);
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
      if (released) this.#names.done(req.owner, true);
    } catch (error) {
      const nm = this.#names.get(req.owner);
      if (nm) nm.tainted = true;
      const mapped = mapError('release', error);
      // An entry on a session lease would outlive this failure as long as the session lives: keep trying.
      if (mapped.retryable) this.#followUps.followUp(attempt);
      throw mapped;
    }
  }

  async cancelWait({ key, owner }: { key: string; owner: string }): Promise<void> {
    if (this.#closed) return;
    const p = this.#pending.get(owner);
    this.#pending.delete(owner);
    if (p?.lockLease) this.#revokeLater(p.lockLease.id, p.delayLease);
    const layout = new KeyLayout(this.#prefix, key);
    const name = this.#names.of(key, owner);
    // A call of this owner still running may write under the name after this delete: it deletes
    // again when it ends (#dropIfCancelled), and only then is the name done with.
    const running = (this.#running.get(owner) ?? 0) > 0;
    const nm = this.#names.get(owner);
    if (running && nm && nm.key === key) nm.cancelled = true;
    const attempt = () => this.#deleteNamed(layout, name);
    try {
      await attempt();
      if (!running) this.#names.done(owner, true);
    } catch (error) {
      if (!running) this.#names.done(owner, false);
      const mapped = mapError('cancel wait', error);
      // A grant that landed after the caller gave up may sit on its session lease: keep trying.
      if (mapped.retryable) this.#followUps.followUp(attempt);
      throw mapped;
    }
  }

  /** Deletes every key of one request (any mode, a permit, and its lock-delay marker): the keys under its name are its alone. */
  async #deleteNamed(layout: KeyLayout, name: string): Promise<void> {
    const entries = [layout.entry('exclusive', name), layout.entry('shared', name), layout.entry('shared', name, true)];
    await this.#txn('delete request', [], [...entries.map((k) => op.del(k)), op.del(layout.delay(name))], []);
  }

  /** The caller did not come back after a call that failed with an unknown outcome (see `FollowUps.abandonLater`): delete what it may have written. */
  #abandon(req: AcquireRequest): Promise<void> {
    const p = this.#pending.get(req.owner);
    this.#pending.delete(req.owner);
    if (p?.lockLease) this.#revokeLater(p.lockLease.id, p.delayLease);
    const layout = new KeyLayout(this.#prefix, req.key);
    const name = this.#names.of(req.key, req.owner);
    return this.#followUps.untilDone(() => this.#deleteNamed(layout, name)).finally(() => this.#names.done(req.owner, false));
  }

  // ---- wake-ups --------------------------------------------------------------------------------

  async subscribe(key: string, onChange: (handOff?: HandOff) => void, cursor?: unknown): Promise<() => void> {
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

  /** Change notifications of one key (`Backend.watch`): every put and delete under the lock, on the lock's shared watch. */
  async watch(key: string, onChange: () => void): Promise<() => void> {
    const w = new KeyWatch(this.#lockWatches, new KeyLayout(this.#prefix, key).base, onChange);
    await w.start();
    return () => w.close();
  }

  // ---- inspect ---------------------------------------------------------------------------------

  async inspect(prefix: string): Promise<KeyState[]> {
    const start = `${this.#prefix}${encodePart(prefix)}`;
    try {
      const r = await this.#client.kv.range({ key: Buffer.from(start), range_end: rangeEnd(Buffer.from(start)) }, deadline(this.#timeoutMs));
      const views = parseViews(this.#prefix, r.kvs, BigInt(r.header.revision));
      const leases = new Set(views.flatMap(({ view }) => inspectedLeases(view)));
      const remaining = new Map(await Promise.all([...leases].map(async (id) => [id, await this.#remainingMs(id)] as const)));
      // Unordered: core sorts the answer (guardBackend).
      return views.flatMap(({ key, view }) => keyState(key, view, (lease) => remaining.get(lease) ?? 0) ?? []);
    } catch (error) {
      throw mapError('inspect', error);
    }
  }

  // ---- plumbing --------------------------------------------------------------------------------

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#followUps.close();
    for (const wake of this.#wakes.values()) wake.close();
    this.#wakes.clear();
    this.#lockWatches.close();
    const leases: string[] = [];
    for (const p of this.#pending.values()) {
      if (p.lockLease) leases.push(p.lockLease.id);
      if (p.delayLease) leases.push(p.delayLease);
    }
    this.#pending.clear();
    this.#names.close();
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

  /** Forgets what core stopped asking about: sessions not kept alive, waits nobody asked about, names of leases that ran out. */
  #forgetStale(now: number): void {
    this.#sessionTable.forgetStale(now);
    for (const [owner, p] of this.#pending) {
      if (now - p.touchedAt < PENDING_FORGET_MS) continue;
      this.#pending.delete(owner);
      this.#names.done(owner, false);
      if (p.lockLease) this.#revokeLater(p.lockLease.id, p.delayLease);
    }
    // A lease of its own that nobody released (lost, or left to expire) is certainly over by its ownUntil.
    this.#names.sweep(now, (owner) => this.#pending.has(owner));
  }
}

function isCursor(value: unknown): value is Cursor {
  if (typeof value !== 'object' || value === null) return false;
  const c = value as Cursor;
  return Array.isArray(c.keys) && (c.afterRevision === undefined || typeof c.afterRevision === 'bigint');
}

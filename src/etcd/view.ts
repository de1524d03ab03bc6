/**
 * The queue of one lock key, as pure functions of a view: everything under the key read at one
 * revision (`parseView`), who holds it (`holders`), who must wait for whom (`ahead`, `grantable`),
 * the guards a grant's transaction carries (`freeKeyGuards`, `viewGuards`), what a waiter watches
 * (`watchTarget`, `follower`) and what `inspect` reports (`keyState`). No I/O: the backend reads and
 * writes, these decide; test/etcd/view.test.ts checks them without an etcd.
 *
 * Semaphore permits are shared requests of a kind of their own (under `q/p/`, their limit in the
 * value): a permit of limit N holds when no exclusive request is ahead of it, no shared request of
 * another kind (a plain shared one, or a permit of another limit) is ahead of it, and fewer than N
 * permits are ahead of it (it is among the first N). A shared request that finds the key held by
 * shared holders of another kind is refused (`conflict`).
 */
import { limitConflictMessage } from '../core/errors.js';
import type { ICompare, IKeyValue } from 'etcd3';
import type { HandOff, HolderState, KeyState } from '../core/backend.js';
import type { LockMode } from '../core/validate.js';
import { type KeyLayout, decodePart, parseKey, rangeEnd } from './keys.js';
import { cmp } from './rpc.js';
import type { Follow, WatchTarget } from './wake.js';

/**
 * A shared grant next to shared holders that have lock-delay markers checks each of their entries
 * in its transaction; past this many it waits (etcd allows 128 operations per transaction).
 */
export const MAX_DELAY_GUARDS = 64;

/** A request in a key's queue, as read from etcd. */
export interface Entry {
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
  /** A semaphore permit's limit (a key under `q/p/`); undefined for plain shared and exclusive requests. */
  readonly limit: number | undefined;
}

/** A lock-delay marker: while its holder's entry exists it is dormant; once the entry is gone, it blocks the key until it expires. */
export interface DelayMark {
  readonly key: string;
  readonly encOwner: string;
  readonly lease: string;
  readonly holder: string;
  readonly token: bigint;
}

/** Everything under one lock key at one revision. */
export interface View {
  readonly revision: bigint;
  /** In queue order (create revision). */
  readonly entries: readonly Entry[];
  readonly delays: readonly DelayMark[];
}

/** A waiter in the queue: its lock's keys, the view it read, its own entry and mode, and the session its entry hangs on when it may be handed the grant. */
export interface Waiter {
  readonly prefix: string;
  readonly layout: KeyLayout;
  readonly view: View;
  readonly own: Entry;
  readonly mode: LockMode;
  /** Set when the waiter may be handed its grant without a write (a session-bound request without lock-delay). */
  readonly session: string | undefined;
}

/**
 * The value of a request key: its public holder label, whether its lease is its own (o), whether it
 * was written as granted (g), and a permit's limit (l).
 */
export const entryValue = (holder: string, ownLease: boolean, granted: boolean, limit?: number): string =>
  JSON.stringify({ h: holder, o: ownLease ? 1 : 0, g: granted ? 1 : 0, ...(limit !== undefined && { l: limit }) });
/** The value of a lock-delay marker: its holder's label and, once granted, its token (t). */
export const delayValue = (holder: string, token: bigint | undefined): string => JSON.stringify({ h: holder, t: token?.toString() ?? '' });

/** A key's JSON value as an object; anything else (not ours, damaged) reads as {}. */
export function parseJson(kv: IKeyValue): Record<string, unknown> {
  try {
    const v = JSON.parse(kv.value.toString('utf8')) as unknown;
    return typeof v === 'object' && v !== null ? (v as Record<string, unknown>) : {};
  } catch {
    return {};
  }
}

export function parseView(prefix: string, kvs: readonly IKeyValue[], revision: bigint): View {
  const entries: Entry[] = [];
  const delays: DelayMark[] = [];
  for (const kv of kvs) {
    const key = kv.key.toString('utf8');
    const parsed = parseKey(prefix, key);
    if (!parsed) continue;
    const v = parseJson(kv);
    const holder = typeof v.h === 'string' ? v.h : '';
    if (parsed.kind === 'entry') {
      entries.push({
        key,
        encOwner: parsed.encOwner,
        mode: parsed.mode,
        rev: BigInt(kv.create_revision),
        lease: String(kv.lease),
        granted: v.g === 1,
        holder,
        ownLease: v.o === 1,
        // A permit whose value lost its limit (damaged, not ours) counts as the narrowest semaphore.
        limit: parsed.permit ? (typeof v.l === 'number' && Number.isInteger(v.l) && v.l >= 1 ? v.l : 1) : undefined,
      });
    } else {
      const token = typeof v.t === 'string' && /^[0-9]+$/.test(v.t) ? BigInt(v.t) : BigInt(kv.create_revision);
      delays.push({ key, encOwner: parsed.encOwner, lease: String(kv.lease), holder, token });
    }
  }
  entries.sort((a, b) => (a.rev < b.rev ? -1 : a.rev > b.rev ? 1 : 0));
  return { revision, entries, delays };
}

/** Every lock key's view in a read of many (inspect's), in the order of the read; keys that are not ours are left out. */
export function parseViews(prefix: string, kvs: readonly IKeyValue[], revision: bigint): { key: string; view: View }[] {
  const groups = new Map<string, IKeyValue[]>();
  for (const kv of kvs) {
    const parsed = parseKey(prefix, kv.key.toString('utf8'));
    if (!parsed) continue;
    let list = groups.get(parsed.encKey);
    if (!list) groups.set(parsed.encKey, (list = []));
    list.push(kv);
  }
  return [...groups].map(([encKey, group]) => ({ key: decodePart(encKey), view: parseView(prefix, group, revision) }));
}

/** Lock-delay markers whose holder's entry is gone: the holder expired without releasing. */
export function orphans(view: View): DelayMark[] {
  const owners = new Set(view.entries.map((e) => e.encOwner));
  return view.delays.filter((d) => !owners.has(d.encOwner));
}

/** Markers of holders that still hold. */
export function liveDelays(view: View): DelayMark[] {
  const owners = new Set(view.entries.map((e) => e.encOwner));
  return view.delays.filter((d) => owners.has(d.encOwner));
}

/**
 * The requests a request of `mode` must wait for (`limit`: a permit's; undefined for a plain lock).
 * An exclusive request: everyone ahead. A shared one: every exclusive request ahead and every shared
 * request ahead of another kind (another limit, or a permit for a plain shared request and the
 * reverse); and a permit, when `limit` or more permits of its limit are ahead, the oldest of them
 * down to the `limit`th ahead of it: it holds once that one is gone, when they leave in order.
 */
export function ahead(view: View, own: Entry | undefined, mode: LockMode, limit?: number): Entry[] {
  const before = view.entries.filter((e) => (own === undefined || e.rev < own.rev) && e.key !== own?.key);
  if (mode === 'exclusive') return before;
  let excess: Set<Entry> | undefined;
  if (limit !== undefined) {
    const permits = before.filter((e) => e.mode === 'shared' && e.limit === limit);
    if (permits.length >= limit) excess = new Set(permits.slice(0, permits.length - limit + 1));
  }
  return before.filter((e) => e.mode === 'exclusive' || e.limit !== limit || excess?.has(e) === true);
}

/**
 * A request of `mode` (and `limit`, a permit's) holds the key in `view`: with its entry `own`, by
 * its place; without one (not queued), if it were written now at the end of the queue.
 */
export function grantable(view: View, own: Entry | undefined, mode: LockMode, limit?: number): boolean {
  if (ahead(view, own, mode, limit).length > 0 || orphans(view).length > 0) return false;
  // Without an entry, a shared grant guards every marker's holder in its transaction (viewGuards).
  return own !== undefined || mode === 'exclusive' || liveDelays(view).length <= MAX_DELAY_GUARDS;
}

/**
 * For a shared request (plain, `limit` undefined, or a permit of `limit`): a holder of the key in
 * `view` that is shared of another kind (see `ahead`), so the key is held as something else and the
 * request is refused (`AcquireRequest.limit`). Undefined for an exclusive request: it waits.
 */
export function conflict(view: View, own: Entry | undefined, mode: LockMode, limit: number | undefined): Entry | undefined {
  if (mode === 'exclusive') return undefined;
  return holders(view).find((e) => e.key !== own?.key && e.mode === 'shared' && e.limit !== limit);
}

/** The refusal's message (core's, as every backend's). */
export const conflictMessage = limitConflictMessage;

/**
 * The guards of the first transaction of a request: our entry does not exist yet, nobody is queued
 * that we would have to wait for (everyone, or every exclusive request for a plain shared one), and
 * no lock-delay marker exists (of an expired holder, or of a live one: a shared request next to
 * shared holders with markers takes the slower `viewGuards` path). A plain shared request also
 * needs no permit request around (it would be refused on a semaphore key), and a permit an empty
 * queue: how many permits are ahead is not something a compare can count, so past the first permit
 * on a free key the grant is decided on a view (its place's, or `viewGuards`).
 */
export function freeKeyGuards(layout: KeyLayout, mode: LockMode, entryKey: string, limit?: number): ICompare[] {
  const end = (k: string): Buffer => rangeEnd(Buffer.from(k));
  const queue = mode === 'exclusive' || limit !== undefined ? layout.queue : layout.exclusive;
  const guards = [cmp.createdAt(entryKey, 0n), cmp.createdAt(queue, 0n, end(queue)), cmp.createdAt(layout.delays, 0n, end(layout.delays))];
  if (mode === 'shared' && limit === undefined) guards.push(cmp.createdAt(layout.permits, 0n, end(layout.permits)));
  return guards;
}

/**
 * Guards of a grant without a place in the queue, decided on `view`: what made it grantable still
 * holds. For a shared request: no exclusive request, no lock-delay marker written since the view,
 * and the holder of every marker still there (so none became an expired holder's delay). A plain
 * shared request: no permit request; a permit: no plain shared request, and no permit request
 * created since the view (so fewer than its limit are still ahead of it, all of its limit).
 */
export function viewGuards(layout: KeyLayout, view: View, mode: LockMode, entryKey: string, limit?: number): ICompare[] {
  if (mode === 'exclusive') return freeKeyGuards(layout, mode, entryKey);
  const end = (k: string): Buffer => rangeEnd(Buffer.from(k));
  const guards = [
    cmp.createdAt(entryKey, 0n),
    cmp.createdAt(layout.exclusive, 0n, end(layout.exclusive)),
    cmp.modifiedBy(layout.delays, view.revision, end(layout.delays)),
  ];
  for (const d of liveDelays(view)) {
    const holder = view.entries.find((e) => e.encOwner === d.encOwner)!;
    guards.push(cmp.createdAt(holder.key, holder.rev));
  }
  if (limit === undefined) guards.push(cmp.createdAt(layout.permits, 0n, end(layout.permits)));
  else guards.push(cmp.createdAt(layout.shared, 0n, end(layout.shared)), cmp.createdBy(layout.permits, view.revision, end(layout.permits)));
  return guards;
}

/**
 * Who holds the key in `view`: entries written as granted, entries with their own lock-delay
 * marker (written at the grant), and, when no expired holder's marker is in the way, every entry
 * with nothing ahead of it (granted, or about to learn it on its next look). The rule of `ahead`, in
 * one pass over the queue (a semaphore's queue may be long).
 */
export function holders(view: View): Entry[] {
  const marked = new Set(view.delays.map((d) => d.encOwner));
  const free = orphans(view).length === 0;
  let first = true;
  let exclusive = false;
  /** Shared requests seen so far, by kind (limit; undefined: plain shared). */
  const kinds = new Map<number | undefined, number>();
  const out: Entry[] = [];
  for (const e of view.entries) {
    let placed: boolean;
    if (e.mode === 'exclusive') placed = first;
    else {
      const seen = kinds.get(e.limit) ?? 0;
      placed = !exclusive && kinds.size <= (seen > 0 ? 1 : 0) && (e.limit === undefined || seen < e.limit);
      kinds.set(e.limit, seen + 1);
    }
    if (e.mode === 'exclusive') exclusive = true;
    first = false;
    if (e.granted || marked.has(e.encOwner) || (free && placed)) out.push(e);
  }
  return out;
}

/**
 * What a queued waiter watches. Blocked by requests ahead of it: every change under the lock from
 * the revision it read (see `follower`), so it knows it holds the key the moment its turn comes,
 * without a read; only that waiter then acts (every waiter receives the lock's changes, but a
 * release sets off one request at most, never a herd). Blocked by an expired holder's lock-delay
 * markers: their deletion.
 */
export function watchTarget(waiter: Waiter): WatchTarget {
  const { view, own, mode, layout } = waiter;
  const blockers = ahead(view, own, mode, own.limit);
  const last = blockers[blockers.length - 1];
  if (last && orphans(view).length === 0) {
    return { keys: [last.key], revisions: [last.rev.toString()], afterRevision: view.revision, follow: follower(waiter) };
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
export function follower(waiter: Waiter): Follow {
  const { prefix, view, own, mode, layout, session } = waiter;
  let entries = new Map(view.entries.map((e) => [e.key, e]));
  let delays = new Map(view.delays.map((d) => [d.key, d]));
  let done = false;
  const decide = (): HandOff | 'wake' | undefined => {
    const now: View = {
      revision: 0n,
      entries: [...entries.values()].sort((a, b) => (a.rev < b.rev ? -1 : a.rev > b.rev ? 1 : 0)),
      delays: [...delays.values()],
    };
    const mine = now.entries.find((e) => e.key === own.key);
    // Still behind other requests, and nothing else in the way (an expired holder's marker, holders
    // of another kind that refuse the request): keep following, say nothing.
    const blocked = mine !== undefined && ahead(now, mine, mode, own.limit).length > 0;
    if (blocked && orphans(now).length === 0 && !conflict(now, mine, mode, own.limit)) return undefined;
    done = true;
    if (mine && session !== undefined && mine.lease === session && now.delays.length === 0 && grantable(now, mine, mode, own.limit)) {
      return { token: mine.rev, session };
    }
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

/**
 * What `inspect` reports of one lock key read in `view`, given the remaining time of each lease
 * (`remainingMs`, 0 when gone); undefined for a key with no holder, no waiter and no running
 * lock-delay. The leases it needs are `inspectedLeases(view)`. Core orders the answer (guardBackend).
 */
export function keyState(key: string, view: View, remainingMs: (lease: string) => number): KeyState | undefined {
  const held = holders(view);
  const holderStates: HolderState[] = held.map((e) => ({ mode: e.mode, token: e.rev, holder: e.holder, expiresInMs: remainingMs(e.lease) }));
  const delays = orphans(view);
  const delayMs = Math.max(0, ...delays.map((d) => remainingMs(d.lease)));
  const waiters = view.entries.length - held.length;
  if (held.length === 0 && waiters === 0 && delayMs === 0) return undefined;
  let lastToken = 0n;
  for (const h of holderStates) if (h.token > lastToken) lastToken = h.token;
  for (const d of delays) if (d.token > lastToken) lastToken = d.token;
  const limit = held.find((e) => e.limit !== undefined)?.limit;
  return { key, lastToken, holders: holderStates, waiters, lockDelayRemainingMs: delayMs, ...(limit !== undefined && { limit }) };
}

/** The leases whose remaining time `keyState` reports: the holders' and the expired holders' lock-delay markers'. */
export function inspectedLeases(view: View): string[] {
  return [...holders(view).map((e) => e.lease), ...orphans(view).map((d) => d.lease)];
}

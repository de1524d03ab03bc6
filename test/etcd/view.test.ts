/**
 * The etcd queue's rules as pure functions of a view (src/etcd/view.ts), without an etcd: key-values
 * are built here as a range read or a watch would return them.
 */
import type { IEvent, IKeyValue } from 'etcd3';
import { describe, expect, it } from 'vitest';
import { KeyLayout } from '../../src/etcd/keys.js';
import {
  ahead,
  conflict,
  conflictMessage,
  delayValue,
  entryValue,
  follower,
  freeKeyGuards,
  grantable,
  holders,
  inspectedLeases,
  keyState,
  MAX_DELAY_GUARDS,
  orphans,
  parseJson,
  parseView,
  parseViews,
  viewGuards,
  watchTarget,
  type View,
  type Waiter,
} from '../../src/etcd/view.js';

const PREFIX = 'lh/';
const layout = new KeyLayout(PREFIX, 'job');
const SESSION = '7';

type Kv = IKeyValue;
const kv = (key: string, value: string, createRev: number, lease = SESSION): Kv => ({
  key: Buffer.from(key),
  value: Buffer.from(value),
  create_revision: String(createRev),
  mod_revision: String(createRev),
  version: '1',
  lease,
});
/** A request of `name` in `mode`, created at `rev` (its place, and its token once granted). */
const entry = (
  name: string,
  rev: number,
  o: { mode?: 'exclusive' | 'shared'; granted?: boolean; own?: boolean; lease?: string; lock?: KeyLayout; limit?: number } = {},
): Kv =>
  kv(
    (o.lock ?? layout).entry(o.limit !== undefined ? 'shared' : (o.mode ?? 'exclusive'), name, o.limit !== undefined),
    entryValue(`holder-${name}`, o.own ?? false, o.granted ?? false, o.limit),
    rev,
    o.lease,
  );
/** A semaphore permit request of `name` with `limit`, created at `rev`. */
const permit = (name: string, rev: number, limit: number, o: { granted?: boolean; lease?: string } = {}): Kv => entry(name, rev, { ...o, limit });
/** The lock-delay marker of `name`, created at `rev`, with the token written at the grant (if any). */
const marker = (name: string, rev: number, token?: number, lease = '99'): Kv =>
  kv(layout.delay(name), delayValue(`holder-${name}`, token === undefined ? undefined : BigInt(token)), rev, lease);
const view = (kvs: Kv[], revision = 100): View => parseView(PREFIX, kvs, BigInt(revision));
const own = (v: View, name: string) => v.entries.find((e) => e.key.endsWith(`/${name}`))!;
/** A waiter of `name`; `session: null` for one that cannot be handed its grant (lock-delay: the grant is written down). */
const waiter = (v: View, name: string, mode: 'exclusive' | 'shared' = 'exclusive', session: string | null = SESSION): Waiter => ({
  prefix: PREFIX,
  layout,
  view: v,
  own: own(v, name),
  mode,
  session: session ?? undefined,
});
const put = (k: Kv): IEvent => ({ type: 'Put', kv: k }) as IEvent;
const del = (k: Kv): IEvent => ({ type: 'Delete', kv: { ...k, value: Buffer.alloc(0) } }) as IEvent;

describe('etcd view: reading the keys of a lock', () => {
  it('parses entries (queue order by create revision) and markers, and skips keys that are not ours', () => {
    const v = view([
      entry('b', 12, { mode: 'shared', own: true }),
      entry('a', 10, { granted: true }),
      marker('a', 11, 10),
      kv(`${layout.base}x/y`, '{}', 13),
      kv('other/job/q/e/z', '{}', 14),
    ]);
    expect(v.revision).toBe(100n);
    expect(v.entries.map((e) => [e.encOwner, e.mode, e.rev, e.granted, e.ownLease, e.holder])).toEqual([
      ['a', 'exclusive', 10n, true, false, 'holder-a'],
      ['b', 'shared', 12n, false, true, 'holder-b'],
    ]);
    expect(v.delays).toEqual([{ key: layout.delay('a'), encOwner: 'a', lease: '99', holder: 'holder-a', token: 10n }]);
  });

  it('a marker without a token (written with a grant on a free key) takes its create revision; damaged values read as empty', () => {
    const v = view([marker('a', 20), kv(layout.entry('exclusive', 'b'), 'not json', 21)]);
    expect(v.delays[0]!.token).toBe(20n);
    expect(v.entries[0]).toMatchObject({ holder: '', granted: false, ownLease: false });
    expect(parseJson(kv('k', 'null', 1))).toEqual({});
    expect(parseJson(kv('k', '"text"', 1))).toEqual({});
    expect(parseJson(kv('k', entryValue('h', true, true), 1))).toEqual({ h: 'h', o: 1, g: 1 });
  });

  it('groups a read of many locks by lock key, decoding the key', () => {
    const other = new KeyLayout(PREFIX, 'a/b c');
    const views = parseViews(PREFIX, [entry('x', 5), entry('y', 6, { lock: other }), entry('z', 7), kv('elsewhere', '{}', 8)], 50n);
    expect(views.map(({ key, view: v }) => [key, v.entries.map((e) => e.encOwner), v.revision])).toEqual([
      ['job', ['x', 'z'], 50n],
      ['a/b c', ['y'], 50n],
    ]);
  });
});

describe('etcd view: who holds, who waits', () => {
  it('exclusive: the first request holds; everyone after it waits for everyone ahead', () => {
    const v = view([entry('a', 10), entry('b', 11), entry('c', 12)]);
    expect(holders(v).map((e) => e.encOwner)).toEqual(['a']);
    expect(ahead(v, own(v, 'c'), 'exclusive').map((e) => e.encOwner)).toEqual(['a', 'b']);
    expect(grantable(v, own(v, 'a'), 'exclusive')).toBe(true);
    expect(grantable(v, own(v, 'b'), 'exclusive')).toBe(false);
    // without an entry (tryAcquire), everyone in the queue is ahead
    expect(ahead(v, undefined, 'exclusive')).toHaveLength(3);
    expect(grantable(v, undefined, 'exclusive')).toBe(false);
    expect(grantable(view([]), undefined, 'exclusive')).toBe(true);
  });

  it('shared: shared requests hold together until an exclusive one; a shared one behind it waits (no barging)', () => {
    const v = view([entry('s1', 10, { mode: 'shared' }), entry('s2', 11, { mode: 'shared' }), entry('x', 12), entry('s3', 13, { mode: 'shared' })]);
    expect(holders(v).map((e) => e.encOwner)).toEqual(['s1', 's2']);
    expect(ahead(v, own(v, 's2'), 'shared')).toEqual([]);
    expect(ahead(v, own(v, 's3'), 'shared').map((e) => e.encOwner)).toEqual(['x']);
    expect(ahead(v, own(v, 'x'), 'exclusive').map((e) => e.encOwner)).toEqual(['s1', 's2']);
    expect(grantable(v, undefined, 'shared')).toBe(false);
  });

  it('a marker whose holder is gone (expired without release) blocks everyone and is the lock-delay', () => {
    const v = view([marker('gone', 8, 5), entry('a', 10)]);
    expect(orphans(v).map((d) => d.encOwner)).toEqual(['gone']);
    expect(grantable(v, own(v, 'a'), 'exclusive')).toBe(false);
    // nobody is inferred to hold while the delay runs; an entry written as granted still holds
    expect(holders(v)).toEqual([]);
    const marked = view([marker('gone', 8, 5), entry('g', 9, { granted: true }), marker('g', 9, 9, '98')]);
    expect(holders(marked).map((e) => e.encOwner)).toEqual(['g']);
    expect(orphans(marked).map((d) => d.encOwner)).toEqual(['gone']);
  });

  it(`a shared request without a place next to more than ${MAX_DELAY_GUARDS} marked shared holders waits (its guards would not fit)`, () => {
    const kvs: Kv[] = [];
    for (let i = 0; i <= MAX_DELAY_GUARDS; i++)
      kvs.push(entry(`s${i}`, 10 + 2 * i, { mode: 'shared', granted: true }), marker(`s${i}`, 11 + 2 * i, 10 + 2 * i));
    const many = view(kvs);
    expect(grantable(many, undefined, 'shared')).toBe(false);
    expect(grantable(view(kvs.slice(2)), undefined, 'shared')).toBe(true);
  });
});

describe('etcd view: the guards of a grant', () => {
  const entryKey = layout.entry('exclusive', 'me');
  const keyOf = (c: { key?: Buffer }) => c.key!.toString();

  it('on a free key: our entry absent, nobody queued that we would wait for, no marker', () => {
    const exclusive = freeKeyGuards(layout, 'exclusive', entryKey);
    expect(exclusive.map((c) => [keyOf(c), c.target, c.result, c.create_revision, c.range_end !== undefined])).toEqual([
      [entryKey, 'Create', 'Equal', '0', false],
      [layout.queue, 'Create', 'Equal', '0', true],
      [layout.delays, 'Create', 'Equal', '0', true],
    ]);
    // a shared request only minds exclusive requests
    expect(keyOf(freeKeyGuards(layout, 'shared', layout.entry('shared', 'me'))[1]!)).toBe(layout.exclusive);
  });

  it('decided on a view (shared, next to marked shared holders): no exclusive request, no marker since the view, every marked holder still there, no permit', () => {
    const v = view([entry('s1', 10, { mode: 'shared', granted: true }), marker('s1', 10, 10), entry('s2', 12, { mode: 'shared' })], 40);
    const guards = viewGuards(layout, v, 'shared', layout.entry('shared', 'me'));
    expect(guards.map((c) => [keyOf(c), c.target, c.result, c.create_revision ?? c.mod_revision])).toEqual([
      [layout.entry('shared', 'me'), 'Create', 'Equal', '0'],
      [layout.exclusive, 'Create', 'Equal', '0'],
      [layout.delays, 'Mod', 'Less', '41'],
      [layout.entry('shared', 's1'), 'Create', 'Equal', '10'],
      [layout.permits, 'Create', 'Equal', '0'],
    ]);
    expect(viewGuards(layout, v, 'exclusive', entryKey)).toEqual(freeKeyGuards(layout, 'exclusive', entryKey));
  });
});

describe('etcd view: what a waiter watches', () => {
  it('behind requests: the last one ahead, followed from the view (a hand-off without a read)', () => {
    const v = view([entry('a', 10), entry('b', 11), entry('me', 12)], 30);
    const t = watchTarget(waiter(v, 'me'));
    expect(t).toMatchObject({ keys: [layout.entry('exclusive', 'b')], revisions: ['11'], afterRevision: 30n });
    expect(t.follow).toMatchObject({ id: layout.entry('exclusive', 'me'), prefix: layout.base, from: 30n });
  });

  it("behind requests and an expired holder's marker: no following, and with only markers left, their deletion", () => {
    const both = view([marker('gone', 5, 5), entry('a', 10), entry('me', 12)]);
    const t = watchTarget(waiter(both, 'me'));
    expect(t.keys).toEqual([layout.entry('exclusive', 'a')]);
    expect(t.follow).toBeUndefined();
    const onlyDelay = view([marker('gone', 5, 5), entry('me', 12)]);
    expect(watchTarget(waiter(onlyDelay, 'me'))).toEqual({ keys: [layout.delay('gone')], afterRevision: 100n });
  });

  it('a shared waiter held back only by too many marked holders watches every deletion under the lock', () => {
    const kvs: Kv[] = [];
    for (let i = 0; i <= MAX_DELAY_GUARDS; i++)
      kvs.push(entry(`s${i}`, 10 + 2 * i, { mode: 'shared', granted: true }), marker(`s${i}`, 11 + 2 * i, 10 + 2 * i));
    const v = view([...kvs, entry('me', 1_000, { mode: 'shared' })]);
    expect(watchTarget(waiter(v, 'me', 'shared'))).toEqual({ keys: [], prefix: layout.base, afterRevision: 100n });
  });
});

describe('etcd view: following the lock (the hand-off)', () => {
  const a = entry('a', 10);
  const b = entry('b', 11);
  const me = entry('me', 12);

  it('says nothing while requests stay ahead, and hands over the grant when the last one goes', () => {
    const f = follower(waiter(view([a, b, me]), 'me'));
    expect(f.apply([put(entry('later', 13))])).toBeUndefined(); // behind us: nothing changes for us
    expect(f.apply([del(a)])).toBeUndefined(); // b is still ahead
    expect(f.apply([del(b)])).toEqual({ token: 12n, session: SESSION });
    expect(f.apply([del(entry('later', 13))])).toBeUndefined(); // done: says nothing more
  });

  it('wakes the waiter (never hands over) when its own entry went (etcd issue 11456), the holder expired with lock-delay, or its entry is on another lease', () => {
    const gone = follower(waiter(view([a, me]), 'me'));
    expect(gone.apply([del(me), del(a)])).toBe('wake');
    const delayed = follower(waiter(view([a, me]), 'me'));
    expect(delayed.apply([put(marker('a', 13, 10))])).toBeUndefined(); // a live holder's marker: still behind it
    expect(delayed.apply([del(a)])).toBe('wake'); // its entry expired, its marker stays: the lock-delay, not a hand-off
    const ownLease = follower(waiter(view([a, entry('me', 12, { lease: '55' })]), 'me'));
    expect(ownLease.apply([del(a)])).toBe('wake');
    const withDelay = follower(waiter(view([a, me]), 'me', 'exclusive', null));
    expect(withDelay.apply([del(a)])).toBe('wake');
  });

  it('restarts from a fresh read of the lock and decides on it', () => {
    const f = follower(waiter(view([a, b, me]), 'me'));
    expect(f.restart([b, me])).toBeUndefined();
    expect(f.restart([me])).toEqual({ token: 12n, session: SESSION });
  });
});

describe('etcd view: what inspect reports', () => {
  const remaining = (ms: Record<string, number>) => (lease: string) => ms[lease] ?? 0;

  it('holders with their remaining time, waiters, the highest token, lock-delay', () => {
    const v = view([entry('s1', 10, { mode: 'shared' }), entry('s2', 11, { mode: 'shared', lease: '8' }), entry('x', 12), entry('s3', 14, { mode: 'shared' })]);
    expect(inspectedLeases(v)).toEqual([SESSION, '8']);
    expect(keyState('job', v, remaining({ [SESSION]: 1_000, 8: 2_000 }))).toEqual({
      key: 'job',
      lastToken: 11n,
      holders: [
        { mode: 'shared', token: 10n, holder: 'holder-s1', expiresInMs: 1_000 },
        { mode: 'shared', token: 11n, holder: 'holder-s2', expiresInMs: 2_000 },
      ],
      waiters: 2,
      lockDelayRemainingMs: 0,
    });
  });

  it("an expired holder's lock-delay: its token counts, its time left is the delay; nothing at all is no state", () => {
    const v = view([marker('gone', 8, 20, '99'), entry('w', 21)]);
    expect(inspectedLeases(v)).toEqual(['99']);
    expect(keyState('job', v, remaining({ 99: 3_000 }))).toEqual({ key: 'job', lastToken: 20n, holders: [], waiters: 1, lockDelayRemainingMs: 3_000 });
    expect(keyState('job', view([marker('gone', 8, 20, '99')]), remaining({}))).toBeUndefined();
    expect(keyState('job', view([]), remaining({}))).toBeUndefined();
  });
});

describe('etcd view: semaphore permits', () => {
  const names = (es: readonly { encOwner: string }[] | undefined) => (es ?? []).map((e) => e.encOwner);

  it('a permit is a shared request under q/p/ with its limit in the value; a damaged limit reads as 1', () => {
    const v = view([permit('a', 10, 3), kv(layout.entry('shared', 'b', true), '{"h":"x"}', 11), entry('c', 12, { mode: 'shared' })]);
    expect(v.entries.map((e) => [e.encOwner, e.mode, e.limit])).toEqual([
      ['a', 'shared', 3],
      ['b', 'shared', 1],
      ['c', 'shared', undefined],
    ]);
    expect(layout.entry('shared', 'a', true)).toBe(`${layout.permits}a`);
    expect(layout.entry('exclusive', 'a', true)).toBe(layout.entry('exclusive', 'a')); // only a shared request is a permit
    expect(parseJson(kv('k', entryValue('h', false, true, 3), 1))).toEqual({ h: 'h', o: 0, g: 1, l: 3 });
  });

  it('the first N permits hold; a later one waits for the Nth ahead of it (the hand-off target), and holds once fewer than N are ahead', () => {
    const v = view([permit('a', 10, 3), permit('b', 11, 3), permit('c', 12, 3), permit('d', 13, 3), permit('e', 14, 3)]);
    expect(names(holders(v))).toEqual(['a', 'b', 'c']);
    expect(names(ahead(v, own(v, 'c'), 'shared', 3))).toEqual([]);
    expect(names(ahead(v, own(v, 'd'), 'shared', 3))).toEqual(['a']);
    expect(names(ahead(v, own(v, 'e'), 'shared', 3))).toEqual(['a', 'b']);
    expect(grantable(v, own(v, 'd'), 'shared', 3)).toBe(false);
    // not queued (tryAcquire): it would be the 6th
    expect(grantable(v, undefined, 'shared', 3)).toBe(false);
    expect(grantable(view([permit('a', 10, 3), permit('b', 11, 3)]), undefined, 'shared', 3)).toBe(true);
    // any permit ahead leaving frees a place, not only the oldest
    const bGone = view([permit('a', 10, 3), permit('c', 12, 3), permit('d', 13, 3), permit('e', 14, 3)]);
    expect(grantable(bGone, own(bGone, 'd'), 'shared', 3)).toBe(true);
    expect(names(holders(bGone))).toEqual(['a', 'c', 'd']);
    expect(keyState('job', v, () => 1_000)).toMatchObject({ limit: 3, waiters: 2, lastToken: 12n });
    expect(keyState('job', view([entry('s', 10, { mode: 'shared' })]), () => 1_000)).not.toHaveProperty('limit');
  });

  it('an exclusive request ahead blocks later permits; an exclusive one waits for every permit ahead', () => {
    const v = view([permit('a', 10, 3), entry('x', 11), permit('b', 12, 3)]);
    expect(names(holders(v))).toEqual(['a']);
    expect(names(ahead(v, own(v, 'b'), 'shared', 3))).toEqual(['x']);
    expect(names(ahead(v, own(v, 'x'), 'exclusive'))).toEqual(['a']);
    expect(grantable(view([permit('a', 10, 3)]), undefined, 'exclusive')).toBe(false);
  });

  it('shared requests of another kind block each other, and a holder of another kind is a conflict (refused, naming both)', () => {
    const v = view([permit('a', 10, 3), permit('b', 11, 5), entry('c', 12, { mode: 'shared' })]);
    expect(names(holders(v))).toEqual(['a']);
    expect(names(ahead(v, own(v, 'b'), 'shared', 5))).toEqual(['a']);
    expect(names(ahead(v, own(v, 'c'), 'shared'))).toEqual(['a', 'b']);
    expect(conflict(v, own(v, 'b'), 'shared', 5)?.encOwner).toBe('a');
    expect(conflict(v, undefined, 'shared', undefined)?.encOwner).toBe('a');
    expect(conflict(v, undefined, 'shared', 3)).toBeUndefined();
    expect(conflict(v, undefined, 'exclusive', undefined)).toBeUndefined(); // an exclusive request waits
    const plain = view([entry('s1', 10, { mode: 'shared' }), entry('s2', 11, { mode: 'shared' })]);
    expect(conflict(plain, undefined, 'shared', 2)?.encOwner).toBe('s1');
    expect(grantable(plain, undefined, 'shared', 2)).toBe(false);
    // permits queued behind an exclusive holder are no conflict yet: they wait
    expect(conflict(view([entry('x', 9), permit('a', 10, 3)]), undefined, 'shared', 5)).toBeUndefined();
    expect(conflictMessage('api:quota', 3, 5)).toBe('key "api:quota" is held as a semaphore of 3 permits; this request asks for 5 permits');
    expect(conflictMessage('k', undefined, 5)).toBe('key "k" is held by shared holders without a limit; this request asks for 5 permits');
    expect(conflictMessage('k', 3, undefined)).toBe('key "k" is held as a semaphore of 3 permits; this request asks for a shared lock without a limit');
  });

  it('holders (one pass over the queue) agree with ahead (per request) on any queue', () => {
    let seed = 42;
    const rand = (n: number): number => {
      seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31;
      return seed % n;
    };
    for (let round = 0; round < 500; round++) {
      const kvs: Kv[] = [];
      const size = rand(8);
      for (let i = 0; i < size; i++) {
        const kind = rand(5);
        if (kind === 0) kvs.push(entry(`n${i}`, 10 + i));
        else if (kind === 1) kvs.push(entry(`n${i}`, 10 + i, { mode: 'shared' }));
        else kvs.push(permit(`n${i}`, 10 + i, kind === 4 ? 1 : 2 + rand(2)));
      }
      const v = view(kvs);
      expect(names(holders(v))).toEqual(names(v.entries.filter((e) => ahead(v, e, e.mode, e.limit).length === 0)));
    }
  });

  it('guards: the first permit on a free key needs an empty queue; a plain shared grant needs no permit; a permit decided on a view, no plain shared request and no permit since', () => {
    const me = layout.entry('shared', 'me', true);
    const keyOf = (c: { key?: Buffer }) => c.key!.toString();
    expect(freeKeyGuards(layout, 'shared', me, 3).map((c) => [keyOf(c), c.target, c.result, c.create_revision])).toEqual([
      [me, 'Create', 'Equal', '0'],
      [layout.queue, 'Create', 'Equal', '0'],
      [layout.delays, 'Create', 'Equal', '0'],
    ]);
    expect(freeKeyGuards(layout, 'shared', layout.entry('shared', 'me')).map(keyOf)).toEqual([
      layout.entry('shared', 'me'),
      layout.exclusive,
      layout.delays,
      layout.permits,
    ]);
    const v = view([permit('a', 10, 3)], 40);
    expect(viewGuards(layout, v, 'shared', me, 3).map((c) => [keyOf(c), c.target, c.result, c.create_revision ?? c.mod_revision])).toEqual([
      [me, 'Create', 'Equal', '0'],
      [layout.exclusive, 'Create', 'Equal', '0'],
      [layout.delays, 'Mod', 'Less', '41'],
      [layout.shared, 'Create', 'Equal', '0'],
      [layout.permits, 'Create', 'Less', '41'],
    ]);
  });

  it('a permit waiter follows the lock: handed its grant when fewer than N permits are ahead, in any order of release', () => {
    const [a, b, c] = [permit('a', 10, 2), permit('b', 11, 2), permit('c', 12, 2)];
    const me = permit('me', 13, 2);
    const w = waiter(view([a, b, c, me]), 'me', 'shared');
    expect(watchTarget(w)).toMatchObject({ keys: [layout.entry('shared', 'b', true)], revisions: ['11'] }); // the 2nd ahead of it
    const f = follower(w);
    expect(f.apply([del(c)])).toBeUndefined(); // a and b still ahead
    expect(f.apply([del(a)])).toEqual({ token: 13n, session: SESSION });
  });

  it('a permit waiter whose turn comes with holders of another kind is woken (to be refused), never handed a grant', () => {
    const x = entry('x', 9);
    const f = follower(waiter(view([x, permit('a', 10, 5), permit('me', 11, 3)]), 'me', 'shared'));
    expect(f.apply([del(x)])).toBe('wake');
  });
});

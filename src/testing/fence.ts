/**
 * The fence conformance suite: every fence registers it against its real store (this repository's
 * in test/conformance/*.test.ts; a third party's through `leasehold/testing`). A harness gives the
 * fence and two mutations written in the store's own terms (a read-modify-write counter and an
 * append), so the suite can check that the check and the mutation commit together (I3).
 *
 * A test that needs what a harness says it lacks (`transactional: false`, no `fenceWith`) is
 * reported as skipped, with the reason: never as passed without having checked anything.
 */
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { InvalidArgumentError, StaleTokenError } from '../core/errors.js';
import type { Fence, FenceGuardOptions } from '../core/fence.js';
import { signSequencer } from '../core/sequencer-sign.js';
import { formatSequencer, MAX_TOKEN } from '../core/token.js';

/** What the suite needs to drive a fence: made once per suite, in `beforeAll`. */
export interface FenceHarness<Tx> {
  /** The fence under test, over a store the suite may write freely (resources are named `res:…`). */
  fence: Fence<Tx>;
  /** Read-modify-write inside the fence's transaction: reads the counter of `resource` and stores it + 1. */
  increment(tx: Tx, resource: string): unknown;
  /** Appends `value` to the log of `resource` inside the transaction. */
  append(tx: Tx, resource: string, value: string): unknown;
  counter(resource: string): Promise<number>;
  log(resource: string): Promise<string[]>;
  /** True when an error inside mutate undoes the mutation (stores with transactions). */
  transactional: boolean;
  /** True when mutate must run synchronously (better-sqlite3); the suite then never hands it a promise. */
  synchronous: boolean;
  /**
   * A fence over the same store made with the lock-key options every factory takes (the suite
   * compares marks only within the fence it made); optional for third-party fences (the per-call
   * `lockKey` is tested on every fence either way; without it the `requireSequencer` test is skipped).
   */
  fenceWith?(options: FenceGuardOptions): Fence<Tx>;
  /** Called once after the suite. */
  cleanup(): Promise<void>;
}

/** The checker used on every concurrent history: accepted tokens never decrease, and nothing is lost. */
function checkHistory(accepted: bigint[], counter: number, log: string[]): string[] {
  const problems: string[] = [];
  for (let i = 1; i < accepted.length; i++) {
    if (accepted[i]! < accepted[i - 1]!) problems.push(`token ${accepted[i]} accepted after ${accepted[i - 1]}`);
  }
  if (counter !== accepted.length) problems.push(`counter is ${counter} but ${accepted.length} writes were accepted (lost update)`);
  if (log.length !== accepted.length) problems.push(`log has ${log.length} entries for ${accepted.length} accepted writes`);
  return problems;
}

/**
 * Concurrent writers with shuffled tokens on one resource: records the order in which writes
 * were accepted (read back from the log written inside the transaction) and checks it.
 */
async function contend<Tx>(
  h: Pick<FenceHarness<Tx>, 'fence' | 'increment' | 'append' | 'counter' | 'log' | 'synchronous'>,
  resource: string,
  writers: number,
): Promise<{ problems: string[]; accepted: number; refused: number }> {
  const tokens = Array.from({ length: writers }, (_, i) => BigInt(i + 1));
  for (let i = tokens.length - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1));
    [tokens[i], tokens[j]] = [tokens[j]!, tokens[i]!];
  }
  let refused = 0;
  await Promise.all(
    tokens.map(async (t) => {
      try {
        await h.fence.write(resource, t, (tx) =>
          steps(
            h,
            () => h.increment(tx, resource),
            () => h.append(tx, resource, t.toString()),
          ),
        );
      } catch (error) {
        if (!(error instanceof StaleTokenError)) throw error;
        refused++;
      }
    }),
  );
  const log = await h.log(resource);
  const accepted = log.map((v) => BigInt(v));
  return { problems: checkHistory(accepted, await h.counter(resource), log), accepted: accepted.length, refused };
}

/** Runs mutation steps in order: synchronously for synchronous fences, awaiting each otherwise. */
function steps(h: { synchronous: boolean }, ...fns: (() => unknown)[]): unknown {
  if (h.synchronous) {
    for (const f of fns) f();
    return undefined;
  }
  return (async () => {
    for (const f of fns) await f();
  })();
}

export function fenceConformance<Tx>(name: string, make: () => Promise<FenceHarness<Tx>>): void {
  describe(`fence conformance: ${name}`, () => {
    let h: FenceHarness<Tx>;
    let n = 0;
    const res = (label: string): string => `res:${label}:${++n}`;

    beforeAll(async () => {
      h = await make();
    });
    afterAll(async () => {
      await h?.cleanup();
    });

    it('I3: accepts a first token, the same token again and higher ones; refuses lower ones and changes nothing', async () => {
      const r = res('basic');
      expect(await h.fence.highest(r)).toBeNull();
      expect(await h.fence.write(r, 5n, (tx) => (h.append(tx, r, 'five'), 'ok'))).toBe('ok');
      expect(await h.fence.highest(r)).toBe(5n);
      await h.fence.write(r, 5n, (tx) => h.append(tx, r, 'five again'));
      await h.fence.write(r, 7n, (tx) => h.append(tx, r, 'seven'));
      const refused = await h.fence.write(r, 6n, (tx) => h.append(tx, r, 'six')).catch((e: unknown) => e);
      expect(refused).toBeInstanceOf(StaleTokenError);
      expect(refused).toMatchObject({ code: 'STALE_TOKEN', resource: r, token: 6n, highest: 7n, name: 'StaleTokenError' });
      expect(await h.fence.highest(r)).toBe(7n);
      expect(await h.log(r)).toEqual(['five', 'five again', 'seven']);
    });

    it('a refused write never runs mutate', async () => {
      const r = res('norun');
      await h.fence.write(r, 10n, () => {});
      let ran = false;
      await expect(
        h.fence.write(r, 9n, () => {
          ran = true;
        }),
      ).rejects.toBeInstanceOf(StaleTokenError);
      expect(ran).toBe(false);
    });

    it('resources are independent', async () => {
      const a = res('a');
      const b = res('b');
      await h.fence.write(a, 100n, () => {});
      await h.fence.write(b, 1n, () => {});
      expect(await h.fence.highest(a)).toBe(100n);
      expect(await h.fence.highest(b)).toBe(1n);
    });

    it('takes the token as a bigint, a decimal string or a sequencer', async () => {
      const r = res('inputs');
      await h.fence.write(r, 3n, () => {});
      await h.fence.write(r, '4', () => {});
      await h.fence.write(r, formatSequencer('tenant:42:export', 'exclusive', 5n), () => {});
      expect(await h.fence.highest(r)).toBe(5n);
      await expect(h.fence.write(r, formatSequencer('x', 'shared', 4n), () => {})).rejects.toBeInstanceOf(StaleTokenError);
      await h.fence.write(r, MAX_TOKEN, () => {});
      expect(await h.fence.highest(r)).toBe(MAX_TOKEN);
    });

    it('bad tokens, resources and mutations are refused with InvalidArgumentError and change nothing', async () => {
      const r = res('bad');
      await h.fence.write(r, 2n, () => {});
      for (const bad of [
        0n,
        -1n,
        MAX_TOKEN + 1n,
        '',
        '01',
        '1.5',
        '-3',
        ' 3',
        '3 ',
        'lh1.e.x.YQ',
        'lh9.e.3.YQ',
        'nonsense',
        3 as unknown as bigint,
        null as unknown as bigint,
      ]) {
        await expect(
          h.fence.write(r, bad, () => {}),
          `token ${String(bad)}`,
        ).rejects.toBeInstanceOf(InvalidArgumentError);
      }
      await expect(h.fence.write('', 3n, () => {})).rejects.toMatchObject({ argument: 'resource' });
      await expect(h.fence.write(r, 3n, 'not a function' as never)).rejects.toMatchObject({ argument: 'mutate' });
      await expect(h.fence.highest(42 as never)).rejects.toBeInstanceOf(InvalidArgumentError);
      expect(await h.fence.highest(r)).toBe(2n);
    });

    it('an error inside mutate reaches the caller unchanged and leaves the mark where it was', async () => {
      const r = res('throw');
      await h.fence.write(r, 1n, (tx) => h.append(tx, r, 'one'));
      const own = new Error('mine');
      const caught = await h.fence
        .write(r, 2n, (tx) =>
          steps(
            h,
            () => h.append(tx, r, 'two'),
            () => {
              throw own;
            },
          ),
        )
        .catch((e: unknown) => e);
      expect(caught).toBe(own);
      expect(await h.fence.highest(r)).toBe(1n);
      // the failed token can still be used: nothing was raised
      await h.fence.write(r, 2n, (tx) => h.append(tx, r, 'two, retried'));
      expect(await h.fence.highest(r)).toBe(2n);
    });

    it('an error inside mutate undoes what mutate wrote (stores with transactions)', async (ctx) => {
      if (!h.transactional) return ctx.skip('the harness says its store has no transactions (transactional: false)');
      const r = res('undo');
      await h.fence.write(r, 1n, (tx) => h.append(tx, r, 'one'));
      const own = new Error('mine');
      const caught = await h.fence
        .write(r, 2n, (tx) =>
          steps(
            h,
            () => h.append(tx, r, 'two'),
            () => {
              throw own;
            },
          ),
        )
        .catch((e: unknown) => e);
      expect(caught).toBe(own);
      expect(await h.log(r)).toEqual(['one']);
      expect(await h.fence.highest(r)).toBe(1n);
    });

    it('concurrent writers: accepted tokens never decrease and no increment is lost', async () => {
      const r = res('concurrent');
      const result = await contend(h, r, 40);
      expect(result.problems).toEqual([]);
      expect(result.accepted + result.refused).toBe(40);
      expect(result.accepted).toBeGreaterThan(0);
    });

    it('lockKey per call: a sequencer of another lock is refused (InvalidArgumentError naming token and both keys), nothing changed', async () => {
      const r = res('lockkey-call');
      const own = `lock:${r}`;
      await h.fence.write(r, formatSequencer(own, 'exclusive', 3n), (tx) => h.append(tx, r, 'own'), { lockKey: own });
      let ran = false;
      // a lock whose numbers run far ahead (another backend, another key) must not take the resource
      const e = await h.fence
        .write(r, formatSequencer('other-lock', 'exclusive', 900n), (tx) => ((ran = true), h.append(tx, r, 'other')), { lockKey: own })
        .catch((x: unknown) => x);
      expect(e).toBeInstanceOf(InvalidArgumentError);
      expect(e).toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'token', retryable: false });
      expect((e as Error).message).toContain(JSON.stringify(own));
      expect((e as Error).message).toContain('"other-lock"');
      expect(ran).toBe(false);
      expect(await h.fence.highest(r)).toBe(3n);
      expect(await h.log(r)).toEqual(['own']);
      // the right lock's next grant still writes: the refusal raised nothing
      await h.fence.write(r, formatSequencer(own, 'exclusive', 4n), (tx) => h.append(tx, r, 'own again'), { lockKey: own });
      // a bare token names no lock: accepted unchecked unless the fence has requireSequencer
      await h.fence.write(r, 5n, (tx) => h.append(tx, r, 'bare'), { lockKey: own });
      expect(await h.fence.highest(r)).toBe(5n);
      expect(await h.log(r)).toEqual(['own', 'own again', 'bare']);
      // bad options are refused before anything runs
      for (const [bad, argument] of [
        [{ lockKey: '' }, 'options.lockKey'],
        [{ lockkey: own }, 'options.lockkey'],
        ['lock', 'options'],
      ] as const) {
        await expect(
          h.fence.write(r, 6n, () => {}, bad as never),
          argument,
        ).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', argument });
      }
      expect(await h.fence.highest(r)).toBe(5n);
    });

    it('lockKey factory option: each resource checked against its own lock; nothing changed on refusal', async () => {
      const r = res('lockkey-option');
      const free = res('lockkey-free');
      const lockOf = (resource: string): string | undefined => (resource === r ? `lock:${r}` : undefined);
      // A harness without fenceWith (third-party fences) gets the same per-resource checks through the per-call option.
      const guarded: Fence<Tx> = h.fenceWith
        ? h.fenceWith({ lockKey: lockOf })
        : {
            write: (x, t, m, o) => h.fence.write(x, t, m, o ?? (lockOf(x) === undefined ? undefined : { lockKey: lockOf(x)! })),
            highest: (x) => h.fence.highest(x),
          };
      await guarded.write(r, formatSequencer(`lock:${r}`, 'exclusive', 2n), (tx) => h.append(tx, r, 'own'));
      await expect(guarded.write(r, formatSequencer('other-lock', 'shared', 2n), (tx) => h.append(tx, r, 'other'))).rejects.toMatchObject({
        argument: 'token',
      });
      // the call's lockKey overrides the option
      await guarded.write(r, formatSequencer('renamed', 'exclusive', 3n), (tx) => h.append(tx, r, 'renamed'), { lockKey: 'renamed' });
      // a resource the function gives no lock for is not checked
      await guarded.write(free, formatSequencer('anything', 'exclusive', 7n), () => {});
      expect(await guarded.highest(r)).toBe(3n);
      expect(await h.log(r)).toEqual(['own', 'renamed']);
    });

    it('requireSequencer refuses bare tokens; a lockKey function answering a non-string and bad factory options are refused (harnesses with fenceWith)', async (ctx) => {
      const fenceWith = h.fenceWith;
      if (!fenceWith) return ctx.skip('the harness has no fenceWith(options): the factory options cannot be given');
      const r = res('require-sequencer');
      const free = res('require-sequencer-free');
      const lockOf = (resource: string): string | undefined => (resource === r ? `lock:${r}` : undefined);
      const strict = fenceWith({ lockKey: lockOf, requireSequencer: true });
      await expect(strict.write(r, 10n, (tx) => h.append(tx, r, 'bare'))).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'token' });
      await expect(strict.write(r, '10', (tx) => h.append(tx, r, 'bare'))).rejects.toMatchObject({ argument: 'token' });
      await strict.write(free, 8n, () => {}); // no lock known for it: a bare token is fine
      await strict.write(r, formatSequencer(`lock:${r}`, 'exclusive', 4n), (tx) => h.append(tx, r, 'own, strict'));
      expect(await strict.highest(r)).toBe(4n);
      expect(await h.log(r)).toEqual(['own, strict']);

      const weird = fenceWith({ lockKey: () => 42 as unknown as string });
      await expect(weird.write(r, formatSequencer(`lock:${r}`, 'exclusive', 5n), () => {})).rejects.toMatchObject({ argument: 'lockKey' });
      expect(() => fenceWith({ lockKey: 'lock:x' as never })).toThrow(InvalidArgumentError);
      expect(() => fenceWith({ requireSequencer: 'yes' as never })).toThrow(InvalidArgumentError);
      expect(await strict.highest(r)).toBe(4n);
      expect(await h.log(r)).toEqual(['own, strict']);
    });

    it('sequencerKey: only sequencers signed with the key are written; bare tokens, unsigned, forged and altered sequencers are refused (InvalidArgumentError naming token), nothing changed (harnesses with fenceWith)', async (ctx) => {
      const fenceWith = h.fenceWith;
      if (!fenceWith) return ctx.skip('the harness has no fenceWith(options): the factory options cannot be given');
      const r = res('signed');
      const lock = `lock:${r}`;
      const secret = randomBytes(32);
      const signed = (key: string, token: bigint, mode: 'exclusive' | 'shared' = 'exclusive'): string =>
        signSequencer(formatSequencer(key, mode, token), secret);
      const strict = fenceWith({ sequencerKey: secret });
      const genuine = signed(lock, 3n);
      await strict.write(r, genuine, (tx) => h.append(tx, r, 'genuine'));
      const [, , , encodedKey, mac] = genuine.split('.');
      const otherKey = Buffer.from('other-lock').toString('base64url');
      const refused: [bigint | string, string][] = [
        [900n, 'a bare bigint'],
        ['900', 'a decimal token'],
        [formatSequencer(lock, 'exclusive', 900n), 'an unsigned sequencer'],
        [signSequencer(formatSequencer(lock, 'exclusive', 900n), randomBytes(32)), 'a sequencer signed with another key'],
        [`lh1s.e.900.${encodedKey}.${mac}`, 'a genuine signature on a raised token'],
        [`lh1s.s.3.${encodedKey}.${mac}`, 'a genuine signature on another mode'],
        [`lh1s.e.3.${otherKey}.${mac}`, 'a genuine signature on another key'],
        [`lh1.e.900.${encodedKey}.${mac}`, 'the signed fields under the unsigned tag'],
        [`lh1s.e.900.${encodedKey}`, 'the signed tag without a signature'],
      ];
      for (const [token, what] of refused) {
        let ran = false;
        const e = await strict.write(r, token, (tx) => ((ran = true), h.append(tx, r, what))).catch((x: unknown) => x);
        expect(e, what).toBeInstanceOf(InvalidArgumentError);
        expect(e, what).toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'token' });
        expect(ran, what).toBe(false);
      }
      expect(await strict.highest(r)).toBe(3n);
      expect(await h.log(r)).toEqual(['genuine']);
      // the signature adds to the token check, it does not replace it (I3)
      await expect(strict.write(r, signed(lock, 2n), (tx) => h.append(tx, r, 'stale'))).rejects.toBeInstanceOf(StaleTokenError);
      await strict.write(r, signed(lock, 3n, 'shared'), (tx) => h.append(tx, r, 'shared'));

      // rotation: any of the keys verifies; an Ed25519 public key verifies what its private key signed
      const pair = generateKeyPairSync('ed25519');
      const rotated = fenceWith({ sequencerKey: [pair.publicKey, secret] });
      await rotated.write(r, signSequencer(formatSequencer(lock, 'exclusive', 4n), pair.privateKey), (tx) => h.append(tx, r, 'ed25519'));
      await rotated.write(r, signed(lock, 5n), (tx) => h.append(tx, r, 'old key'));
      await expect(
        rotated.write(r, signSequencer(formatSequencer(lock, 'exclusive', 6n), generateKeyPairSync('ed25519').privateKey), () => {}),
      ).rejects.toMatchObject({
        argument: 'token',
      });
      // with lockKey: a genuine sequencer of another lock is still refused
      const guarded = fenceWith({ sequencerKey: secret, lockKey: (x) => (x === r ? lock : undefined) });
      await expect(guarded.write(r, signed('other-lock', 7n), () => {})).rejects.toMatchObject({ argument: 'token' });
      expect(await rotated.highest(r)).toBe(5n);
      expect(await h.log(r)).toEqual(['genuine', 'shared', 'ed25519', 'old key']);

      // a fence without a key reads a signed sequencer like any other (its signature unchecked)
      const plain = res('signed-plain');
      await h.fence.write(plain, signed('anything', 8n), () => {});
      expect(await h.fence.highest(plain)).toBe(8n);

      // bad keys fail the factory, before any write
      for (const bad of [randomBytes(16), 'not a key', '', 42, []]) {
        expect(() => fenceWith({ sequencerKey: bad as never }), String(bad)).toThrow(expect.objectContaining({ argument: 'options.sequencerKey' }));
      }
    });

    it('the checker catches a fence that ignores tokens (the mutant must fail)', async () => {
      const r = res('mutant');
      const ignoring: Fence<Tx> = {
        // a broken fence: runs every mutation, checks nothing
        write: (resource, _token, mutate) => h.fence.write(resource, 1n, mutate),
        highest: (resource) => h.fence.highest(resource),
      };
      const result = await contend({ ...h, fence: ignoring }, r, 20);
      expect(result.problems.length).toBeGreaterThan(0);
    });
  });
}

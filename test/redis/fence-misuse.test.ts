/**
 * redisFence against a `mutate` that misuses the MULTI it is handed (issue 13, item 4), with both
 * drivers, on the local Redis: the misuse is a typed, non-retryable error, and the mark and the
 * data agree afterwards (I3: a stale token is still refused).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { createClient } from 'redis';
import { InvalidArgumentError, StaleTokenError } from '../../src/core/errors.js';
import { formatSequencer } from '../../src/core/token.js';
import { redisFence } from '../../src/redis/index.js';
import { uniqueName } from '../helpers/env.js';
import { deleteKeys, REDIS_URL } from './servers.js';

const ns = `${uniqueName('lhfmis')}:`;
const admin = new Redis(REDIS_URL);
const io = new Redis(REDIS_URL);
const node = createClient({ url: REDIS_URL });
node.on('error', () => {});

beforeAll(async () => {
  await node.connect();
});
afterAll(async () => {
  await deleteKeys(REDIS_URL, ns);
  admin.disconnect();
  io.disconnect();
  await node.close();
});

/** Loosely typed MULTI: ioredis and node-redis name commands differently (rpush / rPush). */
type AnyMulti = Record<string, (...args: unknown[]) => unknown>;

const drivers = [
  {
    name: 'ioredis',
    fence: (opts: Record<string, unknown> = {}) => redisFence(io, { prefix: `${ns}io:mark:`, ...opts }),
    push: (tx: AnyMulti, key: string, v: string) => tx.rpush!(key, v),
    raw: (tx: AnyMulti, ...args: string[]) => tx.call!(...args),
  },
  {
    name: 'node-redis',
    fence: (opts: Record<string, unknown> = {}) => redisFence(node, { prefix: `${ns}nr:mark:`, ...opts }),
    push: (tx: AnyMulti, key: string, v: string) => tx.rPush!(key, v),
    raw: (tx: AnyMulti, ...args: string[]) => tx.addCommand!(args),
  },
];

let n = 0;
for (const d of drivers) {
  describe(`redisFence misuse (${d.name})`, () => {
    const fence = d.fence();
    afterAll(() => fence.close());
    const names = () => {
      const id = `${d.name}:${++n}`;
      return { r: `res:${id}`, log: `${ns}log:${id}` };
    };
    const log = (key: string) => admin.lrange(key, 0, -1);

    it('a mutate that runs EXEC itself is refused; the mark is not lowered and a stale token stays refused', async () => {
      const { r, log: key } = names();
      let execError: unknown;
      const outcome = await fence
        .write(r, 20n, async (tx) => {
          d.push(tx as AnyMulti, key, 'twenty');
          try {
            await (tx as AnyMulti).exec!();
          } catch (error) {
            execError = error; // a careless mutate swallows it
          }
          // meanwhile a newer holder writes
          await fence.write(r, 30n, (tx2) => d.push(tx2 as AnyMulti, key, 'thirty'));
        })
        .catch((e: unknown) => e);
      expect(execError).toBeInstanceOf(InvalidArgumentError);
      expect(outcome).toBeInstanceOf(InvalidArgumentError);
      expect(outcome).toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'mutate', retryable: false });
      expect(await fence.highest(r)).toBe(30n);
      expect(await log(key)).toEqual(['thirty']);
      await expect(fence.write(r, 25n, (tx) => d.push(tx as AnyMulti, key, 'twenty-five'))).rejects.toBeInstanceOf(StaleTokenError);
      expect(await log(key)).toEqual(['thirty']);
    });

    it('an EXEC reached through a chained command is refused too', async () => {
      const { r, log: key } = names();
      await fence.write(r, 5n, () => {});
      const e = await fence.write(r, 6n, (tx) => (d.push(tx as AnyMulti, key, 'x') as AnyMulti).exec!()).catch((x: unknown) => x);
      expect(e).toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'mutate' });
      expect(await fence.highest(r)).toBe(5n);
      expect(await log(key)).toEqual([]);
    });

    it('an EXEC kept for later (after write settled) is refused and changes nothing', async () => {
      const { r, log: key } = names();
      let kept: AnyMulti | undefined;
      await fence.write(r, 20n, (tx) => {
        kept = tx as AnyMulti;
        d.push(tx as AnyMulti, key, 'twenty');
      });
      await fence.write(r, 30n, () => {});
      await expect(Promise.resolve().then(() => kept!.exec!())).rejects.toBeInstanceOf(InvalidArgumentError);
      expect(await fence.highest(r)).toBe(30n);
      expect(await log(key)).toEqual(['twenty']);
    });

    for (const method of ['discard', 'watch', 'unwatch', 'multi', 'select']) {
      it(`a mutate that calls ${method} (method or raw command) is refused with nothing sent`, async () => {
        const { r, log: key } = names();
        await fence.write(r, 1n, () => {});
        const args = method === 'select' ? [1] : method === 'watch' ? [key] : [];
        const e = await fence
          .write(r, 2n, (tx) => {
            d.push(tx as AnyMulti, key, 'x');
            // node-redis's MULTI has no discard/watch/unwatch/multi methods: send them as raw commands
            const m = (tx as AnyMulti)[method];
            if (typeof m === 'function') m.apply(tx, args);
            else d.raw(tx as AnyMulti, method.toUpperCase(), ...args.map(String));
          })
          .catch((x: unknown) => x);
        expect(e, method).toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'mutate', retryable: false });
        expect(await fence.highest(r)).toBe(1n);
        expect(await log(key)).toEqual([]);
        // the fence's connections still work on the right database
        await fence.write(r, 3n, (tx) => d.push(tx as AnyMulti, key, 'three'));
        expect(await fence.highest(r)).toBe(3n);
        expect(await log(key)).toEqual(['three']);
      });
    }

    it('EXEC or SELECT sent as a raw command is refused as well', async () => {
      const { r, log: key } = names();
      for (const cmd of [['EXEC'], ['select', '2'], ['MULTI']]) {
        const e = await fence.write(r, 2n, (tx) => void d.raw(tx as AnyMulti, ...cmd)).catch((x: unknown) => x);
        expect(e, cmd.join(' ')).toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'mutate' });
      }
      expect(await fence.highest(r)).toBeNull();
      expect(await log(key)).toEqual([]);
    });

    it('a queued command that Redis rejects when queueing (EXECABORT) is InvalidArgumentError and nothing ran', async () => {
      const { r, log: key } = names();
      await fence.write(r, 1n, () => {});
      const e = await fence
        .write(r, 2n, (tx) => {
          d.push(tx as AnyMulti, key, 'x');
          d.raw(tx as AnyMulti, 'NOSUCHCOMMAND', 'a');
        })
        .catch((x: unknown) => x);
      expect(e).toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'mutate', retryable: false });
      expect(await fence.highest(r)).toBe(1n);
      expect(await log(key)).toEqual([]);
    });

    it('a queued command that fails in EXEC (WRONGTYPE) is PartialWriteError: the mark was raised and the others ran', async () => {
      const { r, log: key } = names();
      const str = `${ns}str:${d.name}`;
      await admin.set(str, 'not a list');
      const e = await fence
        .write(r, 7n, (tx) => {
          d.push(tx as AnyMulti, key, 'ran');
          d.push(tx as AnyMulti, str, 'fails');
        })
        .catch((x: unknown) => x);
      expect(e).toMatchObject({ name: 'PartialWriteError', code: 'PARTIAL_WRITE', retryable: false, resource: r, token: 7n });
      expect(e).not.toBeInstanceOf(InvalidArgumentError); // whose contract is "nothing was changed"
      expect((e as Error).cause).toBeInstanceOf(Error);
      expect(await fence.highest(r)).toBe(7n);
      expect(await log(key)).toEqual(['ran']);
    });

    it('lockKey (factory option and per call): a sequencer of another lock is refused and changes nothing', async () => {
      const guarded = d.fence({ lockKey: (resource: string) => (resource.startsWith('doc:') ? `lock:${resource}` : undefined) });
      try {
        const { log: key } = names();
        const r = `doc:${d.name}:${++n}`;
        await guarded.write(r, formatSequencer(`lock:${r}`, 'exclusive', 3n), (tx) => d.push(tx as AnyMulti, key, 'own'));
        const e = await guarded
          .write(r, formatSequencer('some-other-lock', 'exclusive', 900n), (tx) => d.push(tx as AnyMulti, key, 'other'))
          .catch((x: unknown) => x);
        expect(e).toBeInstanceOf(InvalidArgumentError);
        expect(e).toMatchObject({ argument: 'token' });
        expect((e as Error).message).toContain(`lock:${r}`);
        expect((e as Error).message).toContain('some-other-lock');
        // per call, on an unguarded fence
        const e2 = await fence.write(r, formatSequencer('some-other-lock', 'exclusive', 900n), () => {}, { lockKey: `lock:${r}` }).catch((x: unknown) => x);
        expect(e2).toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'token' });
        expect(await guarded.highest(r)).toBe(3n);
        expect(await log(key)).toEqual(['own']);
      } finally {
        await guarded.close();
      }
    });
  });
}

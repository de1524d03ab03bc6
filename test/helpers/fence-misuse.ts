/**
 * The cases of a SQL fence against a `mutate` that misuses the pooled client it is handed, shared
 * by test/postgres/fence-misuse.test.ts and test/mysql/fence-misuse.test.ts: a statement that ends
 * or opens the transaction, a call that gives the client away, the client kept after the write,
 * mutate's own savepoints, and (on a client that runs several statements in one string) a ROLLBACK
 * or COMMIT hidden among other statements. What only one store has stays in its own file.
 */
import { expect, it } from 'vitest';
import { InvalidArgumentError, StaleTokenError } from '../../src/core/errors.js';
import type { Fence } from '../../src/core/fence.js';

/** The few methods of a fence's pooled client these cases call. */
export interface MisusedClient {
  query(sql: string): Promise<unknown>;
  release(): void;
}

export interface FenceMisuseStore<Tx extends MisusedClient> {
  /** The fence under test, on a pool of 4 clients. */
  fence: Fence<Tx>;
  /** Inserts one row (r, v) into the test's items table through `tx`. */
  insert(tx: Tx, r: string, v: string): Promise<unknown>;
  /** The same INSERT as SQL text with its values inlined, to hide among other statements. */
  insertSql(r: string, v: string): string;
  /** The values of r's rows in the items table, committed ones only, in insertion order. */
  items(r: string): Promise<string[]>;
  /** Statements that end or open the transaction, refused before they run: [label, sql]. */
  endingStatements: readonly (readonly [label: string, sql: string])[];
  /** Checks after a refused statement beside the mark and the items (that its effect is absent). */
  afterRefusal?(): Promise<void>;
  /** Methods of the client that give it away or end its transaction, each refused. */
  givingAway: readonly string[];
  /** Checks after a refused give-away beside the four writes at once (the pool's own counts). */
  afterGiveAway?(): void;
}

/** The cases of statements and calls refused before they run, and of what is let through. */
export function refusedMisuseCases<Tx extends MisusedClient>(store: FenceMisuseStore<Tx>): void {
  const { fence, insert, items } = store;
  let n = 0;
  const res = (label: string): string => `res:shared:${label}:${++n}`;

  for (const [label, sql] of store.endingStatements) {
    it(`a mutate that runs ${label} is refused: InvalidArgumentError, nothing committed`, async () => {
      const r = res(label);
      await fence.write(r, 1n, (tx) => insert(tx, r, 'one'));
      let refused: unknown;
      const e = await fence
        .write(r, 2n, async (tx) => {
          await insert(tx, r, 'two');
          await tx.query(sql).catch((x: unknown) => {
            refused = x; // a careless mutate swallows it
          });
          await insert(tx, r, 'two, after');
        })
        .catch((x: unknown) => x);
      expect(refused, label).toBeInstanceOf(InvalidArgumentError);
      expect(e, label).toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'mutate', retryable: false });
      expect(await fence.highest(r)).toBe(1n);
      expect(await items(r)).toEqual(['one']);
      await store.afterRefusal?.();
      // the pool is healthy and the token still usable
      await fence.write(r, 2n, (tx) => insert(tx, r, 'two, retried'));
      expect(await items(r)).toEqual(['one', 'two, retried']);
    });
  }

  for (const method of store.givingAway) {
    it(`a mutate that calls ${method}() is refused: InvalidArgumentError, nothing committed, the pool stays healthy`, async () => {
      const r = res(method);
      const e = await fence
        .write(r, 3n, async (tx) => {
          await insert(tx, r, 'three');
          const call = (tx as unknown as Record<string, (...a: unknown[]) => unknown>)[method]!;
          await Promise.resolve()
            .then(() => call.call(tx, { user: 'root' })) // the argument is changeUser's; the others ignore it
            .catch(() => {}); // a careless mutate swallows the refusal
        })
        .catch((x: unknown) => x);
      expect(e).toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'mutate', retryable: false });
      expect((e as Error).message).toContain(`${method}()`);
      expect(await fence.highest(r)).toBeNull();
      expect(await items(r)).toEqual([]);
      // every pooled client still works (none released twice, none left inside a transaction)
      await Promise.all([1, 2, 3, 4].map((i) => fence.write(`${r}:${i}`, 1n, (tx) => insert(tx, `${r}:${i}`, 'ok'))));
      for (const i of [1, 2, 3, 4]) expect(await items(`${r}:${i}`)).toEqual(['ok']);
      store.afterGiveAway?.();
    });
  }

  it("the client kept after write settled is refused (it is back in the pool, maybe in another writer's transaction)", async () => {
    const r = res('kept');
    let kept: Tx | undefined;
    await fence.write(r, 1n, (tx) => {
      kept = tx;
    });
    await expect(insert(kept!, r, 'late')).rejects.toBeInstanceOf(InvalidArgumentError);
    expect(() => kept!.release()).toThrow(InvalidArgumentError);
    expect(await items(r)).toEqual([]);
  });

  it("mutate's own savepoints work as before", async () => {
    const r = res('savepoint');
    await fence.write(r, 1n, async (tx) => {
      await insert(tx, r, 'kept');
      await tx.query('SAVEPOINT mine');
      await insert(tx, r, 'undone');
      await tx.query('ROLLBACK TO SAVEPOINT mine');
      await tx.query('RELEASE SAVEPOINT mine');
    });
    expect(await items(r)).toEqual(['kept']);
    expect(await fence.highest(r)).toBe(1n);
  });
}

/**
 * The cases of a transaction's end hidden in one multi-statement string, on `fence` (whose client
 * runs such strings: PostgreSQL's always, MySQL's with `multipleStatements`).
 */
export function hiddenMisuseCases<Tx extends MisusedClient>(store: FenceMisuseStore<Tx>, fence: Fence<Tx> = store.fence): void {
  const { insert, insertSql, items } = store;
  let n = 0;
  const res = (label: string): string => `res:shared-hidden:${label}:${++n}`;

  it('a ROLLBACK and BEGIN hidden in one multi-statement string are caught before COMMIT: InvalidArgumentError, nothing committed', async () => {
    const r = res('hidden-rollback');
    await fence.write(r, 1n, (tx) => insert(tx, r, 'one'));
    const e = await fence.write(r, 2n, (tx) => tx.query(`${insertSql(r, 'before')}; ROLLBACK; BEGIN; ${insertSql(r, 'after')}`)).catch((x: unknown) => x);
    expect(e).toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'mutate', retryable: false });
    expect(await fence.highest(r)).toBe(1n);
    expect(await items(r)).toEqual(['one']);
  });

  it('a COMMIT hidden in one multi-statement string: PartialWriteError, the mark and the data it committed agree', async () => {
    const r = res('hidden-commit');
    await fence.write(r, 1n, (tx) => insert(tx, r, 'one'));
    const e = await fence.write(r, 2n, (tx) => tx.query(`${insertSql(r, 'before')}; COMMIT`)).catch((x: unknown) => x);
    expect(e).toMatchObject({ name: 'PartialWriteError', code: 'PARTIAL_WRITE', retryable: false, resource: r, token: 2n });
    expect(await fence.highest(r)).toBe(2n);
    expect(await items(r)).toEqual(['one', 'before']);
    await expect(fence.write(r, 1n, () => {})).rejects.toBeInstanceOf(StaleTokenError);
  });
}

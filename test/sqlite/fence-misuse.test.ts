/**
 * sqliteFence against a `mutate` that misuses what it is handed (issue 13, item 4): ending the
 * transaction itself, returning a thenable, closing the database. Each is a typed, non-retryable
 * error, and the mark and the data agree afterwards. (memoryFence: test/memory/fence-misuse.test.ts.)
 */
import Database from 'better-sqlite3';
import { describe, expect, it } from 'vitest';
import { InvalidArgumentError, StaleTokenError } from '../../src/core/errors.js';
import { sqliteFence, type SqliteDatabase } from '../../src/sqlite/index.js';

function setup(): { db: Database.Database; fence: ReturnType<typeof sqliteFence>; data: () => number[] } {
  const db = new Database(':memory:');
  db.exec('CREATE TABLE data (v INTEGER)');
  return { db, fence: sqliteFence(db), data: () => db.prepare('SELECT v FROM data ORDER BY rowid').pluck().all() as number[] };
}
const ins = (tx: SqliteDatabase, v: number) => tx.prepare('INSERT INTO data VALUES (?)').run(v);

describe('sqliteFence misuse', () => {
  const ending: [string, (tx: SqliteDatabase) => unknown][] = [
    ['exec COMMIT', (tx) => tx.exec('COMMIT')],
    ['exec ROLLBACK', (tx) => tx.exec('ROLLBACK')],
    ['prepare(COMMIT).run()', (tx) => tx.prepare('commit').run()],
    ['prepare(END).run()', (tx) => tx.prepare(' -- done\n END TRANSACTION').run()],
    ['exec BEGIN', (tx) => tx.exec('BEGIN')],
    ['close()', (tx) => tx.close()],
  ];
  for (const [label, misuse] of ending) {
    it(`a mutate that runs ${label} is InvalidArgumentError (not retryable), nothing committed`, async () => {
      const { db, fence, data } = setup();
      await fence.write('r', 1n, (tx) => ins(tx, 1));
      let thrown: unknown;
      const e = await fence
        .write('r', 2n, (tx) => {
          ins(tx, 2);
          try {
            misuse(tx);
          } catch (x) {
            thrown = x; // a careless mutate swallows it
          }
          ins(tx, 3);
        })
        .catch((x: unknown) => x);
      expect(thrown, label).toBeInstanceOf(InvalidArgumentError);
      expect(e, label).toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'mutate', retryable: false });
      expect(db.open).toBe(true);
      expect(db.inTransaction).toBe(false);
      expect(await fence.highest('r')).toBe(1n);
      expect(data()).toEqual([1]);
      await fence.write('r', 2n, (tx) => ins(tx, 2));
      expect(data()).toEqual([1, 2]);
      db.close();
    });
  }

  it("inside the caller's own transaction, a mutate's COMMIT is refused and the caller's transaction stays open", async () => {
    const { db, fence, data } = setup();
    db.exec('BEGIN');
    ins(db, 10);
    const e = await fence
      .write('r', 1n, (tx) => {
        ins(tx, 11);
        tx.exec('COMMIT');
      })
      .catch((x: unknown) => x);
    expect(e).toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'mutate' });
    expect(db.inTransaction).toBe(true);
    db.exec('ROLLBACK');
    expect(data()).toEqual([]);
    expect(await fence.highest('r')).toBeNull();
    db.close();
  });

  it('a thenable without .catch is InvalidArgumentError naming mutate (not BackendUnavailableError), nothing committed', async () => {
    const { db, fence, data } = setup();
    const e = await fence
      .write('r', 1n, (tx) => {
        ins(tx, 1);
        // biome-ignore lint/suspicious/noThenProperty: a thenable is what this test hands the fence
        return { then: (ok: (v: number) => void) => ok(1) } as unknown as number;
      })
      .catch((x: unknown) => x);
    expect(e).toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'mutate', retryable: false });
    expect(await fence.highest('r')).toBeNull();
    expect(data()).toEqual([]);
    db.close();
  });

  it('a ROLLBACK then BEGIN hidden in one exec string is caught before COMMIT: nothing committed', async () => {
    const { db, fence, data } = setup();
    await fence.write('r', 1n, (tx) => ins(tx, 1));
    const e = await fence.write('r', 2n, (tx) => tx.exec('INSERT INTO data VALUES (2); ROLLBACK; BEGIN; INSERT INTO data VALUES (3)')).catch((x: unknown) => x);
    expect(e).toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'mutate', retryable: false });
    expect(db.inTransaction).toBe(false);
    expect(await fence.highest('r')).toBe(1n);
    expect(data()).toEqual([1]);
    db.close();
  });

  it('a ROLLBACK hidden in one exec string: InvalidArgumentError, nothing committed', async () => {
    const { db, fence, data } = setup();
    await fence.write('r', 1n, (tx) => ins(tx, 1));
    const e = await fence.write('r', 2n, (tx) => tx.exec('INSERT INTO data VALUES (2); ROLLBACK')).catch((x: unknown) => x);
    expect(e).toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'mutate', retryable: false });
    expect(await fence.highest('r')).toBe(1n);
    expect(data()).toEqual([1]);
    db.close();
  });

  it('a COMMIT hidden in one exec string: PartialWriteError, and the mark and the data it committed agree', async () => {
    const { db, fence, data } = setup();
    await fence.write('r', 1n, (tx) => ins(tx, 1));
    const e = await fence.write('r', 2n, (tx) => tx.exec('INSERT INTO data VALUES (2); COMMIT')).catch((x: unknown) => x);
    expect(e).toMatchObject({ name: 'PartialWriteError', code: 'PARTIAL_WRITE', retryable: false, resource: 'r', token: 2n });
    expect(await fence.highest('r')).toBe(2n);
    expect(data()).toEqual([1, 2]);
    await expect(fence.write('r', 1n, () => {})).rejects.toBeInstanceOf(StaleTokenError);
    db.close();
  });

  it('the handle kept after write settled refuses to end transactions too', async () => {
    const { db, fence } = setup();
    let kept: SqliteDatabase | undefined;
    await fence.write('r', 1n, (tx) => {
      kept = tx;
    });
    db.exec('BEGIN');
    expect(() => kept!.exec('ROLLBACK')).toThrow(InvalidArgumentError);
    expect(db.inTransaction).toBe(true);
    db.exec('ROLLBACK');
    db.close();
  });

  it('nested transactions and savepoints inside mutate still work', async () => {
    const { db, fence, data } = setup();
    await fence.write('r', 1n, (tx) => {
      ins(tx, 1);
      tx.transaction(() => ins(tx, 2))();
      tx.exec('SAVEPOINT mine');
      ins(tx, 3);
      tx.exec('ROLLBACK TO mine');
      tx.exec('RELEASE mine');
    });
    expect(data()).toEqual([1, 2]);
    db.close();
  });
});

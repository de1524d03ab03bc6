/**
 * mysqlFence against a `mutate` that misuses the connection it is handed, on the local MariaDB:
 * ending, opening or implicitly committing the transaction, or giving the connection away, is a
 * typed, non-retryable error, and the mark and the data agree afterwards. What the guard cannot
 * see in a statement's text (a prepared statement, a stored procedure, a multi-statement string
 * on a pool with `multipleStatements`) is caught by the server's in-transaction flag or by the
 * fence's savepoint: PartialWriteError when something was committed, InvalidArgumentError when
 * nothing was. Also: a deadlock inside mutate, lock waits in the fence's own statements, and a
 * connection killed inside mutate. The cases PostgreSQL shares (statements and calls refused before
 * they run, the connection kept after the write, savepoints, a ROLLBACK or COMMIT hidden in a
 * multi-statement string) are in ../helpers/fence-misuse.ts, registered here with this store's lists.
 */
import mysql from 'mysql2/promise';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BackendUnavailableError, InvalidArgumentError, PartialWriteError, StaleTokenError } from '../../src/core/errors.js';
import { mysqlFence, type MysqlConnection } from '../../src/mysql/index.js';
import { MYSQL_URL, sleep, uniqueName } from '../helpers/env.js';
import { hiddenMisuseCases, refusedMisuseCases, type FenceMisuseStore } from '../helpers/fence-misuse.js';

const pool = mysql.createPool({ uri: MYSQL_URL, connectionLimit: 4 });
const multi = mysql.createPool({ uri: MYSQL_URL, connectionLimit: 2, multipleStatements: true });
const admin = mysql.createPool({ uri: MYSQL_URL, connectionLimit: 4 });
const marks = uniqueName('lh_fmis_marks');
const items = uniqueName('lh_fmis_items');
const scratch = uniqueName('lh_fmis_scratch');
const commits = uniqueName('lh_fmis_commits');
const chains = uniqueName('lh_fmis_chains');
const fence = mysqlFence(pool, { table: marks });
const multiFence = mysqlFence(multi, { table: marks });
let n = 0;
const res = (label: string): string => `res:${label}:${++n}`;
const insertSql = (r: string, v: string): string => `INSERT INTO ${items} (resource, value) VALUES (${mysql.escape(r)}, ${mysql.escape(v)})`;
const insert = (tx: MysqlConnection, r: string, v: string) => tx.query(`INSERT INTO ${items} (resource, value) VALUES (?, ?)`, [r, v]);
const rowsOf = async <T>(answer: Promise<[unknown, unknown]>): Promise<T[]> => (await answer)[0] as T[];
const itemsOf = async (r: string): Promise<string[]> =>
  (await rowsOf<{ value: string }>(admin.query(`SELECT value FROM ${items} WHERE resource = ? ORDER BY seq`, [r]))).map((x) => x.value);
const tableExists = async (name: string): Promise<boolean> =>
  (await rowsOf(admin.query('SELECT 1 FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?', [name]))).length > 0;

const store: FenceMisuseStore<MysqlConnection> = {
  fence,
  insert,
  insertSql,
  items: itemsOf,
  endingStatements: [
    ['ROLLBACK', 'ROLLBACK'],
    ['ROLLBACK WORK', 'rollback work'],
    ['COMMIT', 'COMMIT'],
    ['COMMIT AND CHAIN', 'commit and chain'],
    ['COMMIT after a # comment', '# done\nCOMMIT'],
    ['COMMIT in an executable comment', '/*!40101 COMMIT */'],
    ['BEGIN', 'BEGIN'],
    ['START TRANSACTION', '  start transaction read write'],
    ['XA START', "XA START 'x'"],
    ['CREATE TABLE (DDL: implicit commit)', `CREATE TABLE ${scratch} (a INT)`],
    ['CREATE INDEX', `CREATE INDEX ix ON ${items} (value)`],
    ['ALTER TABLE', `/* c */ ALTER TABLE ${items} ADD COLUMN extra INT`],
    ['DROP TABLE', `DROP TABLE IF EXISTS ${scratch}`],
    ['TRUNCATE TABLE', `TRUNCATE TABLE ${items}`],
    ['RENAME TABLE', `RENAME TABLE ${items} TO ${scratch}`],
    ['LOCK TABLES', `LOCK TABLES ${items} WRITE`],
    ['UNLOCK TABLES', 'UNLOCK TABLES'],
    ['SET autocommit = 1', 'SET autocommit = 1'],
    ['SET @@session.autocommit', 'set @@session.autocommit = 0'],
    ['ANALYZE TABLE', `ANALYZE TABLE ${items}`],
  ],
  async afterRefusal() {
    expect(await tableExists(scratch)).toBe(false);
  },
  givingAway: ['release', 'destroy', 'beginTransaction', 'commit', 'rollback', 'end', 'changeUser'],
};

beforeAll(async () => {
  await admin.query(`CREATE TABLE ${items} (seq BIGINT AUTO_INCREMENT PRIMARY KEY, resource VARCHAR(255) NOT NULL, value VARCHAR(255) NOT NULL) ENGINE=InnoDB`);
  // Stored procedures that end the caller's transaction: one plainly, one beginning another at once (only the savepoint sees that).
  await admin.query(`CREATE PROCEDURE ${commits}() BEGIN COMMIT; END`);
  await admin.query(`CREATE PROCEDURE ${chains}() BEGIN COMMIT; START TRANSACTION; END`);
});
afterAll(async () => {
  await admin.query(`DROP TABLE IF EXISTS ${marks}, ${items}, ${scratch}`);
  await admin.query(`DROP PROCEDURE IF EXISTS ${commits}`);
  await admin.query(`DROP PROCEDURE IF EXISTS ${chains}`);
  await Promise.all([pool.end(), multi.end(), admin.end()]);
});

describe('mysqlFence misuse: refused before it runs', () => {
  refusedMisuseCases(store);

  it('what else does not end the transaction is let through: temporary tables, SET of a user variable', async () => {
    const r = res('allowed');
    const temp = uniqueName('lh_tmp');
    await fence.write(r, 1n, async (tx) => {
      await insert(tx, r, 'kept');
      await tx.query(`CREATE TEMPORARY TABLE ${temp} (v VARCHAR(20))`);
      await tx.query(`INSERT INTO ${temp} VALUES ('temp')`);
      await tx.query(`INSERT INTO ${items} (resource, value) SELECT ?, v FROM ${temp}`, [r]);
      await tx.query(`DROP TEMPORARY TABLE ${temp}`);
      await tx.query("SET @note = 'fine'");
    });
    expect(await itemsOf(r)).toEqual(['kept', 'temp']);
    expect(await fence.highest(r)).toBe(1n);
  });

  it('a failed statement that mutate caught undoes only itself (as MySQL does): the write commits the rest', async () => {
    const r = res('failed-statement');
    await fence.write(r, 1n, async (tx) => {
      await insert(tx, r, 'one');
      await tx.query('SELECT * FROM no_such_table_here').catch(() => {});
      await insert(tx, r, 'two');
    });
    expect(await itemsOf(r)).toEqual(['one', 'two']);
    expect(await fence.highest(r)).toBe(1n);
  });
});

describe('mysqlFence misuse: the end of the transaction found after the fact', () => {
  it('DDL run through a prepared statement commits implicitly: PartialWriteError; the mark and what mutate ran before it were committed; nothing after ran', async () => {
    const r = res('prepared-ddl');
    await fence.write(r, 1n, (tx) => insert(tx, r, 'one'));
    let later: unknown;
    const e = await fence
      .write(r, 2n, async (tx) => {
        await insert(tx, r, 'before');
        await tx.query(`PREPARE ddl FROM 'CREATE TABLE ${scratch} (a INT)'`);
        const executed = await tx.query('EXECUTE ddl').catch((x: unknown) => x);
        expect(executed).toBeInstanceOf(InvalidArgumentError); // the statement ran; mutate hears that the transaction is over
        later = await insert(tx, r, 'after').catch((x: unknown) => x);
      })
      .catch((x: unknown) => x);
    expect(later).toBeInstanceOf(InvalidArgumentError);
    expect(e).toBeInstanceOf(PartialWriteError);
    expect(e).toMatchObject({ code: 'PARTIAL_WRITE', retryable: false, resource: r, token: 2n });
    expect((e as Error).message).toMatch(/was committed/);
    expect(await fence.highest(r)).toBe(2n);
    expect(await itemsOf(r)).toEqual(['one', 'before']);
    expect(await tableExists(scratch)).toBe(true);
    await admin.query(`DROP TABLE ${scratch}`);
    await expect(fence.write(r, 1n, () => {})).rejects.toBeInstanceOf(StaleTokenError);
  });

  it('a COMMIT run through a prepared statement: PartialWriteError, the mark and the data agree', async () => {
    const r = res('prepared-commit');
    const e = await fence
      .write(r, 4n, async (tx) => {
        await insert(tx, r, 'before');
        await tx.query("PREPARE c FROM 'COMMIT'");
        await tx.query('EXECUTE c');
      })
      .catch((x: unknown) => x);
    expect(e).toMatchObject({ name: 'PartialWriteError', resource: r, token: 4n });
    expect(await fence.highest(r)).toBe(4n);
    expect(await itemsOf(r)).toEqual(['before']);
  });

  it('a ROLLBACK run through a prepared statement: InvalidArgumentError, nothing committed', async () => {
    const r = res('prepared-rollback');
    await fence.write(r, 1n, (tx) => insert(tx, r, 'one'));
    const e = await fence
      .write(r, 2n, async (tx) => {
        await insert(tx, r, 'before');
        await tx.query("PREPARE rb FROM 'ROLLBACK'");
        await tx.query('EXECUTE rb').catch(() => {}); // swallowed: the write is refused all the same
        await insert(tx, r, 'after').catch(() => {});
      })
      .catch((x: unknown) => x);
    expect(e).toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'mutate' });
    expect(await fence.highest(r)).toBe(1n);
    expect(await itemsOf(r)).toEqual(['one']);
  });

  it('COMMIT AND CHAIN through a prepared statement (the flag stays set; the savepoint is gone): PartialWriteError, what ran after it rolled back', async () => {
    const r = res('prepared-chain');
    const e = await fence
      .write(r, 5n, async (tx) => {
        await insert(tx, r, 'before');
        await tx.query("PREPARE ch FROM 'COMMIT AND CHAIN'");
        await tx.query('EXECUTE ch');
        await insert(tx, r, 'after, in the chained transaction');
      })
      .catch((x: unknown) => x);
    expect(e).toMatchObject({ name: 'PartialWriteError', resource: r, token: 5n });
    expect(await fence.highest(r)).toBe(5n);
    expect(await itemsOf(r)).toEqual(['before']);
  });

  it('ROLLBACK AND CHAIN through a prepared statement: InvalidArgumentError, nothing committed (neither before nor after it)', async () => {
    const r = res('prepared-rollback-chain');
    await fence.write(r, 1n, (tx) => insert(tx, r, 'one'));
    const e = await fence
      .write(r, 2n, async (tx) => {
        await insert(tx, r, 'before');
        await tx.query("PREPARE rch FROM 'ROLLBACK AND CHAIN'");
        await tx.query('EXECUTE rch');
        await insert(tx, r, 'after, in the chained transaction');
      })
      .catch((x: unknown) => x);
    expect(e).toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'mutate' });
    expect(await fence.highest(r)).toBe(1n);
    expect(await itemsOf(r)).toEqual(['one']);
  });

  it('a stored procedure that commits: PartialWriteError', async () => {
    const r = res('procedure-commit');
    const e = await fence
      .write(r, 6n, async (tx) => {
        await insert(tx, r, 'before');
        await tx.query(`CALL ${commits}()`);
      })
      .catch((x: unknown) => x);
    expect(e).toMatchObject({ name: 'PartialWriteError', token: 6n });
    expect(await fence.highest(r)).toBe(6n);
    expect(await itemsOf(r)).toEqual(['before']);
  });

  it('a stored procedure that commits and begins another transaction (only the savepoint tells): PartialWriteError, what ran after rolled back', async () => {
    const r = res('procedure-chain');
    const e = await fence
      .write(r, 7n, async (tx) => {
        await insert(tx, r, 'before');
        await tx.query(`CALL ${chains}()`);
        await insert(tx, r, 'after');
      })
      .catch((x: unknown) => x);
    expect(e).toMatchObject({ name: 'PartialWriteError', token: 7n });
    expect(await fence.highest(r)).toBe(7n);
    expect(await itemsOf(r)).toEqual(['before']);
  });

  it('a refusal that mutate swallowed after a hidden commit still reports the commit (PartialWriteError)', async () => {
    const r = res('chain-then-refusal');
    const e = await fence
      .write(r, 8n, async (tx) => {
        await insert(tx, r, 'before');
        await tx.query(`CALL ${chains}()`);
        await tx.query('COMMIT').catch(() => {});
      })
      .catch((x: unknown) => x);
    expect(e).toMatchObject({ name: 'PartialWriteError', token: 8n });
    expect(await itemsOf(r)).toEqual(['before']);
  });
});

describe('mysqlFence misuse: multi-statement strings', () => {
  it('without multipleStatements on the pool, a second statement is a syntax error: nothing runs, nothing committed', async () => {
    const r = res('no-multi');
    const e = await fence.write(r, 1n, (tx) => tx.query(`${insertSql(r, 'before')}; COMMIT`)).catch((x: unknown) => x);
    expect(e).toMatchObject({ code: 'ER_PARSE_ERROR' }); // the statement's own error, unchanged
    expect(await fence.highest(r)).toBeNull();
    expect(await itemsOf(r)).toEqual([]);
  });

  hiddenMisuseCases(store, multiFence);

  it('with multipleStatements: DDL hidden after an INSERT commits implicitly: PartialWriteError', async () => {
    const r = res('hidden-ddl');
    const e = await multiFence.write(r, 3n, (tx) => tx.query(`${insertSql(r, 'before')}; CREATE TABLE ${scratch} (a INT)`)).catch((x: unknown) => x);
    expect(e).toMatchObject({ name: 'PartialWriteError', token: 3n });
    expect(await multiFence.highest(r)).toBe(3n);
    expect(await itemsOf(r)).toEqual(['before']);
    await admin.query(`DROP TABLE IF EXISTS ${scratch}`);
  });

  it('with multipleStatements: COMMIT AND CHAIN hidden in one string: PartialWriteError, what followed it rolled back', async () => {
    const r = res('hidden-chain');
    const e = await multiFence.write(r, 4n, (tx) => tx.query(`${insertSql(r, 'before')}; COMMIT AND CHAIN; ${insertSql(r, 'after')}`)).catch((x: unknown) => x);
    expect(e).toMatchObject({ name: 'PartialWriteError', token: 4n });
    expect(await multiFence.highest(r)).toBe(4n);
    expect(await itemsOf(r)).toEqual(['before']);
  });
});

describe('mysqlFence: deadlocks, lock waits, killed connections', () => {
  /** Two writes on two resources that lock two rows of one table in opposite orders: the server picks one as the deadlock victim. */
  const deadlock = async (victim: (error: unknown) => void) => {
    const [a, b] = [res('deadlock-a'), res('deadlock-b')];
    const rows = uniqueName('lh_fmis_rows');
    await admin.query(`CREATE TABLE ${rows} (id INT PRIMARY KEY, v INT NOT NULL) ENGINE=InnoDB`);
    await admin.query(`INSERT INTO ${rows} VALUES (1, 0), (2, 0)`);
    try {
      let arrived = 0;
      let bothHold!: () => void;
      const barrier = new Promise<void>((resolve) => (bothHold = resolve));
      const writer = (r: string, first: number, second: number) =>
        fence
          .write(r, 1n, async (tx) => {
            await tx.query(`UPDATE ${rows} SET v = v + 1 WHERE id = ?`, [first]);
            if (++arrived === 2) bothHold();
            await barrier;
            try {
              await tx.query(`UPDATE ${rows} SET v = v + 1 WHERE id = ?`, [second]);
            } catch (error) {
              victim(error);
              return 'victim';
            }
            await insert(tx, r, 'done');
            return 'winner';
          })
          .then(
            (value) => ({ r, value }),
            (error: unknown) => ({ r, error }),
          );
      return await Promise.all([writer(a, 1, 2), writer(b, 2, 1)]);
    } finally {
      await admin.query(`DROP TABLE ${rows}`);
    }
  };

  it('a deadlock inside mutate that mutate swallows: InvalidArgumentError (the server rolled the transaction back), nothing committed; the other writer commits', async () => {
    let seen: unknown;
    const results = await deadlock((error) => {
      seen = error;
    });
    expect(seen).toMatchObject({ code: 'ER_LOCK_DEADLOCK' });
    const lost = results.find((x) => 'error' in x)!;
    const won = results.find((x) => 'value' in x)!;
    expect(lost.error).toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'mutate' });
    expect((lost.error as Error).message).toMatch(/ER_LOCK_DEADLOCK/);
    expect(await fence.highest(lost.r)).toBeNull();
    expect(won.value).toBe('winner');
    expect(await itemsOf(won.r)).toEqual(['done']);
    expect(await fence.highest(won.r)).toBe(1n);
  });

  it("a deadlock inside mutate that mutate rethrows reaches the caller unchanged (the statement's own error), nothing committed", async () => {
    const results = await deadlock((error) => {
      throw error;
    });
    const lost = results.find((x) => 'error' in x)!;
    expect(lost.error).toMatchObject({ code: 'ER_LOCK_DEADLOCK' });
    expect(await fence.highest(lost.r)).toBeNull();
    expect(results.filter((x) => 'value' in x)).toHaveLength(1);
  });

  /** A pool whose sessions give up a lock wait after 1 s (the server's default is 50 s). */
  const impatientPool = () => {
    const p = mysql.createPool({ uri: MYSQL_URL, connectionLimit: 2 });
    p.on('connection', (c) => void c.query('SET SESSION innodb_lock_wait_timeout = 1'));
    return p;
  };
  /** Holds the mark row of `r` locked from another session for `ms`; `released` settles when it let go. */
  const holdMark = async (r: string, ms: number): Promise<{ released: Promise<void> }> => {
    const c = await admin.getConnection();
    await c.query('START TRANSACTION');
    await c.query(`SELECT token FROM ${marks} WHERE resource = ? FOR UPDATE`, [r]);
    const released = sleep(ms).then(async () => {
      await c.query('COMMIT');
      c.release();
    });
    return { released };
  };

  it("a lock-wait timeout in the fence's own statement, before mutate ran, is retried: the write commits, mutate ran once", async () => {
    const p = impatientPool();
    try {
      const f = mysqlFence(p, { table: marks });
      const r = res('lock-wait');
      await f.write(r, 1n, () => {});
      const held = await holdMark(r, 1_500);
      let runs = 0;
      await f.write(r, 2n, async (tx) => {
        runs++;
        await insert(tx, r, 'two');
      });
      await held.released;
      expect(runs).toBe(1);
      expect(await f.highest(r)).toBe(2n);
      expect(await itemsOf(r)).toEqual(['two']);
    } finally {
      await p.end();
    }
  }, 30_000);

  it('lock waits that outlast every retry: BackendUnavailableError (retryable), mutate never ran, nothing changed', async () => {
    const p = impatientPool();
    try {
      const f = mysqlFence(p, { table: marks });
      const r = res('lock-wait-long');
      await f.write(r, 1n, () => {});
      const held = await holdMark(r, 6_000);
      let ran = false;
      const e = await f
        .write(r, 2n, () => {
          ran = true;
        })
        .catch((x: unknown) => x);
      await held.released;
      expect(e).toBeInstanceOf(BackendUnavailableError);
      expect(e).toMatchObject({ backend: 'mysql', retryable: true });
      expect((e as Error).message).toMatch(/ER_LOCK_WAIT_TIMEOUT/);
      expect(ran).toBe(false);
      expect(await f.highest(r)).toBe(1n);
    } finally {
      await p.end();
    }
  }, 30_000);

  it('a connection killed inside mutate: the write rejects, nothing committed, the connection is destroyed and the next writes succeed', async () => {
    const r = res('killed');
    await fence.write(r, 1n, (tx) => insert(tx, r, 'one'));
    const e = await fence
      .write(r, 2n, async (tx) => {
        await insert(tx, r, 'two');
        const [rows] = await tx.query('SELECT CONNECTION_ID() AS id');
        await admin.query(`KILL CONNECTION ${(rows as { id: number }[])[0]!.id}`);
        await insert(tx, r, 'after the kill');
      })
      .catch((x: unknown) => x);
    expect(e).toBeInstanceOf(Error);
    expect(await fence.highest(r)).toBe(1n);
    expect(await itemsOf(r)).toEqual(['one']);
    // four writes at once need every connection of the pool: none of them is the dead one
    await Promise.all([1, 2, 3, 4].map((i) => fence.write(`${r}:${i}`, 1n, (tx) => insert(tx, `${r}:${i}`, 'ok'))));
    await fence.write(r, 2n, (tx) => insert(tx, r, 'two, again'));
    expect(await itemsOf(r)).toEqual(['one', 'two, again']);
  });
});

/**
 * Property-based test of I3 for fences: random sequences of writes (resource, token in one of its
 * three forms, mutate that succeeds or throws) against a fence, compared step by step with the
 * model. A write is accepted iff its token >= the highest accepted for that resource; a refusal
 * is a StaleTokenError naming resource, token and highest; a refusal or a throwing mutate changes
 * neither the mark nor the data; the user's error reaches the caller unchanged. With the fence's
 * `lockKey` option, a sequencer of another lock is an InvalidArgumentError naming `token` that
 * changes nothing either. Mutant fences must be caught by the same check, or the check proves nothing.
 */
import Database from 'better-sqlite3';
import fc from 'fast-check';
import mysql from 'mysql2/promise';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { InvalidArgumentError, StaleTokenError } from '../../src/core/errors.js';
import type { Fence } from '../../src/core/fence.js';
import { formatSequencer, toToken, type TokenInput } from '../../src/core/token.js';
import { memoryFence } from '../../src/memory/index.js';
import { mysqlFence, type MysqlConnection } from '../../src/mysql/index.js';
import { postgresFence, type PgClient } from '../../src/postgres/index.js';
import { sqliteFence, type SqliteDatabase } from '../../src/sqlite/index.js';
import { MYSQL_URL, PG_URL, uniqueName } from '../helpers/env.js';

/** `otherLock`: a sequencer names another lock than the resource's own (the fence is told `lockKey: (r) => r`). */
interface Op {
  resource: number;
  token: number;
  form: 'bigint' | 'decimal' | 'sequencer';
  throws: boolean;
  otherLock: boolean;
}

const opArbWith = (otherLock: fc.Arbitrary<boolean>): fc.Arbitrary<Op> =>
  fc.record({
    resource: fc.nat(2),
    token: fc.integer({ min: 1, max: 12 }),
    form: fc.constantFrom<Op['form']>('bigint', 'decimal', 'sequencer'),
    throws: fc.boolean(),
    otherLock,
  });
const opArb = opArbWith(fc.constant(false));
/** Histories with sequencers of other locks mixed in (some with far larger tokens: another backend's numbers). */
const lockOpArb = opArbWith(fc.boolean());
const histories = fc.array(opArb, { minLength: 1, maxLength: 40 });
const lockHistories = fc.array(lockOpArb, { minLength: 1, maxLength: 40 });
/** The lock that guards each resource in these tests: the resource's own name (as tokenInput's sequencers say). */
const lockKey = (resource: string): string => resource;

/** A fence plus the data it protects, for one history. `write` stores the token in the resource's data inside the fence's transaction. */
interface Subject {
  fence: Fence<unknown>;
  /** The mutation: records `token` as written to `resource`, then throws `error` if given (after writing, where the store rolls back), else returns `result`. */
  mutate(tx: unknown, resource: string, token: bigint, error: Error | undefined, result: string): unknown;
  data(resource: string): Promise<bigint[]>;
  done(): Promise<void>;
}

function tokenInput(op: Op, resource: string): TokenInput {
  const t = BigInt(op.token);
  if (op.form === 'bigint') return t;
  if (op.form === 'decimal') return t.toString();
  return op.otherLock ? formatSequencer(`other:${resource}`, 'exclusive', t * 1000n) : formatSequencer(resource, 'exclusive', t);
}

/** Runs one history against a subject and the model; throws on the first divergence. */
async function check(ops: Op[], subject: Subject): Promise<void> {
  const highest = new Map<string, bigint>();
  const data = new Map<string, bigint[]>();
  try {
    for (const [i, op] of ops.entries()) {
      const resource = `doc:${op.resource}`;
      const t = BigInt(op.token);
      const where = `step ${i}: ${JSON.stringify(op)}`;
      const own = op.throws ? new Error(`user error ${i}`) : undefined;
      const outcome = await subject.fence
        .write(resource, tokenInput(op, resource), (tx) => subject.mutate(tx, resource, t, own, `result ${i}`))
        .then(
          (value) => ({ value }),
          (error: unknown) => ({ error }),
        );
      const high = highest.get(resource);
      if (op.form === 'sequencer' && op.otherLock) {
        expect('error' in outcome, `${where}: a sequencer of another lock accepted`).toBe(true);
        expect((outcome as { error: unknown }).error, where).toBeInstanceOf(InvalidArgumentError);
        expect((outcome as { error: InvalidArgumentError }).error.argument, where).toBe('token');
      } else if (high !== undefined && t < high) {
        expect('error' in outcome, `${where}: stale token accepted`).toBe(true);
        const e = (outcome as { error: unknown }).error;
        expect(e, where).toBeInstanceOf(StaleTokenError);
        expect({ resource: (e as StaleTokenError).resource, token: (e as StaleTokenError).token, highest: (e as StaleTokenError).highest }, where).toEqual({
          resource,
          token: t,
          highest: high,
        });
      } else if (own) {
        expect(outcome, `${where}: the user's error must reach the caller unchanged`).toEqual({ error: own });
        expect((outcome as { error: unknown }).error, where).toBe(own);
      } else {
        expect(outcome, `${where}: a write with token >= highest must be accepted`).toEqual({ value: `result ${i}` });
        highest.set(resource, t);
        data.set(resource, [...(data.get(resource) ?? []), t]);
      }
      expect(await subject.fence.highest(resource), `${where}: mark`).toBe(highest.get(resource) ?? null);
      expect(await subject.data(resource), `${where}: data`).toEqual(data.get(resource) ?? []);
    }
  } finally {
    await subject.done();
  }
}

/** The memory fence rolls nothing back: a mutate that fails undoes its own change before throwing (as the fence asks). */
function memorySubject(make: () => Fence<void> = () => memoryFence({ lockKey })): Subject {
  const data = new Map<string, bigint[]>();
  return {
    fence: make() as Fence<unknown>,
    mutate(_tx, resource, token, error, result) {
      const before = data.get(resource) ?? [];
      data.set(resource, [...before, token]);
      if (error) {
        data.set(resource, before);
        throw error;
      }
      return result;
    },
    data: async (r) => data.get(r) ?? [],
    done: async () => {},
  };
}

function sqliteSubject(): Subject {
  const db = new Database(':memory:');
  db.exec('CREATE TABLE items (seq INTEGER PRIMARY KEY AUTOINCREMENT, resource TEXT NOT NULL, token INTEGER NOT NULL)');
  const read = db.prepare('SELECT token FROM items WHERE resource = ? ORDER BY seq').pluck().safeIntegers(true);
  return {
    fence: sqliteFence(db, { lockKey }) as Fence<unknown>,
    mutate(tx, resource, token, error, result) {
      (tx as SqliteDatabase).prepare('INSERT INTO items (resource, token) VALUES (?, ?)').run(resource, token);
      if (error) throw error; // after writing: the fence's transaction must undo it
      return result;
    },
    data: async (r) => read.all(r) as bigint[],
    done: async () => {
      db.close();
    },
  };
}

/**
 * Fences that break I3, each a plausible bug. The first wraps nothing: it runs mutate and records
 * the token, whatever it is. The others get the check almost right.
 */
const MUTANTS: Record<string, () => Fence<void>> = {
  'ignores tokens': () => {
    const marks = new Map<string, bigint>();
    return {
      async write(resource, token, mutate) {
        const result = await mutate();
        marks.set(resource, toToken(token));
        return result;
      },
      highest: async (r) => marks.get(r) ?? null,
    };
  },
  'refuses an equal token': () => {
    const marks = new Map<string, bigint>();
    return {
      async write(resource, token, mutate) {
        const t = toToken(token);
        const high = marks.get(resource);
        if (high !== undefined && t <= high) throw new StaleTokenError(resource, t, high);
        const result = await mutate();
        marks.set(resource, t);
        return result;
      },
      highest: async (r) => marks.get(r) ?? null,
    };
  },
  'raises the mark before mutate (kept when it throws)': () => {
    const marks = new Map<string, bigint>();
    return {
      async write(resource, token, mutate) {
        const t = toToken(token);
        const high = marks.get(resource);
        if (high !== undefined && t < high) throw new StaleTokenError(resource, t, high);
        marks.set(resource, t);
        return mutate();
      },
      highest: async (r) => marks.get(r) ?? null,
    };
  },
};

describe('I3 over random write sequences (model-checked)', () => {
  it('memory fence', async () => {
    await fc.assert(
      fc.asyncProperty(lockHistories, (ops) => check(ops, memorySubject())),
      { numRuns: 300 },
    );
  });

  it('sqlite fence', async () => {
    await fc.assert(
      fc.asyncProperty(lockHistories, (ops) => check(ops, sqliteSubject())),
      { numRuns: 200 },
    );
  });

  describe('postgres fence (real server)', () => {
    const schema = uniqueName('lh_fprop');
    const pool = new pg.Pool({ connectionString: PG_URL, max: 4 });
    beforeAll(async () => {
      await pool.query(`CREATE SCHEMA ${schema}`);
      await pool.query(`CREATE TABLE ${schema}.items (seq bigserial PRIMARY KEY, run integer NOT NULL, resource text NOT NULL, token bigint NOT NULL)`);
    });
    afterAll(async () => {
      await pool.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
      await pool.end();
    });

    it('postgres fence', async () => {
      let run = 0;
      const subject = (): Subject => {
        const r = ++run;
        return {
          // a fresh mark table per history, in the test's own schema
          fence: postgresFence(pool, { schema, table: `marks_${r}`, lockKey }) as Fence<unknown>,
          async mutate(tx, resource, token, error, result) {
            await (tx as PgClient).query(`INSERT INTO ${schema}.items (run, resource, token) VALUES ($1, $2, $3)`, [r, resource, token.toString()]);
            if (error) throw error;
            return result;
          },
          data: async (res) =>
            (await pool.query(`SELECT token FROM ${schema}.items WHERE run = $1 AND resource = $2 ORDER BY seq`, [r, res])).rows.map((x) =>
              BigInt(x.token as string),
            ),
          done: async () => {},
        };
      };
      await fc.assert(
        fc.asyncProperty(fc.array(lockOpArb, { minLength: 1, maxLength: 25 }), (ops) => check(ops, subject())),
        { numRuns: 25 },
      );
    });
  });

  describe('mysql fence (real server)', () => {
    const prefix = uniqueName('lh_fprop');
    const items = `${prefix}_items`;
    const pool = mysql.createPool({ uri: MYSQL_URL, connectionLimit: 4 });
    const tables: string[] = [items];
    beforeAll(async () => {
      await pool.query(
        `CREATE TABLE ${items} (seq BIGINT AUTO_INCREMENT PRIMARY KEY, run INT NOT NULL, resource VARCHAR(64) NOT NULL, token BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB`,
      );
    });
    afterAll(async () => {
      await pool.query(`DROP TABLE IF EXISTS ${tables.join(', ')}`);
      await pool.end();
    });

    it('mysql fence', async () => {
      let run = 0;
      const subject = (): Subject => {
        const r = ++run;
        const marks = `${prefix}_marks_${r}`;
        tables.push(marks);
        return {
          // a fresh mark table per history
          fence: mysqlFence(pool, { table: marks, lockKey }) as Fence<unknown>,
          async mutate(tx, resource, token, error, result) {
            await (tx as MysqlConnection).query(`INSERT INTO ${items} (run, resource, token) VALUES (?, ?, ?)`, [r, resource, token.toString()]);
            if (error) throw error;
            return result;
          },
          data: async (res) =>
            (
              (await pool.query(`SELECT CAST(token AS CHAR) AS token FROM ${items} WHERE run = ? AND resource = ? ORDER BY seq`, [r, res]))[0] as {
                token: string;
              }[]
            ).map((x) => BigInt(x.token)),
          done: async () => {},
        };
      };
      await fc.assert(
        fc.asyncProperty(fc.array(lockOpArb, { minLength: 1, maxLength: 25 }), (ops) => check(ops, subject())),
        { numRuns: 25 },
      );
    });
  });

  it('the model catches fences that break I3 (mutants must fail)', async () => {
    for (const [name, make] of Object.entries(MUTANTS)) {
      const result = await fc.check(
        fc.asyncProperty(histories, (ops) => check(ops, memorySubject(make))),
        // A fixed seed keeps this deterministic: a mutant is caught, or it escaped and the model is too weak.
        { numRuns: 500, seed: 20261201, endOnFailure: true },
      );
      expect(result.failed, `mutant "${name}" escaped the model`).toBe(true);
    }
  });

  it('the model catches a fence that ignores which lock a sequencer came from (the mutant must fail)', async () => {
    const result = await fc.check(
      fc.asyncProperty(lockHistories, (ops) =>
        check(
          ops,
          memorySubject(() => memoryFence()),
        ),
      ),
      { numRuns: 500, seed: 20261201, endOnFailure: true },
    );
    expect(result.failed, 'a fence without lockKey escaped the model').toBe(true);
  });
});

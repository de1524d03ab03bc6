import { createRequire } from 'node:module';
import type Pg from 'pg';
import { requirePeer } from '../core/peer.js';
import { postgresFence, type PgClient, type PgPool } from '../postgres/index.js';
import { STORE_NAMES, bounded, type AdminStore, type FinalState, type StoreConfig, type WorkerStore } from './store.js';

const { counters, log, fences } = STORE_NAMES;

/** pg, an optional peer of leasehold: loaded like src/postgres/driver.ts loads it, so a missing one is named. */
const pg = requirePeer<typeof Pg>(createRequire(import.meta.url), 'pg', 'leasehold verify --fence postgres');

/** Every statement of the PostgreSQL store, beside the operations that run them. */
const SQL = Object.freeze({
  createCounters: `CREATE TABLE IF NOT EXISTS ${counters} (resource text PRIMARY KEY, value bigint NOT NULL)`,
  createLog: `CREATE TABLE IF NOT EXISTS ${log} (
    seq bigserial PRIMARY KEY, resource text NOT NULL, token bigint NOT NULL,
    worker integer NOT NULL, op text NOT NULL, value bigint NOT NULL)`,
  createLogIndex: `CREATE INDEX IF NOT EXISTS ${log}_resource ON ${log} (resource, seq)`,
  seedCounter: `INSERT INTO ${counters} (resource, value) VALUES ($1, 0) ON CONFLICT (resource) DO NOTHING`,
  readCounter: `SELECT value FROM ${counters} WHERE resource = $1`,
  writeCounter: `UPDATE ${counters} SET value = $2 WHERE resource = $1`,
  append: `INSERT INTO ${log} (resource, token, worker, op, value) VALUES ($1, $2, $3, $4, $5)`,
  readLog: `SELECT seq, token, worker AS w, op, value FROM ${log} WHERE resource = $1 ORDER BY seq`,
  fenceTableExists: `SELECT to_regclass('${fences}') IS NOT NULL AS exists`,
  deleteCounter: `DELETE FROM ${counters} WHERE resource = $1`,
  deleteLog: `DELETE FROM ${log} WHERE resource = $1`,
  deleteMark: `DELETE FROM ${fences} WHERE resource = $1`,
});

function pool(config: StoreConfig, max: number): Pg.Pool {
  const p = new pg.Pool({
    connectionString: config.location,
    max,
    connectionTimeoutMillis: config.timeoutMs,
    // A client-side bound on every query: a write whose answer never comes is reported as failed (indeterminate).
    query_timeout: config.timeoutMs,
  });
  // An idle client whose connection drops (a coordinator crash) must not crash the process.
  p.on('error', () => {});
  return p;
}

/**
 * BEGIN, `fn(client)`, COMMIT on one pooled client; ROLLBACK and rethrow on error. A client whose
 * connection broke while it was out (an 'error' event, which would otherwise crash the process, or
 * a failed ROLLBACK) is destroyed rather than returned to the pool.
 */
async function transaction<T>(p: Pg.Pool, fn: (client: Pg.PoolClient) => Promise<T>): Promise<T> {
  const client = await p.connect();
  let broken: Error | undefined;
  const onError = (error: Error): void => {
    broken = error;
  };
  client.on('error', onError);
  try {
    await client.query('BEGIN');
    const result = await fn(client);
    await client.query('COMMIT');
    return result;
  } catch (error) {
    await client.query('ROLLBACK').catch((e: Error) => {
      broken = e;
    });
    throw error;
  } finally {
    client.removeListener('error', onError);
    client.release(broken);
  }
}

/** Catalog races with another process creating the same objects (a unique violation, a duplicate table): trying again succeeds. */
const DDL_RACES = new Set(['23505', '42P07']);

/**
 * Creates the store's tables once, under a transaction-scoped advisory lock so that concurrent runs
 * do not race in the catalog; a race with anything else creating them is tried again (3 attempts).
 */
async function createTables(p: Pg.Pool, lockName: string, statements: readonly string[]): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    try {
      await transaction(p, async (client) => {
        await client.query('SELECT pg_advisory_xact_lock(hashtext($1))', [lockName]);
        for (const sql of statements) await client.query(sql);
      });
      return;
    } catch (error) {
      const code = (error as { code?: unknown } | null)?.code;
      if (attempt >= 3 || typeof code !== 'string' || !DDL_RACES.has(code)) throw error;
    }
  }
}

async function readCounter(q: PgPool | PgClient, resource: string): Promise<number> {
  const { rows } = await q.query(SQL.readCounter, [resource]);
  return rows.length === 0 ? 0 : Number(rows[0]!.value);
}

export function postgresWorkerStore(config: StoreConfig): WorkerStore {
  const p = pool(config, 2);
  const fence = postgresFence(p as unknown as PgPool, { table: fences });
  return {
    fencedIncrement: (resource, token, row) =>
      fence.write(resource, token, async (tx) => {
        const value = (await readCounter(tx, resource)) + 1;
        await tx.query(SQL.writeCounter, [resource, value]);
        await tx.query(SQL.append, [resource, token.toString(), row.w, row.op, value]);
        return value;
      }),
    read: (resource) => readCounter(p as unknown as PgPool, resource),
    async plainWrite(resource, value, row) {
      await transaction(p, async (client) => {
        await client.query(SQL.writeCounter, [resource, value]);
        await client.query(SQL.append, [resource, row.token.toString(), row.w, row.op, value]);
      });
    },
    close: () => bounded(p.end(), config.timeoutMs, 'close pool').catch(() => {}),
  };
}

export function postgresAdminStore(config: StoreConfig): AdminStore {
  const p = pool(config, 2);
  const q = p as unknown as PgPool;
  let created: Promise<void> | undefined;
  const ensure = (): Promise<void> => (created ??= createTables(p, `leasehold:${log}`, [SQL.createCounters, SQL.createLog, SQL.createLogIndex]));
  return {
    setup: async (resource) => {
      await ensure();
      await q.query(SQL.seedCounter, [resource]);
    },
    final: async (resource): Promise<FinalState> => {
      const counter = await readCounter(q, resource);
      const { rows } = await q.query(SQL.readLog, [resource]);
      const hasFence = (await q.query(SQL.fenceTableExists)).rows[0]!.exists === true;
      const highest = hasFence ? await postgresFence(q, { table: fences }).highest(resource) : null;
      return {
        counter,
        log: rows.map((r) => ({ seq: Number(r.seq), token: BigInt(r.token as string), w: Number(r.w), op: String(r.op), value: Number(r.value) })),
        highest,
      };
    },
    cleanup: async (resource) => {
      await q.query(SQL.deleteCounter, [resource]);
      await q.query(SQL.deleteLog, [resource]);
      if ((await q.query(SQL.fenceTableExists)).rows[0]!.exists === true) await q.query(SQL.deleteMark, [resource]);
    },
    close: () => bounded(p.end(), config.timeoutMs, 'close pool').catch(() => {}),
  };
}

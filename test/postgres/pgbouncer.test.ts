/**
 * Behind PgBouncer in transaction mode: the PostgreSQL backend and fence pass their conformance
 * suites, with waiters woken over a direct LISTEN connection, and with no LISTEN at all
 * (`listen: false`: waiters poll). The default set-up (LISTEN through the pooler itself, where
 * notifications are unreliable) still serves every waiter after a release. The fixture's stop
 * leaves no pgbouncer process behind.
 */
import { readFileSync } from 'node:fs';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLocks, type Lease } from '../../src/index.js';
import { postgresBackend, postgresFence, type PgClient } from '../../src/postgres/index.js';
import { backendConformance } from '../../src/testing/index.js';
import { fenceConformance } from '../../src/testing/index.js';
import { eventually, PG_URL, uniqueName } from '../helpers/env.js';
import { alive, startBouncer, type Bouncer } from './bouncer.js';

/** Whether a TCP socket in LISTEN state is bound to `port` (Linux: /proc/net/tcp and tcp6). */
function listening(port: number): boolean {
  const hex = port.toString(16).toUpperCase().padStart(4, '0');
  for (const table of ['/proc/net/tcp', '/proc/net/tcp6']) {
    let text: string;
    try {
      text = readFileSync(table, 'utf8');
    } catch {
      continue; // no IPv6 on this machine
    }
    for (const line of text.split('\n').slice(1)) {
      const fields = line.trim().split(/\s+/);
      // local_address is ADDR:PORT in hex; state 0A is LISTEN
      if (fields[1]?.endsWith(`:${hex}`) && fields[3] === '0A') return true;
    }
  }
  return false;
}

async function dropSchema(schema: string): Promise<void> {
  const admin = new pg.Client({ connectionString: PG_URL });
  await admin.connect();
  try {
    await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
  } finally {
    await admin.end();
  }
}

backendConformance('postgres behind pgbouncer (transaction mode), LISTEN direct', async () => {
  const bouncer = await startBouncer();
  const schema = uniqueName('lh_bouncer');
  return {
    connect: async () => postgresBackend({ connectionString: bouncer.url, listenConnectionString: PG_URL, schema, poolSize: 4 }),
    prefix: 'bouncer',
    ttlMs: 400,
    cleanup: async () => {
      await bouncer.stop();
      await dropSchema(schema);
    },
  };
});

backendConformance('postgres behind pgbouncer (transaction mode), no LISTEN: waiters poll', async () => {
  const bouncer = await startBouncer();
  const schema = uniqueName('lh_bouncer');
  return {
    connect: async () => postgresBackend({ connectionString: bouncer.url, listen: false, schema, poolSize: 4 }),
    prefix: 'bouncer',
    ttlMs: 400,
    cleanup: async () => {
      await bouncer.stop();
      await dropSchema(schema);
    },
  };
});

fenceConformance<PgClient>('postgres behind pgbouncer (transaction mode)', async () => {
  const bouncer = await startBouncer();
  const schema = uniqueName('lh_bfence');
  const pool = new pg.Pool({ connectionString: bouncer.url, max: 8 });
  await pool.query(`CREATE SCHEMA ${schema}`);
  await pool.query(`CREATE TABLE ${schema}.counters (resource text PRIMARY KEY, n integer NOT NULL)`);
  await pool.query(`CREATE TABLE ${schema}.items (seq bigserial PRIMARY KEY, resource text NOT NULL, value text NOT NULL)`);
  return {
    fence: postgresFence(pool, { schema, table: 'marks' }),
    fenceWith: (options) => postgresFence(pool, { schema, table: 'marks', ...options }),
    async increment(tx, r) {
      const { rows } = await tx.query(`SELECT n FROM ${schema}.counters WHERE resource = $1`, [r]);
      await tx.query(`INSERT INTO ${schema}.counters (resource, n) VALUES ($1, $2) ON CONFLICT (resource) DO UPDATE SET n = EXCLUDED.n`, [
        r,
        ((rows[0]?.n as number | undefined) ?? 0) + 1,
      ]);
    },
    async append(tx, r, v) {
      await tx.query(`INSERT INTO ${schema}.items (resource, value) VALUES ($1, $2)`, [r, v]);
    },
    counter: async (r) => ((await pool.query(`SELECT n FROM ${schema}.counters WHERE resource = $1`, [r])).rows[0]?.n as number | undefined) ?? 0,
    log: async (r) => (await pool.query(`SELECT value FROM ${schema}.items WHERE resource = $1 ORDER BY seq`, [r])).rows.map((x) => x.value as string),
    transactional: true,
    synchronous: false,
    cleanup: async () => {
      await pool.end();
      await bouncer.stop();
      await dropSchema(schema);
    },
  };
});

describe('postgres behind pgbouncer, default set-up (LISTEN through the pooler)', () => {
  let bouncer: Bouncer;
  const schema = uniqueName('lh_bdefault');
  beforeAll(async () => {
    bouncer = await startBouncer();
  });
  afterAll(async () => {
    await bouncer?.stop();
    await dropSchema(schema);
  });

  it('serves every waiter after each release, whether or not a notification gets through', async () => {
    // listen left on and no listenConnectionString: LISTEN runs on whichever server connection
    // the pooler picks, so wake-ups may be lost; the waiter must still get the key (the backend
    // stops listening once it sees the pooler, and core re-checks every 500 ms in any case).
    const locks = createLocks({ backend: postgresBackend({ connectionString: bouncer.url, schema, poolSize: 4 }) });
    const failed: unknown[] = [];
    locks.on('acquireFailed', (e) => failed.push(e.error));
    try {
      const key = uniqueName('bouncer-wait');
      let last = 0n;
      for (let round = 0; round < 4; round++) {
        const holder = await locks.acquire(key, { ttlMs: 30_000 });
        expect(holder.token).toBeGreaterThan(last);
        // a generous bound: only a waiter that is never served runs into it
        const waiters = [0, 1].map(() => locks.acquire(key, { ttlMs: 30_000, waitMs: 20_000 }));
        expect(await eventually(async () => (await locks.inspect(key))[0]?.waiters === 2, 10_000, 20)).toBe(true);
        await holder.release();
        // arrival order is not pinned here (both were queued before the release); each is served in turn
        const first: Lease = await Promise.race(waiters);
        expect(first.token).toBeGreaterThan(holder.token);
        await first.release();
        const [a, b] = await Promise.all(waiters);
        const second = a === first ? b! : a!;
        expect(second.token).toBeGreaterThan(first.token);
        await second.release();
        last = second.token;
      }
      expect(failed).toEqual([]);
    } finally {
      await locks.close();
    }
  }, 120_000);
});

describe('the pgbouncer fixture', () => {
  it('stop() kills pgbouncer itself, even one that does not act on SIGTERM, and resolves once it is gone', async () => {
    const bouncer = await startBouncer();
    const port = Number(new URL(bouncer.url).port);
    expect(alive(bouncer.pid)).toBe(true);
    expect(listening(port)).toBe(true);
    // frozen, it cannot act on SIGTERM: stop() must fall back to SIGKILL on pgbouncer, not only on runuser
    process.kill(bouncer.pid, 'SIGSTOP');
    await bouncer.stop();
    expect(alive(bouncer.pid)).toBe(false);
    // nothing listens on its port any more. (Neither probe is proof: a connect() to a closed port in
    // the ephemeral range can now and then connect the socket to itself, and listening on it
    // ourselves fails while another test's connection happens to use that port as its source port
    // or the killed pgbouncer's sockets are still closing. The kernel's socket table tells.)
    expect(listening(port)).toBe(false);
  }, 60_000);
});

#!/usr/bin/env node
// The PostgreSQL backend against a plain advisory-lock baseline (pg_try_advisory_lock /
// pg_advisory_lock + pg_advisory_unlock on a dedicated connection per client).
//
//   npm run bench -- postgres [--url postgres://…] [--iterations 2000] [--seconds 10] [--workers 8]
//                             [--rounds 3] [--synchronous-commit off]
//
// Measures: uncontended acquire+release per second (one client, one key, sequential); contended
// hand-off latency (WORKERS clients in this process loop acquire → release on one key; hand-off =
// from the holder's release call to the next holder's grant); statements (= round trips) per
// acquire, the LISTEN connection's included. Prints figures; never fails on them. The URL defaults to LEASEHOLD_TEST_PG_URL, then
// .test-env.json, then postgres://postgres@127.0.0.1:5432/test. Works in its own schema, dropped at the end.
import { existsSync, readFileSync } from 'node:fs';
import os from 'node:os';
import pg from 'pg';
import { Locks } from '../dist/index.js';
import { postgresBackend } from '../dist/postgres/index.js';

const args = process.argv.slice(2);
const opt = (name, fallback) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 && args[i + 1] !== undefined ? args[i + 1] : fallback;
};
const envFile = new URL('../.test-env.json', import.meta.url);
const fileUrl = existsSync(envFile) ? JSON.parse(readFileSync(envFile, 'utf8')).LEASEHOLD_TEST_PG_URL : undefined;
const URL_ = opt('url', process.env.LEASEHOLD_TEST_PG_URL ?? fileUrl ?? 'postgres://postgres@127.0.0.1:5432/test');
const ITERATIONS = Number(opt('iterations', 2000));
const SECONDS = Number(opt('seconds', 10));
const WORKERS = Number(opt('workers', 8));
/** Uncontended runs alternate leasehold and baseline this many times; the median is reported (a shared machine is noisy). */
const ROUNDS = Number(opt('rounds', 3));
const SCHEMA = `lh_bench_${process.pid}`;
/** `off` runs leasehold's connections with synchronous_commit=off, to show what the commit flush costs (not a recommended setting: a crash may then lose the last grants, and tokens could repeat). */
const SYNC = opt('synchronous-commit', 'on');
if (SYNC !== 'on' && SYNC !== 'off') {
  console.error('--synchronous-commit takes on or off');
  process.exit(64);
}
const withSync = (url) => {
  if (SYNC === 'on') return url;
  const u = new URL(url);
  u.searchParams.set('options', '-c synchronous_commit=off');
  return u.toString();
};

/**
 * A pg Pool whose statements are counted (each query is one round trip): those through
 * pool.query, and those on clients checked out of it — the backend's LISTEN connection is one
 * (LISTEN when it opens, and any check it makes on it) — also counted apart in `listen` (which
 * includes the one-off schema set-up, before the measured part).
 */
function countingPool(max) {
  const inner = new pg.Pool({ connectionString: withSync(URL_), max });
  inner.on('error', () => {});
  const counter = { statements: 0, listen: 0 };
  return {
    counter,
    inner,
    pool: {
      // counted while checked out; release puts the client back as it was (the pool's own
      // queries on it are counted by pool.query above)
      connect: async () => {
        const client = await inner.connect();
        const { query, release } = client;
        client.query = (...a) => {
          counter.statements++;
          counter.listen++;
          return query.apply(client, a);
        };
        client.release = (...a) => {
          client.query = query;
          client.release = release;
          return release.apply(client, a);
        };
        return client;
      },
      query: (text, values) => {
        counter.statements++;
        return inner.query(text, values);
      },
    },
  };
}

const percentile = (sorted, p) => sorted[Math.min(sorted.length - 1, Math.floor(p * (sorted.length - 1)))];
const ms = (x) => x.toFixed(2);

// ---------- uncontended ----------

async function uncontendedLeasehold() {
  const { pool, counter, inner } = countingPool(2);
  // the LISTEN connection is a client of this pool, so its statements are counted too
  const backend = postgresBackend({ pool, schema: SCHEMA });
  const locks = new Locks({ backend });
  const key = 'bench:uncontended';
  for (let i = 0; i < 200; i++) await (await locks.acquire(key, { ttlMs: 30_000 })).release();
  const before = counter.statements;
  const start = performance.now();
  for (let i = 0; i < ITERATIONS; i++) {
    const lease = await locks.acquire(key, { ttlMs: 30_000 });
    await lease.release();
  }
  const elapsed = performance.now() - start;
  const statements = counter.statements - before;
  await locks.close();
  await inner.end();
  return { perSecond: (ITERATIONS * 1000) / elapsed, statementsPerCycle: statements / ITERATIONS };
}

async function uncontendedAdvisory() {
  const client = new pg.Client({ connectionString: URL_ });
  await client.connect();
  const key = 'bench:uncontended';
  for (let i = 0; i < 200; i++) {
    await client.query('SELECT pg_try_advisory_lock(hashtext($1))', [key]);
    await client.query('SELECT pg_advisory_unlock(hashtext($1))', [key]);
  }
  const start = performance.now();
  for (let i = 0; i < ITERATIONS; i++) {
    const { rows } = await client.query('SELECT pg_try_advisory_lock(hashtext($1)) AS ok', [key]);
    if (!rows[0].ok) throw new Error('baseline: uncontended advisory lock was busy');
    await client.query('SELECT pg_advisory_unlock(hashtext($1))', [key]);
  }
  const elapsed = performance.now() - start;
  await client.end();
  return { perSecond: (ITERATIONS * 1000) / elapsed, statementsPerCycle: 2 };
}

// ---------- contended hand-off ----------

/**
 * Runs `workers` loops of acquire → (record) → release on one key for SECONDS. Returns hand-off
 * latencies: the time from a holder's release call to the next grant (in this process, one clock).
 */
async function handOff(workers, acquire, release) {
  const latencies = [];
  let lastReleaseAt;
  let holders = 0;
  let overlaps = 0;
  let grants = 0;
  const deadline = performance.now() + SECONDS * 1000;
  await Promise.all(
    Array.from({ length: workers }, async (_, w) => {
      while (performance.now() < deadline) {
        const handle = await acquire(w);
        const grantedAt = performance.now();
        if (++holders > 1) overlaps++;
        grants++;
        if (lastReleaseAt !== undefined) latencies.push(grantedAt - lastReleaseAt);
        holders--;
        lastReleaseAt = performance.now();
        await release(w, handle);
      }
    }),
  );
  latencies.sort((a, b) => a - b);
  return { grants, perSecond: grants / SECONDS, p50: percentile(latencies, 0.5), p99: percentile(latencies, 0.99), overlaps };
}

async function contendedLeasehold() {
  const key = 'bench:contended';
  const clients = Array.from({ length: WORKERS }, () => {
    const { pool, counter, inner } = countingPool(3);
    // each worker is its own client: its own pool and its own LISTEN connection (one client of that
    // pool, held while it waits, its statements counted), as separate processes would be
    const locks = new Locks({ backend: postgresBackend({ pool, schema: SCHEMA }) });
    return { locks, counter, inner };
  });
  const result = await handOff(
    WORKERS,
    (w) => clients[w].locks.acquire(key, { ttlMs: 30_000, waitMs: Infinity }),
    (_w, lease) => lease.release(),
  );
  const statements = clients.reduce((n, c) => n + c.counter.statements, 0);
  const listenStatements = clients.reduce((n, c) => n + c.counter.listen, 0);
  for (const c of clients) {
    await c.locks.close();
    await c.inner.end();
  }
  // each grant is followed by one release statement; the rest are acquire attempts, subscription checks and queue exits
  return {
    ...result,
    statementsPerGrant: statements / result.grants,
    acquireStatementsPerGrant: (statements - result.grants) / result.grants,
    listenStatementsPerGrant: listenStatements / result.grants,
  };
}

async function contendedAdvisory() {
  const key = 'bench:contended';
  const clients = await Promise.all(
    Array.from({ length: WORKERS }, async () => {
      const c = new pg.Client({ connectionString: URL_ });
      await c.connect();
      return c;
    }),
  );
  const result = await handOff(
    WORKERS,
    (w) => clients[w].query('SELECT pg_advisory_lock(hashtext($1))', [key]),
    (w) => clients[w].query('SELECT pg_advisory_unlock(hashtext($1))', [key]),
  );
  for (const c of clients) await c.end();
  return { ...result, statementsPerGrant: 2, acquireStatementsPerGrant: 1, listenStatementsPerGrant: 0 };
}

// ---------- main ----------

const admin = new pg.Client({ connectionString: URL_ });
await admin.connect();
const { rows: version } = await admin.query('SHOW server_version');
try {
  console.log(`leasehold PostgreSQL benchmark — ${new Date().toISOString()}`);
  console.log(
    `machine: ${os.cpus()[0]?.model ?? 'unknown cpu'}, ${os.cpus().length} cores, ${Math.round(os.totalmem() / 2 ** 30)} GiB; node ${process.version}; PostgreSQL ${version[0].server_version} at ${new URL(URL_).host}`,
  );
  console.log(
    `${ROUNDS} × ${ITERATIONS} iterations (uncontended), ${SECONDS}s with ${WORKERS} workers (contended); leasehold with synchronous_commit=${SYNC}\n`,
  );

  const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  const lRounds = [];
  const aRounds = [];
  for (let r = 0; r < ROUNDS; r++) {
    lRounds.push(await uncontendedLeasehold());
    aRounds.push(await uncontendedAdvisory());
  }
  const uL = { perSecond: median(lRounds.map((x) => x.perSecond)), statementsPerCycle: lRounds[0].statementsPerCycle };
  const uA = { perSecond: median(aRounds.map((x) => x.perSecond)), statementsPerCycle: 2 };
  console.log(
    `uncontended rounds (acquire+release /s): leasehold ${lRounds.map((x) => x.perSecond.toFixed(0)).join(', ')}; baseline ${aRounds.map((x) => x.perSecond.toFixed(0)).join(', ')}`,
  );
  const cL = await contendedLeasehold();
  const cA = await contendedAdvisory();

  const rows = [
    ['uncontended acquire+release /s (median)', uL.perSecond.toFixed(0), uA.perSecond.toFixed(0)],
    ['statements (round trips) per uncontended acquire+release', uL.statementsPerCycle.toFixed(2), uA.statementsPerCycle.toFixed(2)],
    [`contended hand-off p50 ms (${WORKERS} workers)`, ms(cL.p50), ms(cA.p50)],
    [`contended hand-off p99 ms (${WORKERS} workers)`, ms(cL.p99), ms(cA.p99)],
    ['contended grants /s', cL.perSecond.toFixed(0), cA.perSecond.toFixed(0)],
    ['statements per contended acquire (excl. release)', cL.acquireStatementsPerGrant.toFixed(2), cA.acquireStatementsPerGrant.toFixed(2)],
    ['… of which on the LISTEN connection', cL.listenStatementsPerGrant.toFixed(2), cA.listenStatementsPerGrant.toFixed(2)],
    ['overlapping holders seen', String(cL.overlaps), String(cA.overlaps)],
  ];
  const width = Math.max(...rows.map((r) => r[0].length));
  console.log(`| ${'measure'.padEnd(width)} | leasehold postgres | advisory-lock baseline |`);
  console.log(`| ${'-'.repeat(width)} | -----------------: | ---------------------: |`);
  for (const [name, a, b] of rows) console.log(`| ${name.padEnd(width)} | ${a.padStart(18)} | ${b.padStart(22)} |`);
  console.log(
    `\nratio uncontended (leasehold / baseline): ${(uL.perSecond / uA.perSecond).toFixed(2)}×; hand-off p50: ${(cL.p50 / cA.p50).toFixed(1)}× the baseline's`,
  );
} finally {
  await admin.query(`DROP SCHEMA IF EXISTS ${SCHEMA} CASCADE`).catch(() => {});
  await admin.end();
}

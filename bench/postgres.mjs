#!/usr/bin/env node
// The PostgreSQL backend side by side with ShedLock's own statements (the JDBC provider's
// INSERT … ON CONFLICT (name) DO UPDATE … WHERE lock_until <= now and its UPDATEs, bench/lib/shedlock.mjs)
// polling at Spring's usual 100 ms and at a tight 10 ms, and a plain advisory lock
// (pg_advisory_lock + pg_advisory_unlock on one connection per client: no ttl, no token, gone with its
// connection; it waits inside the server).
//
//   npm run bench -- postgres [--url postgres://…] [--rounds 3] [--pair-seconds 2] [--seconds 5] [--workers 8]
//                             [--hold-ms 1] [--poll-ms 100] [--fast-poll-ms 10] [--synchronous-commit off]
//                             [--only uncontended,contended] [--sides leasehold,advisory-lock,shedlock-100ms,…]
//
// - uncontended: one client, one key, acquire + release in sequence for --pair-seconds (the ShedLock
//   peer once: uncontended it never polls).
// - contended: --workers clients in this process (each its own pool; leasehold's its own LISTEN
//   connection too, as separate processes would have) loop acquire → hold ~--hold-ms → release on one
//   key for --seconds (bench/lib/contention.mjs: hand-off, waits, barging, overlaps, Jain's index).
// - rounds: each round runs every side once per scenario, in turn (the order reversed every other
//   round); the table shows medians of the rounds.
// - statements: counted by the client (each query is one round trip; those on leasehold's LISTEN
//   connection also apart) and by the server: xact_commit + xact_rollback of pg_stat_database for the
//   bench's own database (pg_stat_statements is not loaded here), from before a run's first connection
//   to after its last has gone (a backend flushes its counts when it exits), minus the same run with
//   no timed part (connections, warm-up, close). In autocommit every statement is one transaction.
// - `--synchronous-commit off` runs leasehold without the commit flush: a diagnostic, not a setting.
//
// Prints figures; never fails on them. The URL defaults to LEASEHOLD_TEST_PG_URL, then .test-env.json,
// then postgres://postgres@127.0.0.1:5432/test. Works in a database of its own, dropped at the end.
import { existsSync, readFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { Locks } from '../dist/index.js';
import { postgresBackend } from '../dist/postgres/index.js';
import { Figures, fmt, machine, options, pairs, sections, summarize } from './lib/contention.mjs';
import { SHEDLOCK_POSTGRES, shedlockClient } from './lib/shedlock.mjs';

const opt = options();
const envFile = new URL('../.test-env.json', import.meta.url);
const fileUrl = existsSync(envFile) ? JSON.parse(readFileSync(envFile, 'utf8')).LEASEHOLD_TEST_PG_URL : undefined;
const ADMIN_URL = opt('url', process.env.LEASEHOLD_TEST_PG_URL ?? fileUrl ?? 'postgres://postgres@127.0.0.1:5432/test');
const ROUNDS = Number(opt('rounds', 3));
const PAIR_SECONDS = Number(opt('pair-seconds', 2));
const SECONDS = Number(opt('seconds', 5));
const WORKERS = Number(opt('workers', 8));
const HOLD_MS = Number(opt('hold-ms', 1));
const POLL_MS = Number(opt('poll-ms', 100));
const FAST_POLL_MS = Number(opt('fast-poll-ms', 10));
const SYNC = opt('synchronous-commit', 'on');
if (SYNC !== 'on' && SYNC !== 'off') {
  console.error('--synchronous-commit takes on or off');
  process.exit(64);
}
const DATABASE = `lh_bench_${process.pid}`;
const SCHEMA = 'lh_bench';
const SHEDLOCK_TABLE = 'shedlock';
const TTL_MS = 30_000;
const URL_ = (() => {
  const u = new URL(ADMIN_URL);
  u.pathname = `/${DATABASE}`;
  return u.toString();
})();
const withSync = (url) => {
  if (SYNC === 'on') return url;
  const u = new URL(url);
  u.searchParams.set('options', '-c synchronous_commit=off');
  return u.toString();
};

/**
 * A pg Pool whose statements are counted (each query is one round trip): those through pool.query,
 * and those on clients checked out of it — leasehold's LISTEN connection is one — also counted apart
 * in `listen`.
 */
function countingPool(max, connectionString = URL_) {
  const inner = new pg.Pool({ connectionString, max });
  inner.on('error', () => {});
  const counter = { statements: 0, listen: 0 };
  const pool = {
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
  };
  return { pool, counter, inner };
}

// ---------------------------------------------------------------------------------------------
// Sides: open(w) → { lock(key) → release(), close(), counter }
// ---------------------------------------------------------------------------------------------
const leasehold = async () => {
  const { pool, counter, inner } = countingPool(3, withSync(URL_));
  const locks = new Locks({ backend: postgresBackend({ pool, schema: SCHEMA }) });
  return {
    counter,
    lock: async (key) => {
      const lease = await locks.acquire(key, { ttlMs: TTL_MS, waitMs: Number.POSITIVE_INFINITY });
      return () => lease.release();
    },
    close: async () => {
      await locks.close();
      await inner.end();
    },
  };
};

const advisoryLock = async () => {
  const client = new pg.Client({ connectionString: URL_ });
  await client.connect();
  const counter = { statements: 0, listen: 0 };
  const q = (sql, values) => (counter.statements++, client.query(sql, values));
  return {
    counter,
    lock: async (key) => {
      await q('SELECT pg_advisory_lock(hashtext($1))', [key]);
      return async () => {
        await q('SELECT pg_advisory_unlock(hashtext($1))', [key]);
      };
    },
    close: () => client.end(),
  };
};

const shedlock = (pollMs) => async (w) => {
  const pool = new pg.Pool({ connectionString: URL_, max: 2 });
  pool.on('error', () => {});
  const counter = { statements: 0, listen: 0 };
  return {
    counter,
    ...shedlockClient({
      dialect: SHEDLOCK_POSTGRES,
      table: SHEDLOCK_TABLE,
      run: async (sql, values) => (counter.statements++, (await pool.query(sql, values)).rowCount),
      lockedBy: `${hostname()}-${process.pid}-${w}`,
      pollMs,
      lockAtMostForMs: TTL_MS,
      close: () => pool.end(),
    }),
  };
};

const SHEDLOCK = `shedlock-${POLL_MS}ms`;
const SHEDLOCK_FAST = `shedlock-${FAST_POLL_MS}ms`;
const sides = { leasehold, 'advisory-lock': advisoryLock, [SHEDLOCK]: shedlock(POLL_MS), [SHEDLOCK_FAST]: shedlock(FAST_POLL_MS) };
const names = opt('sides', Object.keys(sides).join(',')).split(',');
for (const n of names) if (!sides[n]) throw new Error(`--sides: no side named ${n} (${Object.keys(sides).join(', ')})`);
const only = new Set(opt('only', 'uncontended,contended').split(','));
const peers = names.filter((n) => n !== 'leasehold');
/** The fast poller's uncontended run would repeat the usual one's statements: it never polls there. */
const uncontendedNames = names.filter((n) => n !== SHEDLOCK_FAST || !names.includes(SHEDLOCK));

// ---------------------------------------------------------------------------------------------
// Server-side count: transactions of the bench's database, read once no connection to it is left
// ---------------------------------------------------------------------------------------------
const admin = new pg.Client({ connectionString: ADMIN_URL });

async function serverTransactions() {
  for (let i = 0; i < 250; i++) {
    const { rows } = await admin.query('SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = $1', [DATABASE]);
    if (rows[0].n === 0) break;
    await sleep(20);
  }
  const { rows } = await admin.query('SELECT (xact_commit + xact_rollback)::bigint AS x FROM pg_stat_database WHERE datname = $1', [DATABASE]);
  return Number(rows[0].x);
}

/** One run of a side: clients opened, warmed up, timed (for `seconds`; 0 = calibration), closed; its counts. */
async function run(name, scenario, seconds) {
  const before = await serverTransactions();
  const n = scenario === 'uncontended' ? 1 : WORKERS;
  const clients = await Promise.all(Array.from({ length: n }, (_, w) => sides[name](w)));
  const count = () =>
    clients.reduce((a, c) => ({ statements: a.statements + c.counter.statements, listen: a.listen + c.counter.listen }), { statements: 0, listen: 0 });
  let marked;
  const mark = async () => {
    marked = count();
  };
  const key = `bench:${scenario}:${name}`;
  const result =
    scenario === 'uncontended' ? await pairs(clients[0], key, seconds, mark) : summarize(await sections(clients, key, seconds, HOLD_MS, mark), n, seconds);
  const end = count();
  await Promise.all(clients.map((c) => c.close()));
  return {
    result,
    units: scenario === 'uncontended' ? result.pairs : result.sections,
    client: end.statements - marked.statements,
    listen: end.listen - marked.listen,
    server: (await serverTransactions()) - before,
  };
}

// ---------------------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------------------
await admin.connect();
for (let attempt = 0; ; attempt++) {
  try {
    await admin.query(`CREATE DATABASE ${DATABASE}`);
    break;
  } catch (error) {
    // 55006: template1 is in use by another session for a moment (other suites create databases too)
    if (error?.code !== '55006' || attempt >= 20) throw error;
    await sleep(250);
  }
}
const figures = new Figures();
const overlaps = Object.fromEntries(names.map((n) => [n, 0]));
try {
  const { rows: version } = await admin.query('SHOW server_version');
  console.log(`leasehold PostgreSQL benchmark — ${new Date().toISOString()}`);
  console.log(`machine: ${machine()}; PostgreSQL ${version[0].server_version} at ${new URL(ADMIN_URL).host}`);
  console.log(
    `${ROUNDS} rounds; uncontended ${PAIR_SECONDS} s per side, contended ${SECONDS} s per side with ${WORKERS} workers holding ~${HOLD_MS} ms; ` +
      `leasehold with synchronous_commit=${SYNC}; ShedLock polling every ${POLL_MS} / ${FAST_POLL_MS} ms\n`,
  );

  // set-up: ShedLock's table (as its README creates it), leasehold's schema (made on first use)
  const setup = new pg.Client({ connectionString: URL_ });
  await setup.connect();
  await setup.query(SHEDLOCK_POSTGRES.createTable(SHEDLOCK_TABLE));
  await setup.end();
  if (names.includes('leasehold')) {
    const c = await leasehold();
    await (await c.lock('bench:setup'))();
    await c.close();
  }
  // calibration: each side's runs with no timed part (connections, warm-up, close), taken off the server's count
  const calibration = {};
  for (const name of names) {
    for (const scenario of ['uncontended', 'contended']) calibration[`${scenario}:${name}`] = (await run(name, scenario, 0)).server;
  }

  for (let r = 0; r < ROUNDS; r++) {
    const order = (list) => (r % 2 === 0 ? list : [...list].reverse());
    for (const name of only.has('uncontended') ? order(uncontendedNames) : []) {
      const x = await run(name, 'uncontended', PAIR_SECONDS);
      const column = name === SHEDLOCK_FAST ? SHEDLOCK : name;
      figures.add('uncontended, 1 client in sequence (pairs/s)', column, x.result.perSecond);
      figures.add('uncontended: statements per pair (client)', column, x.client / x.units);
      figures.add('uncontended: transactions per pair (server)', column, (x.server - calibration[`uncontended:${name}`]) / x.units);
    }
    for (const name of only.has('contended') ? order(names) : []) {
      const x = await run(name, 'contended', SECONDS);
      const c = x.result;
      const f = (figure, v) => figures.add(`contended, ${WORKERS} workers: ${figure}`, name, v);
      f('sections/s', c.perSecond);
      f('hand-off p50 (ms)', c.handoffP50);
      f('hand-off p99 (ms)', c.handoffP99);
      f('wait p50 (ms)', c.waitP50);
      f('longest wait (ms)', c.longestWait);
      f("Jain's index", c.jain);
      f('releaser barges back (share)', c.barge);
      f('statements per section (client)', x.client / x.units);
      f('… of which on the LISTEN connection', x.listen / x.units);
      f('transactions per section (server)', (x.server - calibration[`contended:${name}`]) / x.units);
      overlaps[name] += c.overlaps;
    }
  }

  console.log(figures.table(names, 'leasehold', peers));
  const rounds = (figure, list) =>
    list
      .filter((n) => figures.rounds(figure, n).length)
      .map((n) => `${n} ${figures.rounds(figure, n).map(fmt).join(', ')}`)
      .join('; ');
  if (only.has('uncontended')) console.log(`\nuncontended rounds (pairs/s): ${rounds('uncontended, 1 client in sequence (pairs/s)', names)}`);
  if (only.has('contended')) {
    console.log(`contended rounds (sections/s): ${rounds(`contended, ${WORKERS} workers: sections/s`, names)}`);
    console.log(`contended rounds (hand-off p50 ms): ${rounds(`contended, ${WORKERS} workers: hand-off p50 (ms)`, names)}`);
    console.log(`overlapping holders seen, all rounds (must be 0): ${names.map((n) => `${n} ${overlaps[n]}`).join('; ')}`);
  }
  console.log(
    `${SHEDLOCK} / ${SHEDLOCK_FAST} = ShedLock's usingDbTime() statements (INSERT … ON CONFLICT DO UPDATE … WHERE lock_until <= now once, then UPDATE … WHERE ` +
      `lock_until <= now; unlock UPDATE), autocommit, lockAtMostFor ${TTL_MS / 1000} s, tried again every ${POLL_MS} / ${FAST_POLL_MS} ms; ` +
      'its uncontended figures are one run (it never polls there). advisory-lock = pg_advisory_lock / pg_advisory_unlock on one connection per client.',
  );
} finally {
  await admin.query(`DROP DATABASE IF EXISTS ${DATABASE} WITH (FORCE)`).catch((error) => console.error(`could not drop ${DATABASE}: ${error.message}`));
  await admin.end();
}

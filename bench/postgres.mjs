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
// - server time: leasehold's PL/pgSQL functions are timed by the server (track_functions = 'pl' on
//   the bench's database; pg_stat_user_functions self_time, without the commit), mean per call of a run.
// - `--synchronous-commit off` runs every side without the commit flush: a diagnostic (what is left
//   when commits do not wait for the disk), not a setting to run leasehold with.
//
// Prints figures; never fails on them. The URL defaults to LEASEHOLD_TEST_PG_URL, then .test-env.json,
// then postgres://postgres@127.0.0.1:5432/test. Works in a database of its own, dropped at the end.
import { existsSync, readFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { Locks } from '../dist/index.js';
import { postgresBackend } from '../dist/postgres/index.js';
import { Figures, fmt, machine, median, options, pairs, sections, summarize, Trips } from './lib/contention.mjs';
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
  const counter = { statements: 0, listen: 0, trips: new Trips() };
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
      const kind = /_acquire"?\(/.test(text) ? 'acquire' : /_release"?\(/.test(text) ? 'release' : undefined;
      return counter.trips.time(kind, inner.query(text, values));
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
  const client = new pg.Client({ connectionString: withSync(URL_) });
  await client.connect();
  const counter = { statements: 0, listen: 0, trips: new Trips() };
  const q = (kind, sql, values) => (counter.statements++, counter.trips.time(kind, client.query(sql, values)));
  return {
    counter,
    lock: async (key) => {
      await q('acquire', 'SELECT pg_advisory_lock(hashtext($1))', [key]);
      return async () => {
        await q('release', 'SELECT pg_advisory_unlock(hashtext($1))', [key]);
      };
    },
    close: () => client.end(),
  };
};

/**
 * ShedLock's statements through pg, each a named prepared statement: what PgJDBC does with a statement
 * run more than prepareThreshold (5) times (parsed and planned once per connection).
 */
const statementNames = new Map();
const prepared = (text, values) => {
  let name = statementNames.get(text);
  if (!name) statementNames.set(text, (name = `shedlock_${statementNames.size}`));
  return { name, text, values };
};
const shedlock = (pollMs) => async (w) => {
  const pool = new pg.Pool({ connectionString: withSync(URL_), max: 2 });
  pool.on('error', () => {});
  const counter = { statements: 0, listen: 0, trips: new Trips() };
  return {
    counter,
    ...shedlockClient({
      dialect: SHEDLOCK_POSTGRES,
      table: SHEDLOCK_TABLE,
      run: async (sql, values, kind) => (counter.statements++, (await counter.trips.time(kind, pool.query(prepared(sql, values)))).rowCount),
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
    for (const c of clients) c.counter.trips.reset();
  };
  const key = `bench:${scenario}:${name}`;
  const result =
    scenario === 'uncontended' ? await pairs(clients[0], key, seconds, mark) : summarize(await sections(clients, key, seconds, HOLD_MS, mark), n, seconds);
  const end = count();
  await Promise.all(clients.map((c) => c.close()));
  const server = (await serverTransactions()) - before;
  return {
    result,
    units: scenario === 'uncontended' ? result.pairs : result.sections,
    client: end.statements - marked.statements,
    listen: end.listen - marked.listen,
    server,
    functions: name === 'leasehold' ? await functionTimes() : undefined,
    trips: { acquire: median(clients.flatMap((c) => c.counter.trips.acquire)), release: median(clients.flatMap((c) => c.counter.trips.release)) },
  };
}

/**
 * Server time in each PL/pgSQL function since the last call of this (calls, ms of self_time: the
 * function's own statements, without the commit that follows it), read once the run's sessions
 * have gone (a session flushes its counts when it exits). The reading session comes after the run's
 * transaction count and before the next run's.
 */
let functionsSeen = new Map();
async function functionTimes() {
  const reader = new pg.Client({ connectionString: URL_ });
  await reader.connect();
  const { rows } = await reader.query('SELECT funcname AS f, calls::int AS calls, self_time AS self FROM pg_stat_user_functions');
  await reader.end();
  const seen = new Map(rows.map((r) => [r.f, { calls: r.calls, self: r.self }]));
  const delta = new Map();
  for (const [f, x] of seen) {
    const was = functionsSeen.get(f) ?? { calls: 0, self: 0 };
    delta.set(f, { calls: x.calls - was.calls, self: x.self - was.self });
  }
  functionsSeen = seen;
  return delta;
}
/** Mean server ms per call of the function whose name ends with `suffix` in one run's times. */
const perCall = (functions, suffix) => {
  const x = [...(functions ?? [])].find(([f]) => f.endsWith(suffix))?.[1];
  return x?.calls ? x.self / x.calls : undefined;
};

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
// the server times leasehold's PL/pgSQL functions in every session of this database (pg_stat_user_functions)
await admin.query(`ALTER DATABASE ${DATABASE} SET track_functions = 'pl'`);
const figures = new Figures();
const overlaps = Object.fromEntries(names.map((n) => [n, 0]));
try {
  const { rows: version } = await admin.query('SHOW server_version');
  console.log(`leasehold PostgreSQL benchmark — ${new Date().toISOString()}`);
  console.log(`machine: ${machine()}; PostgreSQL ${version[0].server_version} at ${new URL(ADMIN_URL).host}`);
  console.log(
    `${ROUNDS} rounds; uncontended ${PAIR_SECONDS} s per side, contended ${SECONDS} s per side with ${WORKERS} workers holding ~${HOLD_MS} ms; ` +
      `synchronous_commit=${SYNC}; ShedLock polling every ${POLL_MS} / ${FAST_POLL_MS} ms\n`,
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
      figures.add('uncontended: acquire p50 (ms)', column, x.result.acquireP50);
      figures.add('uncontended: release p50 (ms)', column, x.result.releaseP50);
      figures.add("uncontended: acquire's statement round trip p50 (ms)", column, x.trips.acquire);
      figures.add("uncontended: release's statement round trip p50 (ms)", column, x.trips.release);
      if (x.functions) {
        figures.add('uncontended: server time per acquire call (ms)', column, perCall(x.functions, '_acquire'));
        figures.add('uncontended: server time per release call (ms)', column, perCall(x.functions, '_release'));
      }
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
      f('wait p99 (ms)', c.waitP99);
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

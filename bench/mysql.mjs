#!/usr/bin/env node
// The MySQL / MariaDB backend side by side with ShedLock's own statements (its JDBC provider's
// INSERT IGNORE / UPDATE … WHERE lock_until <= now and unlock UPDATE, bench/lib/shedlock.mjs), polling at
// Spring's usual 100 ms and at a tight 10 ms: what the database's job-scheduler users run today.
//
//   npm run bench -- mysql [--url mysql://…] [--rounds 3] [--pair-seconds 1] [--seconds 2] [--workers 8] [--hold-ms 1]
//                          [--poll-ms 100] [--fast-poll-ms 10] [--only uncontended,contended] [--sides leasehold,shedlock-100ms,…]
//
// - uncontended: one client, one key, acquire + release in sequence for --pair-seconds (the ShedLock
//   peer once: uncontended it never polls).
// - contended: --workers clients in this process, each its own mysql2 pool (and leasehold's its own
//   backend and change poller, as separate processes would have), loop acquire → hold ~--hold-ms →
//   release on one key for --seconds (bench/lib/contention.mjs: hand-off, waits, barging, overlaps,
//   Jain's index).
// - rounds: each round runs every side once per scenario, in turn (the order reversed every other
//   round); the table shows medians of the rounds.
// - statements: counted by the server, per connection: `SHOW SESSION STATUS` (Questions, the
//   statements clients sent, a CALL being one; and the Com_* counters) on every connection of the
//   side's pools, read after the warm-up and at the end of the timed part, less the reads themselves.
//   The server's global counters would also count the other sessions on a shared server.
// - server time per pair: beside each uncontended run, 30 pairs on one connection with profiling on
//   (SHOW PROFILES: every statement the server ran, those inside procedures one by one, with its
//   duration, the COMMIT's log flush included).
//
// Prints figures; never fails on them. The URL defaults to LEASEHOLD_TEST_MYSQL_URL, then
// mysql://root@127.0.0.1:3306/test. Tables (and leasehold's procedures) are named after this process
// and dropped at the end.
import { hostname } from 'node:os';
import mysql from 'mysql2/promise';
import { Locks } from '../dist/index.js';
import { Figures, fmt, machine, median, options, pairs, sections, summarize, Trips } from './lib/contention.mjs';
import { SHEDLOCK_MYSQL, shedlockClient } from './lib/shedlock.mjs';

const opt = options();
const URL_ = opt('url', process.env.LEASEHOLD_TEST_MYSQL_URL ?? 'mysql://root@127.0.0.1:3306/test');
const ROUNDS = Number(opt('rounds', 3));
const PAIR_SECONDS = Number(opt('pair-seconds', 1));
const SECONDS = Number(opt('seconds', 2));
const WORKERS = Number(opt('workers', 8));
const HOLD_MS = Number(opt('hold-ms', 1));
const POLL_MS = Number(opt('poll-ms', 100));
const FAST_POLL_MS = Number(opt('fast-poll-ms', 10));
const PREFIX = `lh_bench_${process.pid}`;
const LEASEHOLD_TABLE = `${PREFIX}_locks`;
const SHEDLOCK_TABLE = `${PREFIX}_shedlock`;
const TTL_MS = 30_000;

/** The session counters this bench reads: Questions and every Com_*. */
const STATUS = "SHOW SESSION STATUS WHERE Variable_name = 'Questions' OR Variable_name LIKE 'Com\\_%'";

/**
 * A mysql2 pool whose connections are remembered (the pool's 'connection' event hands out each new
 * one), so that their session counters can be read.
 */
function countedPool(connectionLimit, profiling = false) {
  const pool = mysql.createPool({ uri: URL_, connectionLimit, maxIdle: connectionLimit, supportBigNumbers: true, bigNumberStrings: true });
  const connections = [];
  pool.on('connection', (c) => {
    c.on('error', () => {});
    connections.push(c);
    // queued on the connection before its first use
    if (profiling) c.query('SET profiling = 1, profiling_history_size = 100', () => {});
  });
  return { pool, connections };
}

/** Each connection's counters now (the read itself counted in: one Questions, one Com_show_status). */
async function readCounters(connections) {
  const out = new Map();
  await Promise.all(
    connections.map(
      (c) =>
        new Promise((resolve, reject) =>
          c.query(STATUS, (error, rows) => {
            if (error) return reject(error);
            out.set(c, new Map(rows.map((r) => [r.Variable_name, Number(r.Value)])));
            resolve();
          }),
        ),
    ),
  );
  return out;
}

/** Statements between two reads, summed over connections (those opened in between count from zero), the reads taken off. */
function counterDelta(before, after) {
  const total = new Map();
  for (const [c, a] of after) {
    const b = before.get(c);
    for (const [name, value] of a) {
      const read = name === 'Questions' || name === 'Com_show_status' ? 1 : 0;
      const d = value - (b?.get(name) ?? 0) - read;
      if (d !== 0) total.set(name, (total.get(name) ?? 0) + d);
    }
  }
  return total;
}

// ---------------------------------------------------------------------------------------------
// Sides: open(w) → { lock(key) → release(), close(), connections }
// ---------------------------------------------------------------------------------------------
const { mysqlBackend } = await import('../dist/mysql/index.js').catch(() => ({}));

/** Which of leasehold's calls a statement is (its CALL of the acquire or release procedure), for the round-trip times. */
const callKind = (sql) => {
  const text = typeof sql === 'string' ? sql : sql?.sql;
  return /_acquire`?\(/.test(text) ? 'acquire' : /_release`?\(/.test(text) ? 'release' : undefined;
};

/** The pool as leasehold sees it, with the round trips of its acquire and release CALLs timed. */
function timedPool(pool, trips) {
  const timed = (target) => (sql, values) => trips.time(callKind(sql), target.query(sql, values));
  return {
    getConnection: async () => {
      const c = await pool.getConnection();
      const query = timed(c);
      return new Proxy(c, {
        get: (t, p) => {
          if (p === 'query') return query;
          const v = Reflect.get(t, p);
          return typeof v === 'function' ? v.bind(t) : v;
        },
      });
    },
    query: timed(pool),
  };
}

const leasehold = async (_w, profiling = false) => {
  const { pool, connections } = countedPool(profiling ? 1 : 3, profiling);
  const trips = new Trips();
  const locks = new Locks({ backend: mysqlBackend({ pool: timedPool(pool, trips), table: LEASEHOLD_TABLE }) });
  return {
    pool,
    connections,
    trips,
    lock: async (key) => {
      const lease = await locks.acquire(key, { ttlMs: TTL_MS, waitMs: Number.POSITIVE_INFINITY });
      return () => lease.release();
    },
    close: async () => {
      await locks.close();
      await pool.end();
    },
  };
};

const shedlock =
  (pollMs) =>
  async (w, profiling = false) => {
    const { pool, connections } = countedPool(profiling ? 1 : 2, profiling);
    const trips = new Trips();
    return {
      pool,
      connections,
      trips,
      ...shedlockClient({
        dialect: SHEDLOCK_MYSQL,
        table: SHEDLOCK_TABLE,
        run: async (sql, values, kind) => (await trips.time(kind, pool.query(sql, values)))[0].affectedRows,
        lockedBy: `${hostname()}-${process.pid}-${w}`,
        pollMs,
        lockAtMostForMs: TTL_MS,
        close: () => pool.end(),
      }),
    };
  };

const SHEDLOCK = `shedlock-${POLL_MS}ms`;
const SHEDLOCK_FAST = `shedlock-${FAST_POLL_MS}ms`;
const sides = { leasehold, [SHEDLOCK]: shedlock(POLL_MS), [SHEDLOCK_FAST]: shedlock(FAST_POLL_MS) };
const defaultSides = Object.keys(sides).filter((n) => n !== 'leasehold' || mysqlBackend);
const names = opt('sides', defaultSides.join(',')).split(',');
for (const n of names) if (!sides[n]) throw new Error(`--sides: no side named ${n} (${Object.keys(sides).join(', ')})`);
if (names.includes('leasehold') && !mysqlBackend) throw new Error('leasehold: dist/mysql/index.js has no mysqlBackend (run `npm run build`)');
const only = new Set(opt('only', 'uncontended,contended').split(','));
const lh = names.includes('leasehold') ? 'leasehold' : names[0];
const peers = names.filter((n) => n !== lh);
/** The fast poller's uncontended run would repeat the usual one's statements: it never polls there. */
const uncontendedNames = names.filter((n) => n !== SHEDLOCK_FAST || !names.includes(SHEDLOCK));

/** One run of a side: clients opened, warmed up, timed for `seconds`, closed; its figures and statement counts. */
async function run(name, scenario, seconds) {
  const n = scenario === 'uncontended' ? 1 : WORKERS;
  const clients = await Promise.all(Array.from({ length: n }, (_, w) => sides[name](w)));
  const connections = () => clients.flatMap((c) => c.connections);
  let before;
  const mark = async () => {
    before = await readCounters(connections());
    for (const c of clients) c.trips.reset();
  };
  const key = `bench:${scenario}:${name}`;
  try {
    const result =
      scenario === 'uncontended' ? await pairs(clients[0], key, seconds, mark) : summarize(await sections(clients, key, seconds, HOLD_MS, mark), n, seconds);
    const counts = counterDelta(before, await readCounters(connections()));
    const trips = { acquire: median(clients.flatMap((c) => c.trips.acquire)), release: median(clients.flatMap((c) => c.trips.release)) };
    return { result, units: scenario === 'uncontended' ? result.pairs : result.sections, counts, trips };
  } finally {
    await Promise.all(clients.map((c) => c.close()));
  }
}

/**
 * The server's own time per uncontended pair: SHOW PROFILES on the side's one connection, with
 * profiling on, lists every statement the server ran for it (those inside a CALL one by one) with
 * its duration. What a pair costs in the server, apart from the network and the client; a diagnostic
 * run beside the timed ones (profiling adds its own work).
 */
async function serverProfile(name, wanted = 30) {
  const c = await sides[name](0, true);
  const key = `bench:profile:${name}`;
  const profiles = async () => (await c.pool.query('SHOW PROFILES'))[0].filter((p) => !/^\s*SHOW PROFILES/i.test(p.Query));
  try {
    for (let i = 0; i < 5; i++) await (await c.lock(key))();
    const ms = [];
    const statements = [];
    for (let i = 0; i < wanted; i++) {
      const last = Math.max(0, ...(await profiles()).map((p) => p.Query_ID));
      await (await c.lock(key))();
      const mine = (await profiles()).filter((p) => p.Query_ID > last);
      ms.push(mine.reduce((a, p) => a + Number(p.Duration) * 1000, 0));
      statements.push(mine.length);
    }
    return { ms: median(ms), statements: median(statements) };
  } finally {
    await c.close();
  }
}

// ---------------------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------------------
const admin = await mysql.createConnection({ uri: URL_, multipleStatements: false });
const figures = new Figures();
const overlaps = Object.fromEntries(names.map((n) => [n, 0]));
const breakdown = {};
try {
  const [[{ version }]] = await admin.query('SELECT VERSION() AS version');
  const [[flush]] = await admin.query('SELECT @@innodb_flush_log_at_trx_commit AS f, @@sync_binlog AS s, @@log_bin AS b');
  console.log(`leasehold MySQL / MariaDB benchmark — ${new Date().toISOString()}`);
  console.log(
    `machine: ${machine()}; server ${version} at ${new URL(URL_).host} (innodb_flush_log_at_trx_commit=${flush.f}, log_bin=${flush.b}, sync_binlog=${flush.s})`,
  );
  console.log(
    `${ROUNDS} rounds; uncontended ${PAIR_SECONDS} s per side, contended ${SECONDS} s per side with ${WORKERS} workers holding ~${HOLD_MS} ms; ` +
      `ShedLock polling every ${POLL_MS} / ${FAST_POLL_MS} ms\n`,
  );

  // set-up: ShedLock's table (as its README creates it), leasehold's schema (made on first use)
  await admin.query(SHEDLOCK_MYSQL.createTable(SHEDLOCK_TABLE));
  if (names.includes('leasehold')) {
    const c = await leasehold();
    await (await c.lock('bench:setup'))();
    await c.close();
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
      figures.add('uncontended: statements per pair (server: Questions)', column, (x.counts.get('Questions') ?? 0) / x.units);
      const profile = await serverProfile(name);
      figures.add('uncontended: server time per pair (ms; SHOW PROFILES)', column, profile.ms);
      figures.add('uncontended: statements the server runs per pair (SHOW PROFILES)', column, profile.statements);
      const b = (breakdown[`uncontended:${column}`] ??= new Map());
      for (const [k, v] of x.counts) if (k !== 'Questions') b.set(k, (b.get(k) ?? 0) + v / x.units / ROUNDS);
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
      f('statements per section (server: Questions)', (x.counts.get('Questions') ?? 0) / x.units);
      overlaps[name] += c.overlaps;
      const b = (breakdown[`contended:${name}`] ??= new Map());
      for (const [k, v] of x.counts) if (k !== 'Questions') b.set(k, (b.get(k) ?? 0) + v / x.units / ROUNDS);
    }
  }

  console.log(figures.table(names, lh, peers));
  const rounds = (figure) =>
    names
      .filter((n) => figures.rounds(figure, n).length)
      .map((n) => `${n} ${figures.rounds(figure, n).map(fmt).join(', ')}`)
      .join('; ');
  if (only.has('uncontended')) console.log(`\nuncontended rounds (pairs/s): ${rounds('uncontended, 1 client in sequence (pairs/s)')}`);
  if (only.has('contended')) {
    console.log(`contended rounds (sections/s): ${rounds(`contended, ${WORKERS} workers: sections/s`)}`);
    console.log(`contended rounds (hand-off p50 ms): ${rounds(`contended, ${WORKERS} workers: hand-off p50 (ms)`)}`);
    console.log(`contended rounds (longest wait ms): ${rounds(`contended, ${WORKERS} workers: longest wait (ms)`)}`);
    console.log(`overlapping holders seen, all rounds (must be 0): ${names.map((n) => `${n} ${overlaps[n]}`).join('; ')}`);
  }
  // Com_* count the statements run inside stored procedures too (a CALL's own BEGIN, SET, SELECT …), Questions only what clients sent
  for (const [what, per] of [
    ['uncontended', 'pair'],
    ['contended', 'section'],
  ]) {
    for (const n of names) {
      if (!breakdown[`${what}:${n}`]) continue;
      const parts = [...breakdown[`${what}:${n}`]].filter(([, v]) => v >= 0.005).map(([k, v]) => `${k} ${fmt(v)}`);
      console.log(`${what}, Com_* per ${per} (mean of rounds), ${n}: ${parts.join(', ') || '—'}`);
    }
  }
  console.log(
    `${SHEDLOCK} / ${SHEDLOCK_FAST} = ShedLock's usingDbTime() statements (INSERT IGNORE once, then UPDATE … WHERE lock_until <= UTC_TIMESTAMP(3); ` +
      `unlock UPDATE), autocommit, lockAtMostFor ${TTL_MS / 1000} s, tried again every ${POLL_MS} / ${FAST_POLL_MS} ms; its uncontended figures are one run (it never polls there).`,
  );
} finally {
  // everything named after this process: ShedLock's table, leasehold's tables and procedures
  const [tables] = await admin.query('SELECT TABLE_NAME AS n FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE ?', [
    `${PREFIX}\\_%`,
  ]);
  for (const { n } of tables) await admin.query(`DROP TABLE IF EXISTS \`${n}\``);
  const [routines] = await admin.query(
    "SELECT ROUTINE_NAME AS n FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_TYPE = 'PROCEDURE' AND ROUTINE_NAME LIKE ?",
    [`${PREFIX}\\_%`],
  );
  for (const { n } of routines) await admin.query(`DROP PROCEDURE IF EXISTS \`${n}\``);
  await admin.end();
}
process.exit(0);

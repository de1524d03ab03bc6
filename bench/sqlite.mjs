#!/usr/bin/env node
// The SQLite backend (leasehold's embedded default, through `Locks`, as users call it) against
// proper-lockfile, what Node users pick to lock across the processes of one machine.
//
//   npm run bench -- sqlite [--rounds 3] [--pair-seconds 1] [--seconds 4] [--workers 8] [--hold-ms 1] [--dir DIR]
//                           [--only uncontended,contended] [--sides leasehold,proper-lockfile-1ms,…]
//
// - uncontended: one process, one lock, acquire + release in sequence for --pair-seconds; --rounds
//   rounds, the sides taking turns; the median is reported.
// - contended: --workers child processes (one worker each, its own client) loop acquire → hold
//   ~--hold-ms (setTimeout) → release on one lock for --seconds. Hand-off = from the holder's
//   release call to the grant of a *different* worker; longest wait = from an acquire call to its
//   grant. Every process reads the same clock (process.hrtime, CLOCK_MONOTONIC on Linux), so the
//   merged timeline also shows any overlap of two holders (a grant before the previous holder's
//   release call): it must be 0.
//
// Sides:
// - leasehold: sqliteBackend({ path }) with nothing else set: WAL, synchronous=FULL (every commit
//   waits for the disk), waiters queued in arrival order, a waiting process notices other
//   processes' commits by polling PRAGMA data_version every 20 ms; acquire with waitMs: Infinity.
// - leasehold-sync-normal: not a default, a diagnostic: the backend on a better-sqlite3 Database of
//   our own in WAL with synchronous=NORMAL (commits do not wait for the disk: tokens may repeat
//   after a power loss), to show what the fsyncs cost.
// - proper-lockfile-1ms / -20ms: proper-lockfile 4 (`lock(file)` makes `file.lock` with mkdir,
//   `release()` removes it). It cannot wait: by default (retries: 0) a busy lock fails at once
//   with ELOCKED. Here it retries forever at a fixed interval (retries: { retries: 0, forever: true,
//   factor: 1, minTimeout: P, maxTimeout: P }), P = 1 ms (as fast as a poller can go) or 20 ms
//   (leasehold's own change poll). Its other options are its defaults (stale 10 s, mtime touched
//   every 5 s, realpath).
//
// Prints figures; never fails on them. Works in a new directory inside --dir (default: the system's
// temporary directory), removed at the end: that disk's fsync is part of leasehold's figures.
import { execFileSync, spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import Database from 'better-sqlite3';
import lockfile from 'proper-lockfile';
import { Locks } from '../dist/index.js';
import { sqliteBackend } from '../dist/sqlite/index.js';

const args = process.argv.slice(2);
const opt = (name, fallback) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 && args[i + 1] !== undefined ? args[i + 1] : fallback;
};
const ROUNDS = Number(opt('rounds', 3));
const PAIR_SECONDS = Number(opt('pair-seconds', 1));
const SECONDS = Number(opt('seconds', 4));
const WORKERS = Number(opt('workers', 8));
const HOLD_MS = Number(opt('hold-ms', 1));
const KEY = 'bench:lock';

/** ms, with µs resolution, on CLOCK_MONOTONIC: the same clock in every process of this machine. */
const now = () => Number(process.hrtime.bigint() / 1000n) / 1000;

// ---------------------------------------------------------------------------------------------
// The sides: each opens a client in `dir` and returns { lock(): Promise<release()>, close() }
// ---------------------------------------------------------------------------------------------
function properLockfile(pollMs) {
  return async (dir) => {
    const target = join(dir, 'proper-lockfile-target');
    writeFileSync(target, '', { flag: 'a' }); // realpath (its default) needs the file to exist
    const options = { retries: { retries: 0, forever: true, factor: 1, minTimeout: pollMs, maxTimeout: pollMs } };
    return { lock: () => lockfile.lock(target, options), close: async () => {} };
  };
}

function leasehold(synchronous) {
  return async (dir) => {
    const path = join(dir, `leasehold-${synchronous}.db`);
    let db;
    let backend;
    if (synchronous === 'full') backend = sqliteBackend({ path });
    else {
      db = new Database(path, { timeout: 100 });
      db.pragma('journal_mode = WAL');
      db.pragma(`synchronous = ${synchronous}`);
      backend = sqliteBackend({ database: db });
    }
    const locks = new Locks({ backend });
    return {
      lock: async () => {
        const lease = await locks.acquire(KEY, { waitMs: Infinity });
        return () => lease.release();
      },
      close: async () => {
        await locks.close();
        db?.close();
      },
    };
  };
}

const sides = {
  leasehold: leasehold('full'),
  'leasehold-sync-normal': leasehold('normal'),
  'proper-lockfile-1ms': properLockfile(1),
  'proper-lockfile-20ms': properLockfile(20),
};
// --only and --sides run a part (quick runs, probes); the recorded figures come from full runs.
const names = opt('sides', Object.keys(sides).join(',')).split(',');
const only = new Set(opt('only', 'uncontended,contended').split(','));
for (const n of names) if (!sides[n]) throw new Error(`--sides: no side named ${n} (${Object.keys(sides).join(', ')})`);
const peers = ['proper-lockfile-1ms', 'proper-lockfile-20ms'].filter((n) => names.includes(n));

// ---------------------------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------------------------
async function uncontended(name, dir) {
  const c = await sides[name](dir);
  for (let i = 0; i < 20; i++) await (await c.lock())(); // warm-up: tables made, statements prepared
  let pairs = 0;
  const start = now();
  const end = start + PAIR_SECONDS * 1000;
  while (now() < end) {
    await (await c.lock())();
    pairs++;
  }
  const elapsed = now() - start;
  await c.close();
  return (pairs * 1000) / elapsed;
}

/** One child process, one worker: waits for the start time on stdin, then loops until it has passed SECONDS. */
async function child(name, dir, w) {
  const c = await sides[name](dir);
  const release = await c.lock(); // warm-up, alone: the workers take turns until all are ready
  await release();
  process.stdout.write('ready\n');
  const lines = createInterface({ input: process.stdin });
  const startAt = Number((await lines[Symbol.asyncIterator]().next()).value);
  lines.close();
  if (startAt > now()) await sleep(startAt - now());
  const stopAt = startAt + SECONDS * 1000;
  const sections = [];
  while (now() < stopAt) {
    const asked = now();
    const unlock = await c.lock();
    const got = now();
    await sleep(HOLD_MS);
    const releasing = now();
    await unlock();
    sections.push({ w, asked, got, releasing });
  }
  await c.close();
  process.stdout.write(`${JSON.stringify(sections)}\n`);
}

function summarize(sections) {
  sections.sort((a, b) => a.got - b.got);
  const handoffs = [];
  let same = 0;
  let overlaps = 0;
  for (let i = 1; i < sections.length; i++) {
    if (sections[i].got < sections[i - 1].releasing) overlaps++;
    if (sections[i].w === sections[i - 1].w) same++;
    else handoffs.push(sections[i].got - sections[i - 1].releasing);
  }
  handoffs.sort((a, b) => a - b);
  const q = (p) => (handoffs.length ? handoffs[Math.min(handoffs.length - 1, Math.floor(p * handoffs.length))] : NaN);
  const counts = Array.from({ length: WORKERS }, (_, w) => sections.filter((s) => s.w === w).length);
  const sum = counts.reduce((a, b) => a + b, 0);
  return {
    perSecond: sections.length / SECONDS,
    p50: q(0.5),
    p99: q(0.99),
    longestWait: Math.max(...sections.map((s) => s.got - s.asked)),
    jain: (sum * sum) / (WORKERS * counts.reduce((a, b) => a + b * b, 0)),
    barge: sections.length > 1 ? same / (sections.length - 1) : NaN,
    overlaps,
  };
}

async function contended(name, dir) {
  const self = fileURLToPath(import.meta.url);
  const children = Array.from({ length: WORKERS }, (_, w) =>
    // the child's own --child/--dir/--worker first: opt() takes the first of a name
    spawn(process.execPath, [self, '--child', name, '--dir', dir, '--worker', String(w), ...args], { stdio: ['pipe', 'pipe', 'inherit'] }),
  );
  const watchdog = setTimeout(
    () => {
      for (const c of children) c.kill('SIGKILL');
    },
    (SECONDS + 60) * 1000,
  );
  const outputs = children.map(
    (c) =>
      new Promise((resolve, reject) => {
        let out = '';
        c.stdout.on('data', (d) => (out += d));
        c.on('exit', (code) => (code === 0 ? resolve(out) : reject(new Error(`${name} worker exited with ${code}`))));
      }),
  );
  // all warmed up (each has opened its client and taken the lock once), then one start time for all
  await Promise.all(children.map((c) => new Promise((resolve) => createInterface({ input: c.stdout }).once('line', resolve))));
  const startAt = now() + 50;
  for (const c of children) c.stdin.end(`${startAt}\n`);
  const results = await Promise.all(outputs).finally(() => clearTimeout(watchdog));
  return summarize(results.flatMap((out) => JSON.parse(out.trim().split('\n').at(-1))));
}

// ---------------------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------------------
if (args.includes('--child')) {
  await child(opt('child'), opt('dir'), Number(opt('worker')));
  process.exit(0);
}

const parent = opt('dir', os.tmpdir());
mkdirSync(parent, { recursive: true });
const base = mkdtempSync(join(parent, 'leasehold-bench-sqlite-'));
const cleanup = () => rmSync(base, { recursive: true, force: true });
process.on('exit', cleanup);
let fsType = 'unknown filesystem';
try {
  fsType = execFileSync('findmnt', ['-n', '-o', 'FSTYPE,SOURCE', '-T', base], { encoding: 'utf8' }).trim().replace(/\s+/, ' on ');
} catch {}
const memory = new Database(':memory:');
const sqliteVersion = memory.prepare('SELECT sqlite_version() AS v').get().v;
memory.close();
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const fmt = (v) => {
  if (v === undefined || Number.isNaN(v)) return '—';
  if (Math.abs(v) >= 100) return Math.round(v).toLocaleString('en-US');
  return Math.abs(v) >= 10 ? v.toFixed(1) : v.toFixed(v < 1 ? 3 : 2);
};

console.log(`leasehold SQLite benchmark — ${new Date().toISOString()}`);
const cpu = `${os.cpus()[0]?.model ?? 'unknown cpu'}, ${os.cpus().length} cores, ${Math.round(os.totalmem() / 2 ** 30)} GiB`;
console.log(`machine: ${cpu}; node ${process.version}; SQLite ${sqliteVersion} (better-sqlite3); files in ${base} (${fsType})`);
console.log(`uncontended: ${ROUNDS} rounds × ${PAIR_SECONDS} s per side; contended: ${WORKERS} processes × ${SECONDS} s per side, lock held ~${HOLD_MS} ms\n`);

const results = {};
const add = (figure, name, v) => ((results[figure] ??= {})[name] ??= []).push(v);
for (let r = 0; only.has('uncontended') && r < ROUNDS; r++) {
  for (const name of r % 2 === 0 ? names : [...names].reverse()) {
    const dir = join(base, `u-${name}`);
    mkdirSync(dir, { recursive: true });
    add('uncontended, 1 process in sequence (pairs/s)', name, await uncontended(name, dir));
  }
}
const overlaps = {};
for (const name of only.has('contended') ? names : []) {
  const dir = join(base, `c-${name}`);
  mkdirSync(dir, { recursive: true });
  const c = await contended(name, dir);
  add(`contended, ${WORKERS} processes: sections/s`, name, c.perSecond);
  add(`contended, ${WORKERS} processes: hand-off p50 (ms)`, name, c.p50);
  add(`contended, ${WORKERS} processes: hand-off p99 (ms)`, name, c.p99);
  add(`contended, ${WORKERS} processes: longest wait (ms)`, name, c.longestWait);
  add(`contended, ${WORKERS} processes: Jain's index`, name, c.jain);
  add(`contended, ${WORKERS} processes: releaser barges back (share)`, name, c.barge);
  overlaps[name] = c.overlaps;
}

const header = ['figure', ...names, ...peers.map((n) => `lh / ${n}`)];
const rows = [header, header.map(() => '---')];
for (const [figure, byName] of Object.entries(results)) {
  const m = Object.fromEntries(Object.entries(byName).map(([k, v]) => [k, median(v)]));
  const lh = m.leasehold;
  const ratio = (p) => (m[p] && lh !== undefined ? `${lh / m[p] < 0.01 ? `1/${fmt(m[p] / lh)}` : (lh / m[p]).toFixed(2)}×` : '—');
  rows.push([figure, ...names.map((n) => fmt(m[n])), ...peers.map(ratio)]);
}
console.log(rows.map((r) => `| ${r.join(' | ')} |`).join('\n'));
const rounds = results['uncontended, 1 process in sequence (pairs/s)'];
if (rounds) console.log(`\nuncontended rounds (pairs/s): ${names.map((n) => `${n} ${rounds[n].map((v) => fmt(v)).join(', ')}`).join('; ')}`);
if (only.has('contended')) console.log(`overlapping holders seen (must be 0): ${names.map((n) => `${n} ${overlaps[n]}`).join('; ')}`);
console.log(
  'leasehold = sqliteBackend({ path }) defaults (WAL, synchronous=FULL), acquire waitMs Infinity; leasehold-sync-normal = the same on a Database ' +
    'of our own with synchronous=NORMAL (diagnostic, not durable); proper-lockfile-Nms = lock(file, { retries: { retries: 0, forever: true, ' +
    'factor: 1, minTimeout: N, maxTimeout: N } }), its defaults otherwise (with no retries it fails at once on a busy lock).',
);
cleanup();
process.exit(0);

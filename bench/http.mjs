#!/usr/bin/env node
// The lock service (`leasehold serve`) against the backends it serves, used directly, and against
// etcd's own lock service (its v3lock JSON gateway).
//
//   npm run bench -- http [--seconds 2] [--rounds 3] [--loops 16] [--workers 8] [--hold-ms 1]
//                         [--pg-url postgres://…] [--redis-url redis://…] [--etcd http://h:p]
//                         [--only sequential,loops,contended,commands] [--sides direct-postgres,http-1-postgres,…]
//                         [--server-cpu-prof DIR]
//
// Sides (each client opened the way its users would):
// - direct-postgres / direct-redis / etcd-direct: `Locks` over the backend in this process.
// - http-1-postgres / http-1-redis: `Locks` over `httpBackend({ url })`, to one lock server
//   (`startLockServer({ backend })`) in a process of its own (bench/lib/http-server.mjs) over the same
//   PostgreSQL or Redis; http-2-*: two such servers, each its own backend, the clients alternating
//   between them (pair i, loop i or worker i through server i mod 2). The servers run for the whole
//   bench, on loopback, with the rate limit at its maximum (the bench is one anonymous caller).
// - etcd-v3lock-gateway: raw fetch to etcd's JSON gateway: a lease granted per client
//   (`POST /v3/lease/grant`, TTL 60 s, never lease 0), then `POST /v3/lock/lock { name, lease }` (which
//   waits in etcd) and `POST /v3/lock/unlock { key }` per pair. etcd-v3lock-gateway-node-http: the same
//   requests through the node:http transport of leasehold's HTTP client (fetch costs the client more CPU).
// - empty-http: the same two requests per pair to a node:http server that answers at once (no lock, no
//   backend, no framework; sequential and loops only): the floor of any HTTP lock service on this machine.
//
// Scenarios, in interleaved rounds (each side once per scenario per round, the order reversed every
// other round; the table shows medians of the rounds), after a warm-up that is not recorded (each side's
// sequential pairs for 0.5 s):
// - sequential: one client (two for http-2-*, alternating), one key, acquire + release in sequence
//   (bench/lib/contention.mjs `pairs`); with the time of each part: the acquire and release calls at the
//   client, the client's backend call inside them (for HTTP: the request), the request inside the server
//   (arrival to the answer's last byte), and the server's backend call.
// - loops: --loops concurrent loops on distinct keys through one client (http-2-*: two, loop i through
//   client i mod 2).
// - contended: --workers clients (each its own backend or HTTP client) on one key holding ~--hold-ms
//   (bench/lib/contention.mjs `sections`): hand-off (release call → grant of another worker), waits,
//   overlaps (must be 0). Through the servers, the hand-off they see too: from a release request's
//   arrival to the next grant's answer leaving.
// - round trips: requests to the lock service per pair (counted by the servers; the gateway's by its
//   client), and backend round trips per pair: PostgreSQL statements (counted by the pool, the LISTEN
//   connection included), Redis client commands (MONITOR, in a separate run after the rounds: `commands`),
//   etcd gRPC messages received (etcd's /metrics; the gateway's own calls to etcd included).
//
// --server-cpu-prof DIR: the lock servers run under --cpu-prof; where their CPU went is printed at the end
// (bench/lib/http-profile.mjs).
//
// Starts its own redis-server and etcd (no persistence / a temporary directory) unless --redis-url /
// --etcd name one; uses PostgreSQL at --pg-url (else LEASEHOLD_TEST_PG_URL, .test-env.json,
// postgres://postgres@127.0.0.1:5432/test) in a database of its own, dropped at the end.
// Prints figures; never fails on them.
import { execFileSync, fork, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { Redis } from 'ioredis';
import pg from 'pg';
import { Locks } from '../dist/index.js';
import { etcdBackend } from '../dist/etcd/index.js';
import { httpBackend } from '../dist/http/index.js';
import { resolveHttpOptions } from '../dist/http/options.js';
import { Transport } from '../dist/http/transport.js';
import { postgresBackend } from '../dist/postgres/index.js';
import { redisBackend } from '../dist/redis/index.js';
import { freePort, startCluster } from '../test/fixtures/etcd-cluster.mjs';
import { fmt, machine, median, now, options, pairs, ratio, sections, summarize } from './lib/contention.mjs';
import { countingPool, timedBackend } from './lib/http-count.mjs';
import { summarizeProfiles } from './lib/http-profile.mjs';

const opt = options();
const envFile = new URL('../.test-env.json', import.meta.url);
const testEnv = existsSync(envFile) ? JSON.parse(readFileSync(envFile, 'utf8')) : {};
const ADMIN_URL = opt('pg-url', process.env.LEASEHOLD_TEST_PG_URL ?? testEnv.LEASEHOLD_TEST_PG_URL ?? 'postgres://postgres@127.0.0.1:5432/test');
const SECONDS = Number(opt('seconds', 2));
const ROUNDS = Number(opt('rounds', 3));
const LOOPS = Number(opt('loops', 16));
const WORKERS = Number(opt('workers', 8));
const HOLD_MS = Number(opt('hold-ms', 1));
/** A directory: each lock server runs with --cpu-prof there, and a summary of each profile is printed at the end. */
const SERVER_CPU_PROF = opt('server-cpu-prof', undefined);
const TTL_MS = 30_000;
const WAIT_MS = 60_000;
/** The gateway's leases: longer than any run a client lives for, so none needs a keep-alive. */
const GATEWAY_LEASE_TTL_S = 60;
const DATABASE = `lh_bench_http_${process.pid}`;
const PG_URL = (() => {
  const u = new URL(ADMIN_URL);
  u.pathname = `/${DATABASE}`;
  return u.toString();
})();

// ---------------------------------------------------------------------------------------------
// Sides: open(w) → { lock(key) → release(), close(), reset(), stats() }
// ---------------------------------------------------------------------------------------------
/** backend: what it runs over; servers: lock servers in front of it (0 = used directly). */
const SIDES = {
  'direct-postgres': { backend: 'postgres', servers: 0 },
  'http-1-postgres': { backend: 'postgres', servers: 1 },
  'http-2-postgres': { backend: 'postgres', servers: 2 },
  'direct-redis': { backend: 'redis', servers: 0 },
  'http-1-redis': { backend: 'redis', servers: 1 },
  'http-2-redis': { backend: 'redis', servers: 2 },
  'etcd-v3lock-gateway': { backend: 'etcd', servers: 0, gateway: 'fetch' },
  'etcd-v3lock-gateway-node-http': { backend: 'etcd', servers: 0, gateway: 'node-http' },
  'etcd-direct': { backend: 'etcd', servers: 0 },
  'empty-http': { backend: 'empty', servers: 1, scenarios: ['sequential', 'loops'] },
};
const names = opt('sides', Object.keys(SIDES).join(',')).split(',');
for (const n of names) if (!SIDES[n]) throw new Error(`--sides: no side named ${n} (${Object.keys(SIDES).join(', ')})`);
const only = new Set(opt('only', 'sequential,loops,contended,commands').split(','));
/** The HTTP sides and the direct side each is compared with. */
const PAIRS_COMPARED = [
  ['http-1-postgres', 'direct-postgres'],
  ['http-2-postgres', 'direct-postgres'],
  ['http-1-redis', 'direct-redis'],
  ['http-2-redis', 'direct-redis'],
].filter(([a, b]) => names.includes(a) && names.includes(b));

let redisUrl = opt('redis-url', undefined);
let etcdUrl = opt('etcd', undefined);
/** Lock servers by backend kind: [first, second]. */
const servers = { postgres: [], redis: [], empty: [] };

/** A lock server in a child process (bench/lib/http-server.mjs). */
async function startServer(kind, url) {
  const child = fork(fileURLToPath(new URL('./lib/http-server.mjs', import.meta.url)), [kind, url], {
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    execArgv: SERVER_CPU_PROF ? ['--cpu-prof', `--cpu-prof-dir=${SERVER_CPU_PROF}`, `--cpu-prof-name=${kind}-${servers[kind].length + 1}.cpuprofile`] : [],
  });
  const replies = [];
  const waiting = [];
  child.on('message', (m) => (waiting.length ? waiting.shift()(m) : replies.push(m)));
  const next = () => new Promise((resolve) => (replies.length ? resolve(replies.shift()) : waiting.push(resolve)));
  const exited = new Promise((resolve) => child.once('exit', resolve));
  const ready = await Promise.race([next(), exited.then((code) => Promise.reject(new Error(`lock server (${kind}) exited with ${code}`)))]);
  return {
    url: ready.url,
    /** Counts and times since the last call (the server resets them). */
    stats: () => (child.send({ type: 'stats' }), next()),
    close: async () => {
      if (child.exitCode !== null) return;
      child.send({ type: 'close' });
      await Promise.race([exited, sleep(5_000).then(() => child.kill('SIGKILL'))]);
    },
    kill: () => child.kill('SIGKILL'),
  };
}

/** A client of `Locks` over `backend`, timed at its backend calls. */
function locksClient(backend, extra = {}) {
  const timed = timedBackend(backend);
  const locks = new Locks({ backend: timed.backend });
  return {
    lock: async (key) => {
      const lease = await locks.acquire(key, { ttlMs: TTL_MS, waitMs: WAIT_MS });
      return () => lease.release();
    },
    reset: () => {
      timed.reset();
      extra.reset?.();
    },
    stats: () => ({ backendMs: timed.times, ...extra.stats?.() }),
    close: async () => {
      await locks.close();
      await extra.close?.();
    },
  };
}

const b64 = (s) => Buffer.from(s, 'utf8').toString('base64');

/**
 * etcd's v3lock JSON gateway: one lease per client, lock + unlock per pair; through fetch (undici), or
 * through the node:http transport leasehold's HTTP client uses (the same client wire code on both sides).
 */
async function gatewayClient(via) {
  let requests = 0;
  const transport = via === 'node-http' ? new Transport(resolveHttpOptions({ url: etcdUrl })) : undefined;
  const post = async (path, body) => {
    requests++;
    let status;
    let json;
    if (transport) ({ status, body: json } = await transport.send({ method: 'POST', path, body, what: path }));
    else {
      const res = await fetch(`${etcdUrl}${path}`, { method: 'POST', body: JSON.stringify(body) });
      status = res.status;
      json = await res.json();
    }
    if (status !== 200 || json?.error || json?.code) throw new Error(`etcd gateway ${path}: HTTP ${status} ${JSON.stringify(json)}`);
    return json;
  };
  const { ID } = await post('/v3/lease/grant', { TTL: GATEWAY_LEASE_TTL_S });
  return {
    lock: async (key) => {
      const { key: owned } = await post('/v3/lock/lock', { name: b64(key), lease: ID });
      return async () => {
        await post('/v3/lock/unlock', { key: owned });
      };
    },
    reset: () => {
      requests = 0;
    },
    stats: () => ({ requests }),
    close: async () => {
      await post('/v3/lease/revoke', { ID });
      transport?.close();
    },
  };
}

/**
 * Two requests per pair to a server that answers at once (bench/lib/http-server.mjs, `empty`), through
 * the HTTP client's own transport (node:http, one keep-alive agent): the floor of any lock service here.
 */
function emptyClient(url) {
  const transport = new Transport(resolveHttpOptions({ url }));
  const body = { ttlMs: TTL_MS, mode: 'exclusive', lockDelayMs: 0, label: 'bench' };
  return {
    lock: async (key) => {
      await transport.send({ method: 'POST', path: `/v1/locks/${encodeURIComponent(key)}/acquire`, body, what: 'acquire' });
      return async () => {
        await transport.send({ method: 'DELETE', path: '/v1/leases/x', what: 'release' });
      };
    },
    reset: () => {},
    stats: () => ({}),
    close: async () => transport.close(),
  };
}

async function open(name, w) {
  const side = SIDES[name];
  if (side.gateway) return gatewayClient(side.gateway);
  if (side.backend === 'empty') return emptyClient(servers.empty[0].url);
  if (side.servers > 0) return locksClient(httpBackend({ url: servers[side.backend][w % side.servers].url }));
  if (side.backend === 'postgres') {
    const { pool, counter, end } = countingPool(PG_URL, 10);
    return locksClient(postgresBackend({ pool }), {
      reset: () => {
        counter.statements = counter.listen = 0;
      },
      stats: () => ({ statements: counter.statements, listen: counter.listen }),
      close: end,
    });
  }
  if (side.backend === 'redis') return locksClient(redisBackend({ url: redisUrl }));
  return locksClient(etcdBackend({ hosts: [etcdUrl] }));
}

// ---------------------------------------------------------------------------------------------
// Counting at the backends: etcd's gRPC messages, Redis's client commands (MONITOR)
// ---------------------------------------------------------------------------------------------
/** gRPC messages etcd received so far (requests of unary calls and stream messages). */
async function etcdMessages() {
  const text = await (await fetch(`${etcdUrl}/metrics`)).text();
  let n = 0;
  for (const m of text.matchAll(/^grpc_server_msg_received_total\{[^}]*\} ([0-9.e+]+)$/gm)) n += Number(m[1]);
  return n;
}

/** Client commands Redis sees (not those run inside functions), while `counting`. */
async function redisMonitor() {
  const base = new Redis(redisUrl);
  const monitor = await base.monitor();
  const m = { counting: false, commands: 0, byName: {} };
  monitor.on('monitor', (_time, args, source) => {
    if (!m.counting || source === 'lua') return;
    const command = String(args[0]).toLowerCase();
    if (command === 'monitor' || command === 'info') return;
    m.commands++;
    // FCALL by function: which of the backend's calls a count is made of
    const name = command === 'fcall' ? `fcall ${String(args[1]).replace(/^.*_/, '')}` : command;
    m.byName[name] = (m.byName[name] ?? 0) + 1;
  });
  return {
    m,
    stop: () => {
      monitor.disconnect();
      base.disconnect();
    },
  };
}

// ---------------------------------------------------------------------------------------------
// Runs
// ---------------------------------------------------------------------------------------------
/** Uncontended loops on distinct keys, loop i through client i mod clients; warm-up first (each key once), then `mark()`. */
async function loops(clients, key, n, seconds, mark) {
  for (let i = 0; i < n; i++) await (await clients[i % clients.length].lock(`${key}:${i}`))();
  await mark();
  let count = 0;
  const start = now();
  const end = start + seconds * 1000;
  await Promise.all(
    Array.from({ length: n }, async (_, i) => {
      const c = clients[i % clients.length];
      while (now() < end) {
        await (await c.lock(`${key}:${i}`))();
        count++;
      }
    }),
  );
  return { pairs: count, perSecond: (count * 1000) / (now() - start) };
}

/** The hand-off as the servers see it: each grant leaving after a release arrived (and no grant between), from the release's arrival. */
function serverHandoffs(events) {
  const s = [...events].sort((a, b) => a.t - b.t);
  const out = [];
  let released;
  for (const e of s) {
    if (e.kind === 'release-in') released = e.t;
    else {
      if (released !== undefined) out.push(e.t - released);
      released = undefined;
    }
  }
  return out.sort((a, b) => a - b);
}

let runSeq = 0;
/**
 * One run of a side in a scenario: clients opened, warmed up, counters reset (mark), timed, counted,
 * closed. `monitor` (Redis's MONITOR) counts while the timed part runs.
 */
async function run(name, scenario, seconds, monitor) {
  const side = SIDES[name];
  const fanout = Math.max(1, side.servers);
  const n = scenario === 'contended' ? WORKERS : fanout;
  const clients = await Promise.all(Array.from({ length: n }, (_, w) => open(name, w)));
  const sideServers = side.servers > 0 ? servers[side.backend].slice(0, side.servers) : [];
  const etcdCounted = side.backend === 'etcd';
  let etcdBefore = 0;
  let cpuBefore;
  const mark = async () => {
    if (monitor) {
      await sleep(100); // the warm-up's commands reach the monitor first
      monitor.commands = 0;
      monitor.byName = {};
      monitor.counting = true;
    }
    for (const c of clients) c.reset();
    await Promise.all(sideServers.map((s) => s.stats()));
    if (etcdCounted) etcdBefore = await etcdMessages();
    cpuBefore = process.cpuUsage();
  };
  const key = `bench:${scenario}:${name}:${++runSeq}`;
  let result;
  let units;
  if (scenario === 'sequential') {
    let i = 0;
    const alternating = { lock: (k) => clients[i++ % clients.length].lock(k) };
    result = await pairs(alternating, key, seconds, mark);
    units = result.pairs;
  } else if (scenario === 'loops') {
    result = await loops(clients, key, LOOPS, seconds, mark);
    units = result.pairs;
  } else {
    result = summarize(await sections(clients, key, seconds, HOLD_MS, mark), n, seconds);
    units = result.sections;
  }
  const cpu = process.cpuUsage(cpuBefore);
  const etcd = etcdCounted ? (await etcdMessages()) - etcdBefore : undefined;
  if (monitor) {
    await sleep(100);
    monitor.counting = false;
  }
  const fromServers = await Promise.all(sideServers.map((s) => s.stats()));
  const fromClients = clients.map((c) => c.stats());
  await Promise.all(clients.map((c) => c.close()));
  const sum = (list, f) => list.reduce((a, x) => a + (f(x) ?? 0), 0);
  const requests = side.gateway
    ? sum(fromClients, (c) => c.requests)
    : side.servers > 0
      ? sum(fromServers, (s) => sum(Object.values(s.requests), (v) => v))
      : undefined;
  const statements = side.backend !== 'postgres' ? undefined : side.servers > 0 ? sum(fromServers, (s) => s.statements) : sum(fromClients, (c) => c.statements);
  const listen = side.backend !== 'postgres' ? undefined : side.servers > 0 ? sum(fromServers, (s) => s.listen) : sum(fromClients, (c) => c.listen);
  const p50 = (xs) => (xs.length ? median(xs) : undefined);
  return {
    result,
    units,
    requests: requests === undefined ? undefined : requests / units,
    backendTrips: statements !== undefined ? statements / units : etcd !== undefined ? etcd / units : undefined,
    listen: listen === undefined ? undefined : listen / units,
    clientCpuMs: (cpu.user + cpu.system) / 1000 / units,
    serverCpuMs: sideServers.length ? sum(fromServers, (s) => s.cpuMs) / units : undefined,
    redisCommands: monitor ? monitor.commands / units : undefined,
    redisByName: monitor
      ? Object.entries(monitor.byName)
          .map(([k, v]) => `${k} ${fmt(v / units)}`)
          .join(', ')
      : undefined,
    clientBackendMs: {
      acquire: p50(fromClients.flatMap((c) => c.backendMs?.acquire ?? [])),
      release: p50(fromClients.flatMap((c) => c.backendMs?.release ?? [])),
    },
    serverMs: {
      acquire: p50(fromServers.flatMap((s) => s.serverMs.acquire)),
      release: p50(fromServers.flatMap((s) => s.serverMs.release)),
    },
    serverBackendMs: {
      acquire: p50(fromServers.flatMap((s) => s.backendMs.acquire)),
      release: p50(fromServers.flatMap((s) => s.backendMs.release)),
    },
    serverHandoffP50: sideServers.length ? p50(serverHandoffs(fromServers.flatMap((s) => s.events))) : undefined,
  };
}

// ---------------------------------------------------------------------------------------------
// Figures
// ---------------------------------------------------------------------------------------------
const figures = new Map();
const add = (figure, side, value) => {
  if (value === undefined || Number.isNaN(value)) return;
  let bySide = figures.get(figure);
  if (!bySide) figures.set(figure, (bySide = new Map()));
  let values = bySide.get(side);
  if (!values) bySide.set(side, (values = []));
  values.push(value);
};
const med = (figure, side) => {
  const v = figures.get(figure)?.get(side);
  return v?.length ? median(v) : undefined;
};
const SEQ = 'sequential, 1 client';
const LOOPS_FIG = `${LOOPS} concurrent loops on distinct keys`;
const CON = `contended, ${WORKERS} workers`;

function record(name, scenario, x) {
  const f = (figure, v) => add(figure, name, v);
  if (scenario === 'sequential') {
    f(`${SEQ}: pairs/s`, x.result.perSecond);
    f(`${SEQ}: acquire p50 at the client (ms)`, x.result.acquireP50);
    f(`${SEQ}: … acquire: its backend call in the client (HTTP: the request) (ms)`, x.clientBackendMs.acquire);
    f(`${SEQ}: … acquire: the request in the server (ms)`, x.serverMs.acquire);
    f(`${SEQ}: … acquire: the server's backend call (ms)`, x.serverBackendMs.acquire);
    f(`${SEQ}: release p50 at the client (ms)`, x.result.releaseP50);
    f(`${SEQ}: … release: its backend call in the client (HTTP: the request) (ms)`, x.clientBackendMs.release);
    f(`${SEQ}: … release: the request in the server (ms)`, x.serverMs.release);
    f(`${SEQ}: … release: the server's backend call (ms)`, x.serverBackendMs.release);
    f(`${SEQ}: CPU of the bench's process per pair (clients) (ms)`, x.clientCpuMs);
    f(`${SEQ}: CPU of the lock servers per pair (ms)`, x.serverCpuMs);
    f(`${SEQ}: requests to the lock service per pair`, x.requests);
    f(`${SEQ}: backend round trips per pair (PostgreSQL statements, etcd gRPC messages)`, x.backendTrips);
    f(`${SEQ}: … of which on the LISTEN connection`, x.listen);
  } else if (scenario === 'loops') {
    f(`${LOOPS_FIG}: pairs/s`, x.result.perSecond);
    f(`${LOOPS_FIG}: CPU of the bench's process per pair (ms)`, x.clientCpuMs);
    f(`${LOOPS_FIG}: CPU of the lock servers per pair (ms)`, x.serverCpuMs);
  } else {
    const c = x.result;
    f(`${CON}: sections/s`, c.perSecond);
    f(`${CON}: hand-off p50 (ms)`, c.handoffP50);
    f(`${CON}: hand-off p99 (ms)`, c.handoffP99);
    f(`${CON}: … hand-off p50 as the servers see it (ms)`, x.serverHandoffP50);
    f(`${CON}: wait p50 (ms)`, c.waitP50);
    f(`${CON}: longest wait (ms)`, c.longestWait);
    f(`${CON}: Jain's index`, c.jain);
    f(`${CON}: requests to the lock service per section`, x.requests);
    f(`${CON}: backend round trips per section (PostgreSQL statements, etcd gRPC messages)`, x.backendTrips);
    f(`${CON}: … of which on the LISTEN connection`, x.listen);
  }
}

function table() {
  const header = ['figure', ...names, ...PAIRS_COMPARED.map(([a, b]) => `${a} / ${b}`)];
  const lines = [header, header.map(() => '---')];
  for (const figure of figures.keys()) {
    const m = (side) => med(figure, side);
    lines.push([figure, ...names.map((s) => fmt(m(s))), ...PAIRS_COMPARED.map(([a, b]) => ratio(m(a), m(b)))]);
  }
  return lines.map((l) => `| ${l.join(' | ')} |`).join('\n');
}

// ---------------------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------------------
const cleanups = [];
process.on('exit', () => {
  for (const c of cleanups) c.onExit?.();
});
const admin = new pg.Client({ connectionString: ADMIN_URL });
let etcdCluster;
let dbCreated = false;
try {
  const needs = (kind) => names.some((n) => SIDES[n].backend === kind);
  // PostgreSQL: a database of the bench's own
  await admin.connect();
  const { rows: pgVersion } = await admin.query('SHOW server_version');
  if (needs('postgres')) {
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
    dbCreated = true;
  }
  // Redis: a server of the bench's own (MONITOR must see this bench's commands only)
  let redisVersion = '—';
  if (needs('redis')) {
    if (!redisUrl) {
      const port = await freePort();
      const dir = mkdtempSync(join(tmpdir(), 'leasehold-bench-http-'));
      const proc = spawn(
        process.env.LEASEHOLD_TEST_REDIS_SERVER ?? testEnv.LEASEHOLD_TEST_REDIS_SERVER ?? 'redis-server',
        ['--port', String(port), '--bind', '127.0.0.1', '--dir', dir, '--save', '', '--appendonly', 'no', '--loglevel', 'warning'],
        { stdio: 'ignore' },
      );
      cleanups.push({
        onExit: () => {
          proc.kill('SIGKILL');
          rmSync(dir, { recursive: true, force: true });
        },
      });
      redisUrl = `redis://127.0.0.1:${port}`;
    }
    const probe = new Redis(redisUrl, { retryStrategy: (n) => (n > 50 ? null : 100) });
    probe.on('error', () => {}); // refused until the server just started listens; ioredis retries
    await probe.ping();
    redisVersion = /redis_version:(\S+)/.exec(await probe.info('server'))?.[1] ?? '?';
    probe.disconnect();
  }
  // etcd: one member of the bench's own
  let etcdVersion = '—';
  if (needs('etcd')) {
    if (!etcdUrl) {
      etcdCluster = await startCluster({ members: 1 });
      etcdUrl = etcdCluster.endpoints[0];
    }
    etcdVersion = (await (await fetch(`${etcdUrl}/version`)).json()).etcdserver ?? '?';
  }
  // the lock servers, for the whole bench
  for (const kind of ['postgres', 'redis', 'empty']) {
    const most = Math.max(0, ...names.filter((n) => SIDES[n].backend === kind).map((n) => SIDES[n].servers));
    for (let i = 0; i < most; i++) {
      const s = await startServer(kind, kind === 'postgres' ? PG_URL : kind === 'redis' ? redisUrl : '');
      servers[kind].push(s);
      cleanups.push({ onExit: s.kill });
    }
  }

  let commit = '?';
  try {
    commit = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { encoding: 'utf8' }).trim();
    if (execFileSync('git', ['status', '--porcelain', '--', 'src'], { encoding: 'utf8' }).trim()) commit += ' (src/ has uncommitted changes)';
  } catch {
    // not a checkout
  }
  console.log(`leasehold HTTP lock service benchmark — ${new Date().toISOString()}; code as of ${commit}`);
  console.log(`machine: ${machine()}`);
  console.log(
    `PostgreSQL ${pgVersion[0].server_version} at ${new URL(ADMIN_URL).host}; Redis ${redisVersion} at ${redisUrl ?? '—'}; etcd ${etcdVersion} at ${etcdUrl ?? '—'}`,
  );
  console.log(
    `${ROUNDS} rounds; ${SECONDS} s per side per scenario; ${LOOPS} loops; ${WORKERS} workers holding ~${HOLD_MS} ms; ` +
      `lock servers: ${servers.postgres.length} over PostgreSQL, ${servers.redis.length} over Redis, each in a process of its own; ` +
      `empty-http: ${servers.empty.length ? 'a node:http server answering at once, no lock (sequential and loops only)' : 'not run'}\n`,
  );

  // set-up: the PostgreSQL schema, made once before any server or client races for it
  if (needs('postgres')) {
    const c = await open('direct-postgres', 0);
    await (await c.lock('bench:setup'))();
    await c.close();
  }

  // warm-up, not recorded: every side's code paths run once (the lock servers live for the whole bench, so round 1 would pay their JIT)
  process.stderr.write('warm-up:');
  for (const name of names) {
    process.stderr.write(` ${name}`);
    await run(name, 'sequential', 0.5);
  }
  process.stderr.write('\n');

  const scenarios = ['sequential', 'loops', 'contended'].filter((s) => only.has(s));
  const commandNames = [];
  const overlaps = Object.fromEntries(names.map((n) => [n, 0]));
  for (let r = 0; r < ROUNDS; r++) {
    const order = r % 2 === 0 ? names : [...names].reverse();
    process.stderr.write(`round ${r + 1}/${ROUNDS}:`);
    for (const scenario of scenarios) {
      for (const name of order.filter((n) => (SIDES[n].scenarios ?? [scenario]).includes(scenario))) {
        process.stderr.write(` ${scenario[0]}:${name}`);
        const x = await run(name, scenario, SECONDS);
        record(name, scenario, x);
        if (scenario === 'contended') overlaps[name] += x.result.overlaps;
      }
    }
    process.stderr.write('\n');
  }
  // Redis client commands, under MONITOR (it slows Redis: not during the timed runs)
  if (only.has('commands')) {
    const mon = await redisMonitor();
    for (const name of names.filter((n) => SIDES[n].backend === 'redis')) {
      process.stderr.write(`commands: ${name}\n`);
      const s = await run(name, 'sequential', 1, mon.m);
      add(`${SEQ}: Redis client commands per pair (MONITOR, separate run)`, name, s.redisCommands);
      const c = await run(name, 'contended', 1, mon.m);
      add(`${CON}: Redis client commands per section (MONITOR, separate run)`, name, c.redisCommands);
      commandNames.push(`${name}: per pair ${s.redisByName}; per contended section ${c.redisByName}`);
    }
    mon.stop();
  }

  console.log(table());
  const rounds = (figure) =>
    names
      .filter((n) => figures.get(figure)?.get(n)?.length)
      .map((n) => `${n} ${figures.get(figure).get(n).map(fmt).join(', ')}`)
      .join('; ');
  console.log('');
  if (only.has('sequential')) console.log(`sequential rounds (pairs/s): ${rounds(`${SEQ}: pairs/s`)}`);
  if (only.has('loops')) console.log(`${LOOPS} loops rounds (pairs/s): ${rounds(`${LOOPS_FIG}: pairs/s`)}`);
  if (only.has('contended')) {
    console.log(`contended rounds (hand-off p50 ms): ${rounds(`${CON}: hand-off p50 (ms)`)}`);
    console.log(`overlapping holders seen, all rounds (must be 0): ${names.map((n) => `${n} ${overlaps[n]}`).join('; ')}`);
  }

  if (commandNames.length) console.log(`Redis client commands by name (MONITOR): ${commandNames.join(' | ')}`);

  // the issue's targets
  console.log('\ntargets (extra round trips per operation = (requests + backend round trips through the server − backend round trips direct) / 2):');
  const extraTrips = (http, direct, scenario, unit) => {
    const redisFig = `${scenario}: Redis client commands per ${unit} (MONITOR, separate run)`;
    const backendFig = SIDES[http].backend === 'redis' ? redisFig : `${scenario}: backend round trips per ${unit} (PostgreSQL statements, etcd gRPC messages)`;
    const reqs = med(`${scenario}: requests to the lock service per ${unit}`, http);
    const viaServer = med(backendFig, http);
    const alone = med(backendFig, direct);
    if (reqs === undefined || viaServer === undefined || alone === undefined) return '—';
    const extra = (reqs + viaServer - alone) / 2;
    return `${fmt(extra)} (${fmt(reqs)} + ${fmt(viaServer)} − ${fmt(alone)}; ≤ 1: ${extra <= 1.0001 ? 'met' : 'missed'})`;
  };
  for (const [http, direct] of PAIRS_COMPARED) {
    const hHttp = med(`${CON}: hand-off p50 (ms)`, http);
    const hDirect = med(`${CON}: hand-off p50 (ms)`, direct);
    const h = ratio(hHttp, hDirect);
    console.log(
      `- ${http} against ${direct}: extra round trips per operation, sequential ${extraTrips(http, direct, SEQ, 'pair')}, ` +
        `contended ${extraTrips(http, direct, CON, 'section')}; contended hand-off p50 ${h} (≤ 2×: ${h === '—' ? '—' : hHttp <= 2 * hDirect ? 'met' : 'missed'})`,
    );
  }
} finally {
  await Promise.all([...servers.postgres, ...servers.redis, ...servers.empty].map((s) => s.close().catch(() => {})));
  if (SERVER_CPU_PROF) for (const line of summarizeProfiles(SERVER_CPU_PROF)) console.log(line);
  await etcdCluster?.stop();
  if (dbCreated)
    await admin.query(`DROP DATABASE IF EXISTS ${DATABASE} WITH (FORCE)`).catch((error) => console.error(`could not drop ${DATABASE}: ${error.message}`));
  await admin.end().catch(() => {});
  for (const c of cleanups) c.onExit?.();
  cleanups.length = 0;
}

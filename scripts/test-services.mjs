#!/usr/bin/env node
// Pre-test step (`npm test` runs it): finds the servers the integration tests need, starts them
// when they are installed but stopped, installs the Debian packages when they are missing and apt
// is usable (as root), and otherwise stops with one line naming what to install. What it found is
// written to .test-env.json, which test/setup.ts reads.
//
//   PostgreSQL  LEASEHOLD_TEST_PG_URL     default postgres://postgres@127.0.0.1:5432/test
//   MariaDB     LEASEHOLD_TEST_MYSQL_URL  default mysql://root@127.0.0.1:3306/test (or MySQL 8 there)
//   Redis       LEASEHOLD_TEST_REDIS_URL  default redis://127.0.0.1:6379
//   redis-server binary (tests start their own instances on other ports to kill and restart them)
//   etcd binary (tests start their own members on their own ports)
//   pgbouncer binary (tests start their own, in transaction mode, in front of PostgreSQL)
//   prometheus and promtool (Debian's prometheus: a test scrapes with a real server; the alert rules' unit tests)
//   chromium (Debian's: the dashboard's browser tests, through playwright-core)
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import mysql from 'mysql2/promise';
import pg from 'pg';

const quiet = process.env.LEASEHOLD_TEST_SERVICES_QUIET === '1';
const log = (msg) => quiet || console.error(`test-services: ${msg}`);
const found = {};

function which(cmd) {
  const r = spawnSync('sh', ['-c', `command -v ${cmd}`], { encoding: 'utf8' });
  return r.status === 0 ? r.stdout.trim() : undefined;
}

function sh(cmd, args, opts = {}) {
  log(`$ ${cmd} ${args.join(' ')}`);
  return spawnSync(cmd, args, { stdio: quiet ? 'ignore' : ['ignore', 'inherit', 'inherit'], ...opts }).status === 0;
}

const canApt = process.getuid?.() === 0 && !!which('apt-get');
let aptUpdated = false;
/**
 * How long apt-get waits for a lock held by another apt or dpkg process (unattended-upgrades, a
 * second test run installing at the same time) instead of failing at once. apt-get install waits
 * for the dpkg lock itself with `DPkg::Lock::Timeout`; apt-get update (apt 2.6) does not apply it to
 * the package lists' lock, so that one is waited for here.
 */
const APT_LOCK_TIMEOUT_S = 120;
const APT_LOCK_OPTION = ['-o', `DPkg::Lock::Timeout=${APT_LOCK_TIMEOUT_S}`];
const APT_LISTS_LOCK = '/var/lib/apt/lists/lock';

/**
 * The pid holding a lock on `path` (apt and dpkg take POSIX locks), read from /proc/locks;
 * undefined when none is held or this cannot be told (no such file, no /proc).
 */
function lockHolder(path) {
  let st;
  let locks;
  try {
    st = statSync(path, { bigint: true });
    locks = readFileSync('/proc/locks', 'utf8');
  } catch {
    return undefined;
  }
  // /proc/locks names a file as MAJOR:MINOR:INODE, the device numbers in hex; a line with `->` is a waiter, not a holder.
  const major = ((st.dev >> 8n) & 0xfffn) | ((st.dev >> 32n) & ~0xfffn);
  const minor = (st.dev & 0xffn) | ((st.dev >> 12n) & ~0xffn);
  for (const line of locks.split('\n')) {
    const f = line.trim().split(/\s+/);
    if (f[1] === '->') continue;
    const [maj, min, ino] = (f[5] ?? '').split(':');
    if (ino !== undefined && BigInt(ino) === st.ino && BigInt(`0x${maj}`) === major && BigInt(`0x${min}`) === minor) return f[4];
  }
  return undefined;
}

/** apt-get update, waiting up to APT_LOCK_TIMEOUT_S for another process's hold on the lists' lock (before, and if it was taken in between). */
async function aptUpdate(env) {
  const deadline = performance.now() + APT_LOCK_TIMEOUT_S * 1000;
  for (;;) {
    let holder = lockHolder(APT_LISTS_LOCK);
    if (holder !== undefined) log(`waiting up to ${APT_LOCK_TIMEOUT_S} s for ${APT_LISTS_LOCK}, held by process ${holder}`);
    while (holder !== undefined && performance.now() < deadline) {
      await sleep(1000);
      holder = lockHolder(APT_LISTS_LOCK);
    }
    if (sh('apt-get', [...APT_LOCK_OPTION, 'update', '-q'], { env })) return true;
    if (lockHolder(APT_LISTS_LOCK) === undefined || performance.now() >= deadline) return false;
  }
}
/** policy-rc.d answering 101 ("not allowed"): invoke-rc.d and deb-systemd-invoke then start no service. */
const POLICY_RC_D = '/usr/sbin/policy-rc.d';
/**
 * apt-get install. `noServices`: for packages whose binary the tests run themselves (etcd,
 * pgbouncer), the system service their postinst would start (etcd on 2379, pgbouncer on 6432) is
 * kept from starting by a policy-rc.d that exists only for the install (one already there is left
 * alone), and under systemd also disabled, so nothing of theirs runs.
 */
async function aptInstall(packages, { noServices = false, units = [] } = {}) {
  if (!canApt) return false;
  const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
  if (!aptUpdated) {
    await aptUpdate(env);
    aptUpdated = true;
  }
  const ownPolicy = noServices && !existsSync(POLICY_RC_D);
  if (ownPolicy) writeFileSync(POLICY_RC_D, '#!/bin/sh\nexit 101\n', { mode: 0o755 });
  try {
    return sh('apt-get', [...APT_LOCK_OPTION, 'install', '-y', '-q', '--no-install-recommends', ...packages], { env });
  } finally {
    if (ownPolicy) rmSync(POLICY_RC_D, { force: true });
    if (noServices && existsSync('/run/systemd/system') && which('systemctl')) {
      for (const unit of units) spawnSync('systemctl', ['disable', '--now', unit], { stdio: 'ignore' });
    }
  }
}

function fail(line) {
  console.error(`leasehold tests: ${line}`);
  process.exit(1);
}

async function pgWorks(url) {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 3000 });
  try {
    await client.connect();
    await client.query('SELECT 1');
    return true;
  } catch {
    return false;
  } finally {
    await client.end().catch(() => {});
  }
}

async function findPostgres() {
  const explicit = process.env.LEASEHOLD_TEST_PG_URL;
  const candidates = explicit ? [explicit] : ['postgres://postgres@127.0.0.1:5432/test', 'postgresql://root@/test?host=/var/run/postgresql'];
  const probe = async () => {
    for (const url of candidates) if (await pgWorks(url)) return url;
    return undefined;
  };
  let url = await probe();
  if (url) return url;
  if (explicit) fail(`PostgreSQL at LEASEHOLD_TEST_PG_URL (${explicit}) is not reachable`);
  if (!which('pg_ctlcluster') && !(await aptInstall(['postgresql']))) {
    fail('PostgreSQL is needed: install it (apt-get install postgresql) or set LEASEHOLD_TEST_PG_URL');
  }
  // Start every installed cluster that is down.
  for (const version of existsSync('/etc/postgresql') ? readdirSync('/etc/postgresql') : []) {
    sh('pg_ctlcluster', ['--skip-systemctl-redirect', version, 'main', 'start']);
  }
  for (let i = 0; i < 20 && !(url = await probe()); i++) {
    if (i === 2 && which('runuser')) {
      // A fresh Debian install: no role for root and no database `test`; make them (peer auth over the socket).
      spawnSync('runuser', ['-u', 'postgres', '--', 'psql', '-qc', 'CREATE ROLE root SUPERUSER LOGIN'], { stdio: 'ignore' });
      spawnSync('runuser', ['-u', 'postgres', '--', 'createdb', '-O', 'root', 'test'], { stdio: 'ignore' });
    }
    await sleep(500);
  }
  if (!url) fail('PostgreSQL is installed but could not be started or reached; set LEASEHOLD_TEST_PG_URL');
  return url;
}

function redisPing(port, host = '127.0.0.1') {
  return new Promise((resolve) => {
    const socket = net.connect({ port, host });
    let data = '';
    const done = (ok) => {
      socket.destroy();
      resolve(ok);
    };
    socket.setTimeout(2000, () => done(false));
    socket.on('error', () => done(false));
    socket.on('connect', () => socket.write('PING\r\n'));
    socket.on('data', (chunk) => {
      data += chunk;
      if (data.includes('\r\n')) done(data.startsWith('+PONG'));
    });
  });
}

async function findRedis() {
  const explicit = process.env.LEASEHOLD_TEST_REDIS_URL;
  let bin = which('redis-server');
  if (!bin) {
    if (!(await aptInstall(['redis-server']))) fail('Redis is needed: install it (apt-get install redis-server)');
    bin = which('redis-server');
    if (!bin) fail('redis-server is still missing after apt-get install redis-server');
  }
  found.LEASEHOLD_TEST_REDIS_SERVER = bin;
  if (explicit) {
    const u = new URL(explicit);
    if (!(await redisPing(Number(u.port || 6379), u.hostname))) fail(`Redis at LEASEHOLD_TEST_REDIS_URL (${explicit}) is not reachable`);
    return explicit;
  }
  if (!(await redisPing(6379))) {
    sh(bin, ['--daemonize', 'yes', '--bind', '127.0.0.1', '--port', '6379', '--save', '', '--appendonly', 'no', '--logfile', '']);
    for (let i = 0; i < 20 && !(await redisPing(6379)); i++) await sleep(250);
    if (!(await redisPing(6379))) fail('redis-server is installed but did not start on 127.0.0.1:6379; set LEASEHOLD_TEST_REDIS_URL');
  }
  return 'redis://127.0.0.1:6379';
}

async function findEtcd() {
  let bin = process.env.LEASEHOLD_TEST_ETCD ?? which('etcd');
  if (!bin) {
    if (!(await aptInstall(['etcd-server'], { noServices: true, units: ['etcd.service'] }))) fail('etcd is needed: install it (apt-get install etcd-server)');
    bin = which('etcd');
    if (!bin) fail('etcd is still missing after apt-get install etcd-server');
  }
  try {
    execFileSync(bin, ['--version'], { stdio: 'ignore' });
  } catch {
    fail(`${bin} --version failed; reinstall etcd-server or set LEASEHOLD_TEST_ETCD`);
  }
  return bin;
}

async function findPgbouncer() {
  let bin = process.env.LEASEHOLD_TEST_PGBOUNCER ?? which('pgbouncer') ?? (existsSync('/usr/sbin/pgbouncer') ? '/usr/sbin/pgbouncer' : undefined);
  if (!bin) {
    const units = ['pgbouncer.service', 'pgbouncer.socket'];
    if (!(await aptInstall(['pgbouncer'], { noServices: true, units }))) fail('PgBouncer is needed: install it (apt-get install pgbouncer)');
    bin = which('pgbouncer') ?? '/usr/sbin/pgbouncer';
  }
  if (!existsSync(bin)) fail(`pgbouncer not found at ${bin}; install it (apt-get install pgbouncer) or set LEASEHOLD_TEST_PGBOUNCER`);
  return bin;
}

/** A binary from a Debian package the tests run themselves (its system service, if any, kept from starting). */
async function findBinary({ env, command, path, pkg, units = [] }) {
  let bin = process.env[env] ?? which(command) ?? (path && existsSync(path) ? path : undefined);
  if (!bin) {
    if (!(await aptInstall([pkg], { noServices: true, units }))) fail(`${command} is needed: install it (apt-get install ${pkg})`);
    bin = which(command) ?? path;
    if (!bin || !existsSync(bin)) fail(`${command} is still missing after apt-get install ${pkg}`);
  }
  return bin;
}

/** Answers a query at `url` (mysql2 speaks to MariaDB and MySQL alike); resolves to the error's code otherwise. */
async function mysqlProbe(url) {
  let conn;
  try {
    conn = await mysql.createConnection({ uri: url, connectTimeout: 3000 });
    await conn.query('SELECT 1');
    return 'ok';
  } catch (error) {
    return error?.code ?? String(error);
  } finally {
    await conn?.end().catch(() => {});
  }
}

/** The server's own binary: MariaDB's mariadbd (Debian's mariadb-server), or mysqld where MySQL is installed. */
const mysqlServerBinary = () => ['/usr/sbin/mariadbd', '/usr/sbin/mysqld'].find((p) => existsSync(p)) ?? which('mariadbd') ?? which('mysqld');

/**
 * Starts the installed server as a daemon, the way its init script would but without systemd (a
 * container has none, and the package's own service is kept from starting when this script installs
 * it): the runtime directory for its socket and pid file, then start-stop-daemon, which does
 * nothing when the binary already runs (--oknodo). mariadbd refuses to run as root: --user=mysql.
 */
function startMysqlServer(bin) {
  if (which('start-stop-daemon') && existsSync('/run') && process.getuid?.() === 0) {
    spawnSync('install', ['-d', '-o', 'mysql', '-g', 'mysql', '-m', '755', '/run/mysqld'], { stdio: 'ignore' });
    return sh('start-stop-daemon', ['--start', '--oknodo', '--background', '--exec', bin, '--', '--user=mysql']);
  }
  // Not root, or no start-stop-daemon: mysqld_safe forks the server itself and restarts it if it dies.
  return which('mysqld_safe') ? sh('sh', ['-c', 'mysqld_safe >/dev/null 2>&1 &']) : false;
}

/**
 * As root over the server's Unix socket (Debian's root@localhost authenticates the OS user root
 * there), makes what the default test URL needs: the database `test`, and root@127.0.0.1 without
 * a password (a fresh install allows root only over the socket). Runs only on a server this
 * script found refusing the default URL.
 */
function prepareMysqlServer(what) {
  const client = which('mariadb') ?? which('mysql');
  if (!client || process.getuid?.() !== 0) return false;
  const sql = [
    'CREATE DATABASE IF NOT EXISTS test',
    ...(what === 'user' ? ["CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'", "GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION"] : []),
  ].join('; ');
  return sh(client, ['-uroot', '-e', sql]);
}

async function findMysql() {
  const explicit = process.env.LEASEHOLD_TEST_MYSQL_URL;
  const url = explicit ?? 'mysql://root@127.0.0.1:3306/test';
  let answer = await mysqlProbe(url);
  if (answer === 'ok') return url;
  if (explicit) fail(`MySQL / MariaDB at LEASEHOLD_TEST_MYSQL_URL (${explicit}) is not reachable (${answer})`);
  let bin = mysqlServerBinary();
  if (!bin) {
    // The package's postinst makes the data directory; its service is kept from starting (this script starts the server below).
    if (!(await aptInstall(['mariadb-server'], { noServices: true, units: ['mariadb.service'] }))) {
      fail('MariaDB (or MySQL) is needed: install it (apt-get install mariadb-server) or set LEASEHOLD_TEST_MYSQL_URL');
    }
    bin = mysqlServerBinary();
    if (!bin) fail('mariadbd is still missing after apt-get install mariadb-server');
  }
  if (answer === 'ECONNREFUSED' || answer === 'ETIMEDOUT') startMysqlServer(bin);
  for (let i = 0; i < 60; i++) {
    answer = await mysqlProbe(url);
    if (answer === 'ok') return url;
    // Up, but without the database `test` (ER_BAD_DB_ERROR) or refusing root over TCP (ER_ACCESS_DENIED_ERROR,
    // ER_ACCESS_DENIED_NO_PASSWORD_ERROR): make what is missing once, then ask again.
    const missing = answer === 'ER_BAD_DB_ERROR' ? 'database' : answer.startsWith('ER_ACCESS_DENIED') ? 'user' : undefined;
    if (missing !== undefined) {
      if (prepareMysqlServer(missing)) answer = await mysqlProbe(url);
      if (answer === 'ok') return url;
      break;
    }
    await sleep(500);
  }
  fail(`MariaDB is installed but ${url} does not answer (${answer}); start it, or set LEASEHOLD_TEST_MYSQL_URL`);
}

const needs = new Set(
  (process.env.LEASEHOLD_TEST_SERVICES ?? 'postgres,mysql,redis,etcd,pgbouncer,prometheus,chromium')
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean),
);
if (needs.has('postgres')) found.LEASEHOLD_TEST_PG_URL = await findPostgres();
if (needs.has('mysql')) found.LEASEHOLD_TEST_MYSQL_URL = await findMysql();
if (needs.has('redis')) found.LEASEHOLD_TEST_REDIS_URL = await findRedis();
if (needs.has('etcd')) found.LEASEHOLD_TEST_ETCD = await findEtcd();
if (needs.has('pgbouncer')) found.LEASEHOLD_TEST_PGBOUNCER = await findPgbouncer();
// Prometheus and promtool (the metrics tests scrape with a real server and unit-test the alert rules).
if (needs.has('prometheus')) {
  found.LEASEHOLD_TEST_PROMETHEUS = await findBinary({
    env: 'LEASEHOLD_TEST_PROMETHEUS',
    command: 'prometheus',
    pkg: 'prometheus',
    units: ['prometheus.service'],
  });
  found.LEASEHOLD_TEST_PROMTOOL = await findBinary({ env: 'LEASEHOLD_TEST_PROMTOOL', command: 'promtool', pkg: 'prometheus' });
}
// Debian's Chromium, driven headless by playwright-core in the dashboard tests.
if (needs.has('chromium'))
  found.LEASEHOLD_TEST_CHROMIUM = await findBinary({ env: 'LEASEHOLD_TEST_CHROMIUM', command: 'chromium', path: '/usr/bin/chromium', pkg: 'chromium' });
writeFileSync(new URL('../.test-env.json', import.meta.url), `${JSON.stringify(found, null, 2)}\n`);
log(
  Object.entries(found)
    .map(([k, v]) => `${k}=${v}`)
    .join(' '),
);

/**
 * A MariaDB server of the test's own: a datadir made with `mariadb-install-db` in a temporary
 * directory, `mariadbd` on a free loopback port, so the fault tests can kill, restart and freeze it
 * without disturbing the shared server other tests use. root has an empty password (as on the
 * shared server); the database `test` is created at the first start.
 *
 * Kept small so it starts in about a second on a 2-core machine: a 16 MB buffer pool, a 16 MB redo
 * log, no binary log, no name resolution, TCP on 127.0.0.1 only. Durability is the default
 * (`innodb_flush_log_at_trx_commit=1`): a committed row survives `kill()`, which is what the
 * restart tests lean on (tokens as durable as a committed InnoDB row).
 *
 * The server process is unref'd (it never keeps a test process alive) and killed when the test
 * process exits; `destroy()` kills it and removes the directory.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { closeSync, existsSync, mkdtempSync, openSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import mysql from 'mysql2/promise';
import { freePort } from '../../src/verify/local.js';
import { sleep } from '../helpers/env.js';

export interface MariaDb {
  readonly port: number;
  /** `mysql://root@127.0.0.1:PORT/test`. */
  readonly url: string;
  /** The server's pid while it runs. */
  readonly pid: number | undefined;
  /** Starts the server again on the same port and datadir and waits until it answers (after kill(): InnoDB crash recovery). */
  start(): Promise<void>;
  /** A clean shutdown: SIGTERM, and wait for the process to exit. */
  stop(): Promise<void>;
  /** A crash: SIGKILL (after SIGCONT, should it be frozen), and wait for the process to exit. */
  kill(): Promise<void>;
  /** stop() or kill(), then start(), keeping the datadir. */
  restart(mode: 'clean' | 'crash'): Promise<void>;
  /** SIGSTOP: the server keeps its sockets (the kernel accepts and acknowledges) and answers nothing. */
  freeze(): void;
  /** SIGCONT. */
  thaw(): void;
  /**
   * Creates a user with every privilege and an empty password, and returns its URL: the tests log
   * the backend in as a user of its own, so its connections can be told apart in PROCESSLIST.
   */
  addUser(name: string): Promise<string>;
  /** Kills the server and removes its directory; idempotent. */
  destroy(): Promise<void>;
}

/** A loaded 2-core machine can take seconds to start a server (or to recover one). */
const START_TIMEOUT_MS = 60_000;
/** mariadbd's options besides the paths and the port: small and quick to start, loopback only. */
const SERVER_OPTIONS = [
  '--bind-address=127.0.0.1',
  '--skip-name-resolve',
  '--skip-log-bin',
  '--innodb-buffer-pool-size=16M',
  '--innodb-log-file-size=16M',
  '--max-connections=200',
];

/** Every server started here, killed if the test process exits without destroying it. */
const live = new Set<ChildProcess>();
process.once('exit', () => {
  for (const c of live) {
    c.kill('SIGCONT');
    c.kill('SIGKILL');
  }
});

function which(names: readonly string[]): string | undefined {
  for (const name of names) {
    const r = spawnSync('sh', ['-c', `command -v ${name}`], { encoding: 'utf8' });
    if (r.status === 0 && r.stdout.trim() !== '') return r.stdout.trim();
  }
  for (const name of names) if (existsSync(`/usr/sbin/${name}`)) return `/usr/sbin/${name}`;
  return undefined;
}

/** The server and install binaries, or why they are missing. */
export function mariadbBinaries(): { server: string; installDb: string } | string {
  const server = which(['mariadbd', 'mysqld']);
  const installDb = which(['mariadb-install-db', 'mysql_install_db']);
  if (!server || !installDb) return 'no mariadbd / mariadb-install-db on PATH or in /usr/sbin (apt-get install mariadb-server)';
  return { server, installDb };
}

/** True once a new connection can log in as root and run a statement. */
async function answers(port: number): Promise<boolean> {
  let conn: mysql.Connection | undefined;
  try {
    conn = await mysql.createConnection({ host: '127.0.0.1', port, user: 'root', connectTimeout: 2_000 });
    conn.on('error', () => {});
    await conn.query('SELECT 1');
    return true;
  } catch {
    return false;
  } finally {
    conn?.destroy();
  }
}

async function exited(child: ChildProcess | undefined, signal: NodeJS.Signals): Promise<void> {
  if (!child || child.exitCode !== null || child.signalCode !== null) return;
  const gone = new Promise((r) => child.once('exit', r));
  child.kill('SIGCONT');
  child.kill(signal);
  await gone;
}

/** Starts a private MariaDB (install, first start, `CREATE DATABASE test`). Call destroy() in afterAll. */
export async function startMariaDb(): Promise<MariaDb> {
  const bins = mariadbBinaries();
  if (typeof bins === 'string') throw new Error(bins);
  const dir = mkdtempSync(join(tmpdir(), 'leasehold-mariadb-'));
  const data = join(dir, 'data');
  const logFile = join(dir, 'server.log');
  // mariadbd refuses to run as root unless told to; as another user it runs as that user.
  const user = process.getuid?.() === 0 ? ['--user=root'] : [];
  let port = await freePort();
  let child: ChildProcess | undefined;
  let destroyed = false;

  const tail = (): string => (existsSync(logFile) ? readFileSync(logFile, 'utf8').slice(-1_500).trim() : '');

  const start = async (): Promise<void> => {
    if (destroyed) throw new Error('the server was destroyed');
    if (child && child.exitCode === null && child.signalCode === null) throw new Error(`mariadbd on port ${port} is already running`);
    const fd = openSync(logFile, 'a');
    try {
      const args = [
        '--no-defaults',
        ...user,
        `--datadir=${data}`,
        `--port=${port}`,
        `--socket=${join(dir, 'mysqld.sock')}`,
        `--pid-file=${join(dir, 'mysqld.pid')}`,
        `--log-error=${logFile}`,
        `--tmpdir=${dir}`,
        ...SERVER_OPTIONS,
      ];
      const p = spawn(bins.server, args, { stdio: ['ignore', fd, fd], cwd: dir });
      p.on('error', () => {}); // seen below as an exit
      p.unref();
      live.add(p);
      p.once('exit', () => live.delete(p));
      child = p;
    } finally {
      closeSync(fd);
    }
    const deadline = performance.now() + START_TIMEOUT_MS;
    for (;;) {
      if (await answers(port)) return;
      if (child.exitCode !== null || child.signalCode !== null) {
        throw new Error(`mariadbd on port ${port} exited (${child.exitCode ?? child.signalCode}):\n${tail()}`);
      }
      if (performance.now() > deadline) throw new Error(`mariadbd on port ${port} did not answer within ${START_TIMEOUT_MS / 1000} s:\n${tail()}`);
      await sleep(50);
    }
  };

  const destroy = async (): Promise<void> => {
    if (destroyed) return;
    destroyed = true;
    await exited(child, 'SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  };

  try {
    const install = spawnSync(
      bins.installDb,
      [
        '--no-defaults',
        ...user,
        `--datadir=${data}`,
        `--tmpdir=${dir}`, // its own, not /tmp: a temporary file there vanished under a concurrent run once (ERROR 6 on delete)
        '--auth-root-authentication-method=normal', // root@localhost with an empty password, not unix_socket
        '--skip-test-db',
        '--skip-name-resolve',
        '--innodb-buffer-pool-size=16M',
        '--innodb-log-file-size=16M',
      ],
      { encoding: 'utf8', timeout: START_TIMEOUT_MS * 2 },
    );
    if (install.status !== 0) throw new Error(`${bins.installDb} failed (${install.status ?? install.signal}): ${install.stderr || install.stdout}`);
    // The port was free when picked; another process may bind it first (mariadbd then exits naming it). New port, new try.
    for (let attempt = 1; ; attempt++) {
      try {
        await start();
        break;
      } catch (error) {
        if (attempt >= 3 || !/Address already in use|Can't start server/i.test(String(error))) throw error;
        port = await freePort();
      }
    }
    const admin = await mysql.createConnection({ host: '127.0.0.1', port, user: 'root' });
    try {
      await admin.query('CREATE DATABASE IF NOT EXISTS test');
    } finally {
      await admin.end();
    }
  } catch (error) {
    await destroy();
    throw error;
  }

  const url = `mysql://root@127.0.0.1:${port}/test`;
  return {
    port,
    url,
    get pid() {
      return child && child.exitCode === null && child.signalCode === null ? child.pid : undefined;
    },
    start,
    stop: () => exited(child, 'SIGTERM'),
    kill: () => exited(child, 'SIGKILL'),
    async restart(mode) {
      await exited(child, mode === 'clean' ? 'SIGTERM' : 'SIGKILL');
      await start();
    },
    freeze: () => void child?.kill('SIGSTOP'),
    thaw: () => void child?.kill('SIGCONT'),
    async addUser(name) {
      const conn = await mysql.createConnection({ uri: url });
      try {
        await conn.query('CREATE USER IF NOT EXISTS ?@?', [name, '%']);
        await conn.query('GRANT ALL PRIVILEGES ON *.* TO ?@?', [name, '%']);
      } finally {
        await conn.end();
      }
      return url.replace('//root@', `//${encodeURIComponent(name)}@`);
    },
    destroy,
  };
}

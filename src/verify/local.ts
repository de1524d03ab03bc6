/**
 * Coordinators `leasehold verify` starts itself (`--url local:KIND`), so the crash nemesis can
 * kill and restart them. Each lives in the run's temporary directory on free loopback ports and is
 * stopped and removed at the end, whatever happens.
 *
 * - `local:sqlite`: a lease file in the run's directory (no server: nothing to crash).
 * - `local:redis`: `redis-server --save "" --appendonly no`: a crash loses every lease and counter,
 *   the worst case the Redis backend's server-clock-floored tokens are built for (not durable).
 * - `local:postgres`: a cluster made with initdb and run with pg_ctl (as the `postgres` OS user
 *   when verify runs as root; PostgreSQL refuses root), socket in the run's directory. A crash is
 *   `pg_ctl stop -m immediate` (no shutdown checkpoint: WAL recovery at the restart); durable.
 * - `local:etcd`: one member with its own data directory; a crash is SIGKILL; durable.
 * - `local:redlock`: three such redis-servers, the Redlock coordinator `redlock://a,b,c`. A crash
 *   kills one of them (each in turn) and restarts it empty; the other two stay up, so a majority
 *   always answers. Not durable: the restarted node forgot every holder it had recorded.
 *
 * Binaries are found on PATH (`redis-server`, `etcd`), PostgreSQL's under /usr/lib/postgresql/<newest>/bin
 * or on PATH.
 */
import { execFile, spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { chownSync, existsSync, mkdirSync, openSync, closeSync, readdirSync, readFileSync } from 'node:fs';
import net from 'node:net';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { sleep } from '../util/sleep.js';

export const LOCAL_KINDS = Object.freeze(['sqlite', 'redis', 'postgres', 'etcd', 'redlock'] as const);
export type LocalKind = (typeof LOCAL_KINDS)[number];

export interface LocalServer {
  readonly kind: LocalKind;
  /** The coordinator URL for the backend (sqlite:PATH, redis://, postgres://, etcd://, redlock://). */
  readonly url: string;
  /** A server process the crash nemesis can kill (not SQLite). */
  readonly crashable: boolean;
  /** Does its state survive a crash? (Redis started without persistence: no.) */
  readonly durable: boolean;
  /** What to call it in messages: `redis-server :PORT`. */
  readonly name: string;
  /** What the next `crash()` kills (and the `restart()` after it starts again), for messages: `name`, or one node of several. */
  readonly crashTarget: string;
  /** Kills it the hard way (SIGKILL, or PostgreSQL's immediate stop). */
  crash(): Promise<void>;
  /** Starts it again on the same port (and data, where it has some) and waits until it answers. */
  restart(): Promise<void>;
  /** Stops it for good; idempotent. The caller removes the directory. */
  stop(): Promise<void>;
}

const execFileAsync = promisify(execFile);
/** Generous: a loaded 2-core machine can take seconds to start a server. */
const START_TIMEOUT_MS = 60_000;

/** Every server process started here, killed if verify exits without stopping them. */
const live = new Set<ChildProcess>();
let exitHook = false;
function track(child: ChildProcess): void {
  if (!exitHook) {
    exitHook = true;
    process.once('exit', () => {
      for (const c of live) c.kill('SIGKILL');
    });
  }
  live.add(child);
  child.once('exit', () => live.delete(child));
}

/** A TCP port that was free a moment ago on 127.0.0.1. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.unref();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
  });
}

/** How to get a missing server binary on Debian, for the error message. */
const INSTALL: Readonly<Record<string, string>> = Object.freeze({ 'redis-server': 'apt-get install redis-server', etcd: 'apt-get install etcd-server' });

export class LocalServerError extends Error {
  override readonly name = 'LocalServerError';
}

export async function startLocal(kind: LocalKind, dir: string, label: string = kind): Promise<LocalServer> {
  switch (kind) {
    case 'sqlite':
      return {
        kind,
        url: `sqlite:${join(dir, `${label}-locks.db`)}`,
        crashable: false,
        durable: true,
        name: 'SQLite file',
        crashTarget: 'SQLite file',
        crash: async () => {},
        restart: async () => {},
        stop: async () => {},
      };
    case 'redis':
      return startRedis(join(dir, label));
    case 'postgres':
      return startPostgres(join(dir, label));
    case 'etcd':
      return startEtcd(join(dir, label));
    case 'redlock':
      return startRedlock(join(dir, label));
  }
}

/** Why a server process could not be spawned (a missing binary), by process. */
const spawnErrors = new WeakMap<ChildProcess, Error>();

async function until(what: string, check: () => Promise<boolean>, child?: ChildProcess, logFile?: string): Promise<void> {
  const deadline = performance.now() + START_TIMEOUT_MS;
  for (;;) {
    if (await check()) return;
    const spawnError = child && spawnErrors.get(child);
    if (spawnError)
      throw new LocalServerError(`cannot run ${child.spawnfile}: ${spawnError.message}${INSTALL[child.spawnfile] ? ` (${INSTALL[child.spawnfile]})` : ''}`);
    if (child && (child.exitCode !== null || child.signalCode !== null)) {
      // A binary that could not be spawned reports its 'error' right after the exit: give it a turn.
      await new Promise((r) => setImmediate(r));
      if (spawnErrors.has(child)) continue;
      const log = logFile && existsSync(logFile) ? `: ${readFileSync(logFile, 'utf8').slice(-500).trim()}` : '';
      throw new LocalServerError(`${what} exited (${child.exitCode ?? child.signalCode})${log}`);
    }
    if (performance.now() > deadline) throw new LocalServerError(`${what} did not answer within ${START_TIMEOUT_MS / 1000} s`);
    await sleep(50);
  }
}

async function killed(child: ChildProcess | undefined): Promise<void> {
  if (!child || child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((r) => child.once('exit', r));
  child.kill('SIGCONT');
  child.kill('SIGKILL');
  await exited;
}

function spawnServer(bin: string, args: string[], logFile: string, cwd: string): ChildProcess {
  const fd = openSync(logFile, 'a');
  try {
    const child = spawn(bin, args, { stdio: ['ignore', fd, fd], cwd });
    child.on('error', (error) => spawnErrors.set(child, error)); // reported by `until`
    track(child);
    return child;
  } finally {
    closeSync(fd);
  }
}

function redisPing(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = net.connect({ port, host: '127.0.0.1' });
    let data = '';
    const done = (ok: boolean): void => {
      socket.destroy();
      resolve(ok);
    };
    socket.setTimeout(1_000, () => done(false));
    socket.on('error', () => done(false));
    socket.on('connect', () => socket.write('PING\r\n'));
    socket.on('data', (chunk) => {
      data += chunk.toString();
      if (data.includes('\r\n')) done(data.startsWith('+PONG'));
    });
  });
}

async function startRedis(dir: string): Promise<LocalServer> {
  mkdirSync(dir, { recursive: true });
  const port = await freePort();
  const logFile = join(dir, 'redis.log');
  let child: ChildProcess | undefined;
  const start = async (): Promise<void> => {
    const args = ['--port', String(port), '--bind', '127.0.0.1', '--dir', dir, '--save', '', '--appendonly', 'no', '--loglevel', 'warning'];
    child = spawnServer('redis-server', args, logFile, dir);
    await until(`redis-server on port ${port}`, () => redisPing(port), child, logFile);
  };
  await start();
  let stopped = false;
  return {
    kind: 'redis',
    url: `redis://127.0.0.1:${port}`,
    crashable: true,
    durable: false,
    name: `redis-server :${port}`,
    crashTarget: `redis-server :${port}`,
    crash: () => killed(child),
    restart: async () => {
      if (!stopped) await start();
    },
    stop: async () => {
      stopped = true;
      await killed(child);
    },
  };
}

function postgresBin(tool: string): string {
  const root = '/usr/lib/postgresql';
  const versions = existsSync(root) ? readdirSync(root).filter((v) => existsSync(join(root, v, 'bin', tool))) : [];
  versions.sort((a, b) => Number(b) - Number(a));
  return versions.length > 0 ? join(root, versions[0]!, 'bin', tool) : tool;
}

async function startPostgres(dir: string): Promise<LocalServer> {
  mkdirSync(dir, { recursive: true });
  const asRoot = process.getuid?.() === 0;
  if (asRoot) {
    const id = async (flag: string): Promise<number> => Number((await execFileAsync('id', [flag, 'postgres'])).stdout.trim());
    let uid: number;
    let gid: number;
    try {
      [uid, gid] = [await id('-u'), await id('-g')];
    } catch {
      throw new LocalServerError('local:postgres runs the server as the postgres OS user when run as root, and there is none');
    }
    chownSync(dir, uid, gid);
    try {
      await execFileAsync('runuser', ['-u', 'postgres', '--', 'test', '-w', dir]);
    } catch {
      throw new LocalServerError(
        `the postgres OS user cannot reach ${dir}: every parent directory must be searchable by it (chmod o+x), or set TMPDIR to one that is`,
      );
    }
  }
  const data = join(dir, 'data');
  const logFile = join(dir, 'server.log');
  const port = await freePort();
  const run = async (tool: string, args: string[]): Promise<void> => {
    const [cmd, argv] = asRoot ? ['runuser', ['-u', 'postgres', '--', postgresBin(tool), ...args]] : [postgresBin(tool), args];
    try {
      await execFileAsync(cmd, argv, { timeout: START_TIMEOUT_MS });
    } catch (error) {
      const e = error as { stderr?: string; message: string };
      const log = existsSync(logFile) ? ` ${readFileSync(logFile, 'utf8').slice(-500).trim()}` : '';
      throw new LocalServerError(`${tool} ${args[0] ?? ''} failed: ${(e.stderr || e.message).trim()}${log}`);
    }
  };
  const start = (): Promise<void> =>
    run('pg_ctl', ['start', '-D', data, '-l', logFile, '-w', '-t', '60', '-o', `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1 -c fsync=off`]);
  await run('initdb', ['-D', data, '-A', 'trust', '-U', 'postgres', '--no-sync', '-E', 'UTF8']);
  await start();
  let up = true;
  let stopped = false;
  // pg_ctl detaches the server: if verify exits without stopping it (an internal error), stop it here, synchronously.
  const onExit = (): void => {
    if (!up) return;
    const [cmd, argv] = asRoot
      ? ['runuser', ['-u', 'postgres', '--', postgresBin('pg_ctl'), 'stop', '-D', data, '-m', 'immediate']]
      : [postgresBin('pg_ctl'), ['stop', '-D', data, '-m', 'immediate']];
    spawnSync(cmd as string, argv as string[], { stdio: 'ignore', timeout: 10_000 });
  };
  process.once('exit', onExit);
  const halt = async (): Promise<void> => {
    if (!up) return;
    up = false;
    await run('pg_ctl', ['stop', '-D', data, '-m', 'immediate', '-w']).catch(() => {});
  };
  return {
    kind: 'postgres',
    url: `postgres://postgres@127.0.0.1:${port}/postgres`,
    crashable: true,
    // fsync=off loses nothing when only the server process dies; the OS keeps what it wrote.
    durable: true,
    name: `PostgreSQL :${port}`,
    crashTarget: `PostgreSQL :${port}`,
    crash: halt,
    restart: async () => {
      if (stopped || up) return;
      await start();
      up = true;
    },
    stop: async () => {
      stopped = true;
      await halt();
      process.off('exit', onExit);
    },
  };
}

async function startEtcd(dir: string): Promise<LocalServer> {
  mkdirSync(dir, { recursive: true });
  const [clientPort, peerPort] = [await freePort(), await freePort()];
  const clientUrl = `http://127.0.0.1:${clientPort}`;
  const peerUrl = `http://127.0.0.1:${peerPort}`;
  const logFile = join(dir, 'etcd.log');
  let child: ChildProcess | undefined;
  const healthy = async (): Promise<boolean> => {
    try {
      const res = await fetch(`${clientUrl}/health`, { signal: AbortSignal.timeout(1_000) });
      return ((await res.json()) as { health?: string }).health === 'true';
    } catch {
      return false;
    }
  };
  const start = async (): Promise<void> => {
    const args = [
      '--name',
      'verify',
      '--data-dir',
      join(dir, 'data'),
      '--listen-client-urls',
      clientUrl,
      '--advertise-client-urls',
      clientUrl,
      '--listen-peer-urls',
      peerUrl,
      '--initial-advertise-peer-urls',
      peerUrl,
      '--initial-cluster',
      `verify=${peerUrl}`,
      '--initial-cluster-state',
      'new',
      '--heartbeat-interval',
      '50',
      '--election-timeout',
      '500',
      '--log-level',
      'warn',
      '--logger',
      'zap',
    ];
    child = spawnServer('etcd', args, logFile, dir);
    await until(`etcd on port ${clientPort}`, healthy, child, logFile);
  };
  await start();
  let stopped = false;
  return {
    kind: 'etcd',
    url: `etcd://127.0.0.1:${clientPort}`,
    crashable: true,
    durable: true,
    name: `etcd :${clientPort}`,
    crashTarget: `etcd :${clientPort}`,
    crash: () => killed(child),
    restart: async () => {
      if (!stopped) await start();
    },
    stop: async () => {
      stopped = true;
      await killed(child);
    },
  };
}

/** Redlock over three local redis-servers; `crash` kills one of them, in turn, and `restart` starts it again empty. */
async function startRedlock(dir: string): Promise<LocalServer> {
  const nodes: LocalServer[] = [];
  try {
    for (let i = 1; i <= 3; i++) nodes.push(await startRedis(join(dir, `node${i}`)));
  } catch (error) {
    await Promise.all(nodes.map((n) => n.stop()));
    throw error;
  }
  let crashes = 0;
  let down: LocalServer | undefined;
  return {
    kind: 'redlock',
    url: `redlock://${nodes.map((n) => n.url.slice('redis://'.length)).join(',')}`,
    crashable: true,
    durable: false,
    name: `Redlock over ${nodes.map((n) => n.name).join(', ')}`,
    get crashTarget() {
      return nodes[crashes % nodes.length]!.name;
    },
    crash: async () => {
      down = nodes[crashes++ % nodes.length]!;
      await down.crash();
    },
    restart: async () => {
      await down?.restart();
      down = undefined;
    },
    stop: async () => {
      await Promise.all(nodes.map((n) => n.stop()));
    },
  };
}

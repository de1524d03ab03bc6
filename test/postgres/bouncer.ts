/**
 * A PgBouncer in transaction mode in front of the test PostgreSQL, started by the test on a free
 * port (as the `postgres` OS user: PgBouncer refuses to run as root) and stopped in cleanup.
 * It runs in a process group of its own (with `runuser` in front when we are root), so a stop kills
 * pgbouncer itself and not only `runuser`; `stop()` resolves once the pgbouncer process is gone.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { chmodSync, readFileSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { join } from 'node:path';
import { PG_URL, sleep, tempDir } from '../helpers/env.js';

export const PGBOUNCER = process.env.LEASEHOLD_TEST_PGBOUNCER ?? '/usr/sbin/pgbouncer';

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
  });
}

/** Process groups started here, killed when this process exits if a test did not stop them. */
const live = new Set<number>();
process.once('exit', () => {
  for (const group of live) signalGroup(group, 'SIGKILL');
});

function signalGroup(group: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-group, signal);
  } catch {
    // the group is gone
  }
}

/** Whether a process runs (a zombie, exited but not reaped yet, counts as gone). */
export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
  // a zombie (exited, not reaped yet) is gone for our purposes
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).charAt(0) !== 'Z';
  } catch {
    return true; // no /proc: trust kill(0)
  }
}

async function waitGone(pid: number, timeoutMs: number): Promise<boolean> {
  const end = Date.now() + timeoutMs;
  while (alive(pid)) {
    if (Date.now() > end) return false;
    await sleep(20);
  }
  return true;
}

/** SIGTERM to the whole group, SIGKILL after 5 s; resolves once `pid` (pgbouncer) and the group leader are gone. */
async function stopGroup(child: ChildProcess, pid: number): Promise<void> {
  const group = child.pid;
  if (group === undefined) return;
  signalGroup(group, 'SIGTERM');
  if (!(await waitGone(pid, 5_000))) {
    signalGroup(group, 'SIGKILL');
    if (!(await waitGone(pid, 10_000))) throw new Error(`pgbouncer (pid ${pid}) is still running after SIGKILL`);
  }
  if (child.exitCode === null && child.signalCode === null) {
    const exited = new Promise((resolve) => child.once('exit', resolve));
    signalGroup(group, 'SIGKILL'); // runuser, if it lingers
    await Promise.race([exited, sleep(5_000)]);
  }
  live.delete(group);
}

export interface Bouncer {
  /** Connection string that goes through PgBouncer (transaction pooling). */
  url: string;
  /** The pgbouncer process itself (from its pidfile). */
  pid: number;
  stop(): Promise<void>;
}

export async function startBouncer(): Promise<Bouncer> {
  const target = new URL(PG_URL);
  const host = target.searchParams.get('host') ?? target.hostname;
  const port = target.port || '5432';
  const db = target.pathname.slice(1) || 'postgres';
  const user = decodeURIComponent(target.username || 'postgres');
  const dir = tempDir('leasehold-pgbouncer-');
  chmodSync(dir.path, 0o777);
  const listen = await freePort();
  const pidfile = join(dir.path, 'pgbouncer.pid');
  writeFileSync(join(dir.path, 'userlist.txt'), `"${user}" ""\n`);
  writeFileSync(
    join(dir.path, 'pgbouncer.ini'),
    [
      '[databases]',
      `${db} = host=${host} port=${port} dbname=${db} user=${user}`,
      '[pgbouncer]',
      'listen_addr = 127.0.0.1',
      `listen_port = ${listen}`,
      'unix_socket_dir =',
      'auth_type = trust',
      `auth_file = ${join(dir.path, 'userlist.txt')}`,
      'pool_mode = transaction',
      'max_client_conn = 500',
      'default_pool_size = 20',
      'ignore_startup_parameters = extra_float_digits,options',
      `logfile = ${join(dir.path, 'pgbouncer.log')}`,
      `pidfile = ${pidfile}`,
      '',
    ].join('\n'),
  );
  const asRoot = process.getuid?.() === 0;
  // detached: a process group of its own, so one kill(-group) reaches pgbouncer behind runuser
  const child: ChildProcess = asRoot
    ? spawn('runuser', ['-u', 'postgres', '--', PGBOUNCER, join(dir.path, 'pgbouncer.ini')], { stdio: 'ignore', detached: true })
    : spawn(PGBOUNCER, [join(dir.path, 'pgbouncer.ini')], { stdio: 'ignore', detached: true });
  if (child.pid !== undefined) live.add(child.pid);
  const pidOf = (): number => {
    try {
      const pid = Number(readFileSync(pidfile, 'utf8').trim());
      if (Number.isSafeInteger(pid) && pid > 0) return pid;
    } catch {
      // not written (yet)
    }
    return child.pid ?? 0;
  };
  const url = `postgres://${encodeURIComponent(user)}@127.0.0.1:${listen}/${db}`;
  for (let i = 0; ; i++) {
    const up = await new Promise<boolean>((resolve) => {
      const s = net.connect(listen, '127.0.0.1', () => {
        s.destroy();
        resolve(true);
      });
      s.on('error', () => resolve(false));
    });
    if (up) break;
    if (i > 100 || child.exitCode !== null) {
      let log = '';
      try {
        log = readFileSync(join(dir.path, 'pgbouncer.log'), 'utf8');
      } catch {
        // no log written
      }
      await stopGroup(child, pidOf()).catch(() => {});
      dir.cleanup();
      throw new Error(`pgbouncer did not start on ${listen}: ${log.slice(-500)}`);
    }
    await sleep(50);
  }
  // pgbouncer writes its pidfile before it listens
  const pid = pidOf();
  let stopped: Promise<void> | undefined;
  return {
    url,
    pid,
    stop: () =>
      (stopped ??= (async () => {
        try {
          await stopGroup(child, pid);
        } finally {
          dir.cleanup();
        }
      })()),
  };
}

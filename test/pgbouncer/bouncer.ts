/**
 * A PgBouncer in transaction mode in front of the test PostgreSQL, started by the test on a free
 * port (as the `postgres` OS user: PgBouncer refuses to run as root) and stopped in cleanup.
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

export interface Bouncer {
  /** Connection string that goes through PgBouncer (transaction pooling). */
  url: string;
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
      '',
    ].join('\n'),
  );
  const asRoot = process.getuid?.() === 0;
  const child: ChildProcess = asRoot
    ? spawn('runuser', ['-u', 'postgres', '--', PGBOUNCER, join(dir.path, 'pgbouncer.ini')], { stdio: 'ignore' })
    : spawn(PGBOUNCER, [join(dir.path, 'pgbouncer.ini')], { stdio: 'ignore' });
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
      child.kill('SIGKILL');
      dir.cleanup();
      throw new Error(`pgbouncer did not start on ${listen}: ${log.slice(-500)}`);
    }
    await sleep(50);
  }
  return {
    url,
    stop: async () => {
      if (child.exitCode === null) {
        const exited = new Promise((resolve) => child.once('exit', resolve));
        // runuser forwards SIGTERM to pgbouncer, which then shuts down
        child.kill('SIGTERM');
        await Promise.race([exited, sleep(5_000)]);
        if (child.exitCode === null) child.kill('SIGKILL');
      }
      dir.cleanup();
    },
  };
}

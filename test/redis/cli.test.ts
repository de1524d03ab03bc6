/**
 * `leasehold run --url redis://…` and `leasehold demo --url redis://…` against a redis-server of
 * our own, through the built command (dist/cli/main.js, built by `npm test`'s pretest).
 */
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { startRedis, stopAll } from './servers.js';

const MAIN = fileURLToPath(new URL('../../dist/cli/main.js', import.meta.url));

afterAll(stopAll);

describe('the leasehold command on Redis', () => {
  it('run: the child gets the token; a second run while it holds the key exits 75; redlock:// works too', async () => {
    const [server, b, c] = await Promise.all([startRedis(), startRedis(), startRedis()]);
    const cli = (...args: string[]) => spawnSync(process.execPath, [MAIN, ...args], { encoding: 'utf8', timeout: 30_000 });
    const first = cli('run', 'cron:nightly', '--url', server.url, '--', process.execPath, '-e', 'console.log(process.env.LEASEHOLD_TOKEN)');
    expect(first.status).toBe(0);
    expect(BigInt(first.stdout.trim())).toBeGreaterThan(0n);
    const holder = spawnSync(
      process.execPath,
      [
        '-e',
        `
      const { spawn, spawnSync } = require('node:child_process');
      const child = spawn(process.execPath, [${JSON.stringify(MAIN)}, 'run', 'cron:busy', '--url', ${JSON.stringify(server.url)}, '--', process.execPath, '-e', 'setTimeout(() => {}, 3000)'], { stdio: 'ignore' });
      setTimeout(() => {
        const r = spawnSync(process.execPath, [${JSON.stringify(MAIN)}, 'run', 'cron:busy', '--url', ${JSON.stringify(server.url)}, '--', 'true'], { encoding: 'utf8' });
        console.log(r.status);
        child.kill('SIGTERM');
      }, 1000);
    `,
      ],
      { encoding: 'utf8', timeout: 30_000 },
    );
    expect(holder.stdout.trim()).toBe('75');
    const hosts = [server, b, c].map((s) => `127.0.0.1:${s.port}`).join(',');
    const viaRedlock = cli('run', 'cron:quorum', '--url', `redlock://${hosts}`, '--', process.execPath, '-e', 'console.log(process.env.LEASEHOLD_TOKEN)');
    expect(viaRedlock.status).toBe(0);
    expect(BigInt(viaRedlock.stdout.trim())).toBeGreaterThan(0n);
  });

  it('ls and run against a frozen server (SIGSTOP: connects, never answers) exit 69 instead of hanging', async () => {
    const server = await startRedis();
    server.pause();
    try {
      // The timeout only keeps a regression from hanging the suite; a fixed build exits in a few seconds.
      const cli = (...args: string[]) => spawnSync(process.execPath, [MAIN, ...args], { encoding: 'utf8', timeout: 30_000 });
      const ls = cli('ls', '--url', server.url);
      expect(ls.signal, 'ls was killed by the test timeout').toBeNull();
      expect(ls.status).toBe(69);
      expect(ls.stderr).toMatch(/coordinator unavailable/);
      const run = cli('run', 'frozen:job', '--url', server.url, '--', 'true');
      expect(run.signal, 'run was killed by the test timeout').toBeNull();
      expect(run.status).toBe(69);
      expect(run.stderr).toMatch(/coordinator unavailable/);
    } finally {
      server.resume();
      await server.kill();
    }
  });

  it('ls against a port nobody listens on exits 69 and names ECONNREFUSED', async () => {
    const server = await startRedis();
    await server.kill();
    const ls = spawnSync(process.execPath, [MAIN, 'ls', '--url', server.url], { encoding: 'utf8', timeout: 30_000 });
    expect(ls.status).toBe(69);
    expect(ls.stderr).toMatch(/ECONNREFUSED/);
  });

  it('demo: the zombie-worker scenario leases from Redis; the fence refuses the stale token', async () => {
    const server = await startRedis();
    const r = spawnSync(process.execPath, [MAIN, 'demo', '--url', server.url], { encoding: 'utf8', timeout: 60_000 });
    expect(r.status).toBe(0);
    expect(r.stdout).toContain('SAFE');
    expect(r.stdout).toContain('StaleTokenError');
  });
});

/**
 * `leasehold serve` as a real process (the built command): it serves the coordinator at --url (or
 * LEASEHOLD_URL) and prints where it listens; SIGTERM ends it with exit 0 after answering a waiting
 * long poll; it refuses a non-loopback --host without --auth (64), a bad auth file or half a TLS pair
 * (64), an unreachable coordinator or a port in use (69).
 */
import { writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import { Locks } from '../../src/core/locks.js';
import { sqliteBackend } from '../../src/sqlite/index.js';
import { killAll, requireBuild, runCli, type Sandbox, sandbox, startCli } from '../cli/helpers.js';
import { eventually } from '../helpers/env.js';
import { acquirePath, http, sha256 } from './helpers.js';

let sb: Sandbox | undefined;
beforeAll(() => requireBuild());
afterEach(() => {
  killAll();
  sb?.cleanup();
  sb = undefined;
});

const LISTENING = /leasehold serve: listening on (https?:\/\/[^\s]+) \(backend (\w+)/;

describe('leasehold serve', () => {
  it('serves LEASEHOLD_URL’s coordinator, prints the address, and exits 0 on SIGTERM after answering a waiting poll', async () => {
    sb = sandbox();
    const cli = startCli(['serve', '--port', '0'], sb);
    const [, url, backend] = (await cli.waitFor(LISTENING)) as RegExpMatchArray;
    expect(url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    expect(backend).toBe('sqlite');
    const got = await http(url!, 'POST', acquirePath('job:nightly'), { ttlMs: 30_000, label: 'via-http' });
    expect(got.status).toBe(200);
    // The lease is in the coordinator's file: a library client sees it.
    const locks = new Locks({ backend: sqliteBackend({ path: sb.db }) });
    try {
      expect((await locks.inspect('job:'))[0]?.holders).toMatchObject([{ holder: 'via-http', token: 1n }]);
    } finally {
      await locks.close();
    }
    const waiting = http(url!, 'POST', acquirePath('job:nightly'), { waitMs: 60_000 }).catch((e: unknown) => e);
    await eventually(async () => {
      const { body } = await http(url!, 'GET', '/v1/locks');
      return (body.locks as { waiters: number }[])[0]?.waiters === 1;
    }, 10_000);
    cli.child.kill('SIGTERM');
    expect(await waiting).toMatchObject({ status: 503, body: { code: 'CLOSED' } });
    expect((await cli.done).code).toBe(0);
  });

  it('--url wins over LEASEHOLD_URL; --auth lets it listen on 0.0.0.0, and every request needs a token', async () => {
    sb = sandbox();
    const auth = join(sb.dir, 'auth.json');
    writeFileSync(auth, JSON.stringify({ callers: [{ name: 'svc-a', tokenSha256: sha256('s3cret'), prefixes: ['a/'] }] }));
    const cli = startCli(['serve', '--url', 'memory:', '--host', '0.0.0.0', '--port', '0', '--auth', auth], sb);
    const [, url, backend] = (await cli.waitFor(LISTENING)) as RegExpMatchArray;
    expect(backend).toBe('memory');
    const local = url!.replace('0.0.0.0', '127.0.0.1');
    expect((await http(local, 'GET', '/v1/health')).status).toBe(401);
    expect(await http(local, 'GET', '/v1/health', undefined, { authorization: 'Bearer s3cret' })).toMatchObject({ status: 200, body: { backend: 'memory' } });
    expect((await http(local, 'POST', acquirePath('b/1'), {}, { authorization: 'Bearer s3cret' })).status).toBe(403);
    cli.child.kill('SIGINT');
    expect((await cli.done).code).toBe(0);
  });

  it('refuses a non-loopback --host without --auth (64), names the rule, and listens nowhere', async () => {
    sb = sandbox();
    for (const host of ['0.0.0.0', '::']) {
      const got = await runCli(['serve', '--url', 'memory:', '--host', host, '--port', '0'], sb);
      expect(got.code).toBe(64);
      expect(got.stderr).toMatch(/without --auth the lock service listens on loopback only/);
      expect(got.stderr).toMatch(/usage: leasehold serve/);
      expect(got.stdout).toBe('');
    }
  });

  it('bad arguments exit 64: an auth file that is not the format, half a TLS pair, a bad port or rate', async () => {
    sb = sandbox();
    const auth = join(sb.dir, 'auth.json');
    writeFileSync(auth, JSON.stringify({ callers: [{ name: 'svc-a', tokenSha256: 'nothex', prefixes: [''] }] }));
    const cases = [
      [['serve', '--auth', auth, '--port', '0'], /auth\.callers\[0\]\.tokenSha256/],
      [['serve', '--auth', join(sb.dir, 'missing.json'), '--port', '0'], /cannot read/],
      [['serve', '--tls-cert', auth, '--port', '0'], /--tls-cert and --tls-key go together/],
      [['serve', '--port', '70000'], /--port/],
      [['serve', '--rate-limit', '0'], /--rate-limit/],
    ] as const;
    for (const [args, message] of cases) {
      const got = await runCli(args, sb);
      expect(got.code, args.join(' ')).toBe(64);
      expect(got.stderr, args.join(' ')).toMatch(message);
    }
  });

  it('exits 69 when the coordinator cannot be reached, or the port is in use', async () => {
    sb = sandbox();
    const refused = await runCli(['serve', '--url', 'redis://127.0.0.1:1', '--port', '0'], sb);
    expect(refused.code).toBe(69);
    expect(refused.stderr).toMatch(/coordinator unavailable/);
    const taken = createServer();
    await new Promise<void>((resolve) => taken.listen(0, '127.0.0.1', resolve));
    try {
      const port = (taken.address() as { port: number }).port;
      const busy = await runCli(['serve', '--url', 'memory:', '--port', String(port)], sb);
      expect(busy.code).toBe(69);
      expect(busy.stderr).toMatch(/cannot listen on 127\.0\.0\.1/);
    } finally {
      taken.close();
    }
  });
});

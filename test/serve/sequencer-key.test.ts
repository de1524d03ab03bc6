/**
 * `leasehold serve --sequencer-key FILE` (issue 19 point 4): the acquire answer's sequencer is
 * signed (`lh1s.`) and verifies offline with the key file (HMAC secret, Ed25519 pair, rotation), a
 * fence given the key accepts it; POST /v1/sequencers/check verifies with the key and refuses an
 * unsigned, forged, altered or another service's sequencer with a 400 naming `sequencer` (a genuine
 * one no longer held is still 200 valid:false); a bad key refuses to make the server; the built
 * command exits 64 for a bad key file, naming the option and never printing the key.
 */
import { execFileSync } from 'node:child_process';
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import { InvalidArgumentError } from '../../src/core/errors.js';
import { signSequencer, verifySequencer } from '../../src/core/sequencer-sign.js';
import { formatSequencer } from '../../src/core/token.js';
import { memoryBackend } from '../../src/memory/index.js';
import { memoryFence } from '../../src/memory/fence.js';
import { createLockServer, type LockServerApp } from '../../src/serve/index.js';
import { loadSequencerKey } from '../../src/util/sequencer-key.js';
import { killAll, requireBuild, runCli, type Sandbox, sandbox, startCli } from '../cli/helpers.js';
import { tempDir } from '../helpers/env.js';
import { acquirePath, call, http } from './helpers.js';

let app: LockServerApp | undefined;
let sb: Sandbox | undefined;
const dirs: { cleanup: () => void }[] = [];
afterEach(async () => {
  for (const d of dirs.splice(0)) d.cleanup();
  await app?.close();
  app = undefined;
  killAll();
  sb?.cleanup();
  sb = undefined;
});

const hexKey = (): string => randomBytes(32).toString('hex');
const CHECK = '/v1/sequencers/check';

async function server(keyText: string | undefined, options: { sessions?: boolean } = {}): Promise<LockServerApp> {
  const dir = tempDir();
  dirs.push(dir);
  let sequencerKey: ReturnType<typeof loadSequencerKey> | undefined;
  if (keyText !== undefined) {
    const file = join(dir.path, 'seq.key');
    writeFileSync(file, keyText);
    sequencerKey = loadSequencerKey(file);
  }
  app = await createLockServer({ backend: memoryBackend({ sessions: options.sessions ?? false }), ...(sequencerKey && { sequencerKey }) });
  return app;
}

async function acquire(a: LockServerApp, key: string, body: Record<string, unknown> = {}) {
  const got = await call(a, 'POST', acquirePath(key), body);
  expect(got.status, JSON.stringify(got.body)).toBe(200);
  return got.body as { lease: string; sequencer: string; token: string; mode: 'exclusive' | 'shared' };
}

describe('with --sequencer-key, the acquire answer', () => {
  it('is signed (lh1s.) and verifies with the key file: key, mode and token of the grant; a fence with the key accepts it', async () => {
    const secret = `# the lock service's key\n${hexKey()}\n`;
    const a = await server(secret);
    const got = await acquire(a, 'tenant/42', { ttlMs: 5_000 });
    expect(got.sequencer).toMatch(/^lh1s\.e\.1\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]{43}$/);
    expect(verifySequencer(got.sequencer, secret)).toEqual({ version: 1, key: 'tenant/42', mode: 'exclusive', token: 1n });
    const shared = await acquire(a, 'docs', { mode: 'shared' });
    expect(verifySequencer(shared.sequencer, secret)).toEqual({ version: 1, key: 'docs', mode: 'shared', token: BigInt(shared.token) });

    const fence = memoryFence({ sequencerKey: secret });
    expect(await fence.write('row', got.sequencer, () => 'written')).toBe('written');
    // An unsigned sequencer of the same grant, or one signed with another key, is refused.
    await expect(fence.write('row', formatSequencer('tenant/42', 'exclusive', 2n), () => 'no')).rejects.toBeInstanceOf(InvalidArgumentError);
    await expect(fence.write('row', signSequencer(formatSequencer('tenant/42', 'exclusive', 2n), randomBytes(32)), () => 'no')).rejects.toThrow(
      /signature does not match/,
    );
    expect(await fence.highest('row')).toBe(1n);
  });

  it('is signed for a session lease and a semaphore permit too', async () => {
    const secret = hexKey();
    const a = await server(secret, { sessions: true });
    const session = (await call(a, 'POST', '/v1/sessions', { ttlMs: 5_000 })).body.session as string;
    const viaSession = await acquire(a, 'with-session', { session });
    expect(verifySequencer(viaSession.sequencer, secret)).toMatchObject({ key: 'with-session', token: BigInt(viaSession.token) });
    const permit = await acquire(a, 'pool', { limit: 3 });
    expect(verifySequencer(permit.sequencer, secret)).toMatchObject({ key: 'pool', mode: 'shared' });
  });

  it('with an Ed25519 private key, verifies with its public key alone; with rotation, the first key signs and the others still verify', async () => {
    const { privateKey, publicKey } = generateKeyPairSync('ed25519');
    const privatePem = privateKey.export({ type: 'pkcs8', format: 'pem' }) as string;
    const publicPem = publicKey.export({ type: 'spki', format: 'pem' }) as string;
    const old = hexKey();
    const a = await server(`${privatePem}\n# the key before rotation\n${old}\n`);
    const got = await acquire(a, 'k');
    expect(got.sequencer).toMatch(/\.[A-Za-z0-9_-]{86}$/);
    expect(verifySequencer(got.sequencer, publicPem)).toMatchObject({ key: 'k', token: 1n });
    expect(() => verifySequencer(got.sequencer, old)).toThrow(InvalidArgumentError);
    // One signed with the old key before the rotation still checks.
    const beforeRotation = signSequencer(formatSequencer('k', 'exclusive', 1n), old);
    expect(await call(a, 'POST', CHECK, { sequencer: beforeRotation })).toMatchObject({ status: 200, body: { valid: true, token: '1' } });
  });
});

describe('with --sequencer-key, POST /v1/sequencers/check', () => {
  it('answers a genuine sequencer (valid while held, valid:false after the release) and refuses any other with 400 naming sequencer', async () => {
    const secret = hexKey();
    const a = await server(secret);
    const got = await acquire(a, 'job');
    expect(await call(a, 'POST', CHECK, { sequencer: got.sequencer })).toMatchObject({
      status: 200,
      body: { valid: true, key: 'job', mode: 'exclusive', token: '1', lastToken: '1' },
    });

    const sig = got.sequencer.slice(got.sequencer.lastIndexOf('.') + 1);
    const forgeries: [string, string][] = [
      ['unsigned', formatSequencer('job', 'exclusive', 1n)],
      ['signed with another key', signSequencer(formatSequencer('job', 'exclusive', 1n), randomBytes(32))],
      ['another token under the signature', `${formatSequencer('job', 'exclusive', 2n).replace(/^lh1\./, 'lh1s.')}.${sig}`],
      ['shared under the signature', `${formatSequencer('job', 'shared', 1n).replace(/^lh1\./, 'lh1s.')}.${sig}`],
      ['a signature changed', got.sequencer.slice(0, -2) + (got.sequencer.endsWith('AA') ? 'BA' : 'AA')],
    ];
    for (const [what, sequencer] of forgeries) {
      const refused = await call(a, 'POST', CHECK, { sequencer });
      expect(refused.status, what).toBe(400);
      expect(refused.body, what).toMatchObject({ code: 'INVALID_ARGUMENT', field: 'sequencer' });
      expect(refused.body.message, what).toMatch(/not signed by this service/);
    }
    // Malformed is the same 400 as without a key.
    expect(await call(a, 'POST', CHECK, { sequencer: 'lh1s.x' })).toMatchObject({ status: 400, body: { field: 'sequencer' } });

    expect((await call(a, 'DELETE', `/v1/leases/${got.lease}`)).status).toBe(204);
    expect(await call(a, 'POST', CHECK, { sequencer: got.sequencer })).toMatchObject({ status: 200, body: { valid: false, token: '1' } });
  });

  it('without a key, issues unsigned sequencers and checks any well-formed one, a signed one’s signature unchecked', async () => {
    const a = await server(undefined);
    const got = await acquire(a, 'job');
    expect(got.sequencer).toBe(formatSequencer('job', 'exclusive', 1n));
    const signedElsewhere = signSequencer(got.sequencer, randomBytes(32));
    expect(await call(a, 'POST', CHECK, { sequencer: signedElsewhere })).toMatchObject({ status: 200, body: { valid: true } });
  });
});

describe('the sequencerKey option', () => {
  it('refuses a key that cannot sign or is not a key, naming options.sequencerKey, before opening anything', async () => {
    const { publicKey } = generateKeyPairSync('ed25519');
    for (const sequencerKey of [publicKey, randomBytes(16), 'not a key', [] as string[]]) {
      const made = createLockServer({ backend: memoryBackend(), sequencerKey: sequencerKey as never });
      await expect(made).rejects.toBeInstanceOf(InvalidArgumentError);
      await expect(made).rejects.toThrow(/options\.sequencerKey/);
    }
  });
});

describe('leasehold serve --sequencer-key (the built command)', () => {
  beforeAll(() => requireBuild());

  it('signs what it issues', async () => {
    sb = sandbox();
    const file = join(sb.dir, 'seq.key');
    const secret = execFileSync('openssl', ['rand', '-hex', '32'], { encoding: 'utf8' });
    writeFileSync(file, secret);
    const cli = startCli(['serve', '--url', 'memory:', '--port', '0', '--sequencer-key', file], sb);
    const [, url] = (await cli.waitFor(/listening on (http:\/\/[^\s]+) .*signed sequencers/)) as RegExpMatchArray;
    const got = await http(url!, 'POST', acquirePath('cli/job'), {});
    expect(got.status).toBe(200);
    expect(verifySequencer(got.body.sequencer as string, secret)).toMatchObject({ key: 'cli/job', token: 1n });
    cli.child.kill('SIGTERM');
    expect((await cli.done).code).toBe(0);
  });

  it('a bad key file exits 64 naming --sequencer-key, and prints no key material', async () => {
    sb = sandbox();
    const short = randomBytes(16).toString('hex');
    const { publicKey } = generateKeyPairSync('ed25519');
    const files = {
      short: [short, /--sequencer-key.*too short/],
      garbage: ['this is no key at all!', /--sequencer-key.*line 1/],
      empty: ['# nothing here\n', /--sequencer-key.*no key/],
      public: [publicKey.export({ type: 'spki', format: 'pem' }) as string, /--sequencer-key.*public key/],
    } as const;
    const cases: [string, RegExp, string | undefined][] = [[join(sb.dir, 'missing.key'), /--sequencer-key.*cannot read/, undefined]];
    for (const [name, [text, message]] of Object.entries(files)) {
      const file = join(sb.dir, `${name}.key`);
      writeFileSync(file, text);
      cases.push([file, message, text]);
    }
    for (const [file, message, text] of cases) {
      const got = await runCli(['serve', '--url', 'memory:', '--port', '0', '--sequencer-key', file], sb);
      expect(got.code, file).toBe(64);
      expect(got.stderr, file).toMatch(message);
      if (text === short) expect(got.stderr + got.stdout).not.toContain(short);
      if (text?.includes('BEGIN')) expect(got.stderr + got.stdout).not.toContain(text.split('\n')[1]);
    }
  });
});

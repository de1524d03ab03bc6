import { execFileSync } from 'node:child_process';
import { createHmac, createSecretKey, generateKeyPairSync, randomBytes } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import fc from 'fast-check';
import { afterAll, describe, expect, it } from 'vitest';
import { InvalidArgumentError } from '../../src/core/errors.js';
import { MIN_SEQUENCER_SECRET_BYTES, signSequencer, verifySequencer } from '../../src/core/sequencer-sign.js';
import { formatSequencer, MAX_TOKEN, parseSequencer, toToken } from '../../src/core/token.js';
import { MAX_KEY_BYTES } from '../../src/core/validate.js';
import * as root from '../../src/index.js';
import { loadSequencerKey } from '../../src/util/sequencer-key.js';
import { tempDir } from '../helpers/env.js';

const keyArb = fc
  .string({ unit: 'grapheme', minLength: 1, maxLength: 200 })
  .filter((k) => !k.includes('\0') && new TextEncoder().encode(k).length <= MAX_KEY_BYTES);
const modeArb = fc.constantFrom('exclusive' as const, 'shared' as const);
const tokenArb = fc.bigInt({ min: 1n, max: MAX_TOKEN });
const secret = randomBytes(32);
const pair = generateKeyPairSync('ed25519');
/** The pattern of the unsigned form, as a parser written before signed sequencers reads it. */
const OLD_PARSER = /^lh1\.([es])\.([1-9][0-9]{0,18})\.([A-Za-z0-9_-]+)$/;

/** The InvalidArgumentError `fn` throws (fails the test when it throws nothing or something else). */
function refusal(fn: () => unknown): InvalidArgumentError {
  try {
    fn();
  } catch (error) {
    expect(error).toBeInstanceOf(InvalidArgumentError);
    return error as InvalidArgumentError;
  }
  throw new Error('expected an InvalidArgumentError, nothing was thrown');
}

describe('signed sequencers', () => {
  it('are exported from the package root', () => {
    expect(root.signSequencer).toBe(signSequencer);
    expect(root.verifySequencer).toBe(verifySequencer);
    expect(root.MIN_SEQUENCER_SECRET_BYTES).toBe(32);
  });

  it('round-trip any key, mode and token (HMAC): verify returns what parse returns, old parsers refuse them, HTTP-header safe', () => {
    fc.assert(
      fc.property(keyArb, modeArb, tokenArb, (key, mode, token) => {
        const unsigned = formatSequencer(key, mode, token);
        const signed = signSequencer(unsigned, secret);
        expect(signed.startsWith('lh1s.')).toBe(true);
        expect(signed).toMatch(/^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/);
        expect(verifySequencer(signed, secret)).toEqual({ version: 1, key, mode, token });
        expect(parseSequencer(signed)).toEqual({ version: 1, key, mode, token });
        expect(toToken(signed)).toBe(token);
        expect(OLD_PARSER.test(signed)).toBe(false);
        // deterministic, and signing a signed sequencer again gives the same one
        expect(signSequencer(signed, secret)).toBe(signed);
      }),
    );
  });

  it('round-trip with Ed25519: the private key signs, the public key (or the private one) verifies', () => {
    fc.assert(
      fc.property(keyArb, modeArb, tokenArb, (key, mode, token) => {
        const signed = signSequencer(formatSequencer(key, mode, token), pair.privateKey);
        expect(signed.length).toBeLessThanOrEqual(2048);
        expect(verifySequencer(signed, pair.publicKey)).toEqual({ version: 1, key, mode, token });
        expect(verifySequencer(signed, pair.privateKey)).toEqual({ version: 1, key, mode, token });
      }),
      { numRuns: 50 },
    );
    const longest = signSequencer(formatSequencer('é'.repeat(MAX_KEY_BYTES / 2), 'exclusive', MAX_TOKEN), pair.privateKey);
    expect(verifySequencer(longest, pair.publicKey).token).toBe(MAX_TOKEN);
  });

  it('any change of one character is refused, never accepted (HMAC and Ed25519)', () => {
    const signedHmac = signSequencer(formatSequencer('tenant:42/export', 'exclusive', 1234n), secret);
    const signedEd = signSequencer(formatSequencer('tenant:42/export', 'exclusive', 1234n), pair.privateKey);
    const alphabet = 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.';
    for (const [signed, key] of [
      [signedHmac, secret],
      [signedEd, pair.publicKey],
    ] as const) {
      fc.assert(
        fc.property(fc.nat({ max: signed.length - 1 }), fc.constantFrom(...alphabet), (at, c) => {
          fc.pre(signed[at] !== c);
          const altered = signed.slice(0, at) + c + signed.slice(at + 1);
          expect(refusal(() => verifySequencer(altered, key)).argument).toMatch(/^sequencer( key)?$/); // 'sequencer key' when the key part no longer decodes
        }),
        { numRuns: 1000 },
      );
    }
  });

  it('names why a sequencer is refused: unsigned, signed with another key, malformed', () => {
    const unsigned = formatSequencer('k', 'exclusive', 7n);
    const signed = signSequencer(unsigned, secret);
    expect(refusal(() => verifySequencer(unsigned, secret)).message).toMatch(/not signed/);
    expect(refusal(() => verifySequencer(signed, randomBytes(32))).message).toMatch(/does not match the verification key: forged/);
    expect(refusal(() => verifySequencer(signed, [randomBytes(32), randomBytes(32)])).message).toMatch(/any of the 2 verification keys/);
    // an HMAC can never pass for an Ed25519 signature or the other way round: the verifier's key decides
    expect(refusal(() => verifySequencer(signed, pair.publicKey)).message).toMatch(/does not match/);
    expect(refusal(() => verifySequencer(signSequencer(unsigned, pair.privateKey), secret)).message).toMatch(/does not match/);
    expect(refusal(() => verifySequencer('7', secret)).message).toMatch(/not a leasehold sequencer/);
    expect(refusal(() => verifySequencer(`${signed}A`, secret)).message).toMatch(/not a well-formed signed sequencer/);
    expect(refusal(() => verifySequencer(signed.slice(0, signed.lastIndexOf('.')), secret)).message).toMatch(/not a well-formed signed sequencer/);
    expect(refusal(() => verifySequencer(`lh2s${signed.slice(4)}`, secret)).message).toMatch(/version 2 is not supported/);
    expect(refusal(() => verifySequencer(42 as never, secret)).argument).toBe('sequencer');
    // the last base64url character of a 32-byte MAC carries 2 spare bits: only the canonical one is accepted
    const last = signed.at(-1)!;
    const sibling = 'AEIMQUYcgkosw048'.includes(last) ? String.fromCharCode(last.charCodeAt(0) + 1) : last;
    if (sibling !== last) expect(refusal(() => verifySequencer(signed.slice(0, -1) + sibling, secret)).message).toMatch(/canonical/);
  });

  it('the MAC is HMAC-SHA-256 over the documented message, so any language can check it (a test vector, as computed by the hmac module of Python)', () => {
    const key = Buffer.alloc(32, 7);
    const signed = signSequencer(formatSequencer('tenant:42/export', 'exclusive', 42n), key);
    const fields = `e.42.${Buffer.from('tenant:42/export').toString('base64url')}`;
    const mac = createHmac('sha256', key).update(`leasehold signed sequencer\nlh1s.${fields}`).digest('base64url');
    expect(signed).toBe(`lh1s.${fields}.${mac}`);
    expect(signed).toBe('lh1s.e.42.dGVuYW50OjQyL2V4cG9ydA.JirBhEKA7lj_eb1Y-fFwswC32pLt6n_TgroKmNvKkRo');
  });

  it('keys: bytes, KeyObjects and the key file text (hex, base64, base64url, PEM, comments, CRLF); rotation: the first signs, any verifies', () => {
    const hex = secret.toString('hex');
    const b64 = secret.toString('base64');
    const old = randomBytes(48);
    const byOld = signSequencer(formatSequencer('k', 'shared', 9n), old);
    const bySecret = signSequencer(formatSequencer('k', 'shared', 9n), secret);
    for (const form of [
      hex,
      `${hex}\n`,
      b64,
      secret.toString('base64url'),
      createSecretKey(secret),
      new Uint8Array(secret),
      `# rotated 2026-12\r\n\r\n${hex}\r\n`,
    ]) {
      expect(signSequencer(formatSequencer('k', 'shared', 9n), form)).toBe(bySecret);
    }
    const file = `# the first key signs\n${hex}\n\n# the previous key, still accepted\n${old.toString('base64')}\n`;
    expect(signSequencer(formatSequencer('k', 'shared', 9n), file)).toBe(bySecret);
    expect(verifySequencer(byOld, file).token).toBe(9n);
    expect(verifySequencer(byOld, [secret, old]).token).toBe(9n);
    expect(signSequencer(formatSequencer('k', 'shared', 9n), [old, secret])).toBe(byOld);

    const privatePem = pair.privateKey.export({ type: 'pkcs8', format: 'pem' }) as string;
    const publicPem = pair.publicKey.export({ type: 'spki', format: 'pem' }) as string;
    const byEd = signSequencer(formatSequencer('k', 'shared', 9n), privatePem);
    expect(verifySequencer(byEd, publicPem).token).toBe(9n);
    expect(verifySequencer(byEd, `${hex}\n${publicPem}`).token).toBe(9n); // mixed: rotating from HMAC to Ed25519
    expect(verifySequencer(bySecret, `${hex}\n${publicPem}`).token).toBe(9n);
    expect(refusal(() => signSequencer(formatSequencer('k', 'shared', 9n), publicPem)).message).toMatch(/public key, which can only verify/);
  });

  it('bad keys are refused naming sequencerKey, and no error shows key material', () => {
    const short = randomBytes(MIN_SEQUENCER_SECRET_BYTES - 1);
    const rsa = generateKeyPairSync('rsa', { modulusLength: 1024 });
    const encrypted = pair.privateKey.export({ type: 'pkcs8', format: 'pem', cipher: 'aes-256-cbc', passphrase: 'pw' }) as string;
    const seq = formatSequencer('k', 'exclusive', 1n);
    const cases: [unknown, RegExp][] = [
      [short, /31 bytes is too short; at least 32/],
      [short.toString('hex'), /line 1: a secret of 31 bytes is too short/],
      [`${secret.toString('hex')}\n${short.toString('base64')}`, /line 2: a secret of 31 bytes/],
      ['correct horse battery staple', /line 1 is neither hex nor base64 nor a PEM block/],
      ['', /contains no key/],
      ['# only a comment\n', /contains no key/],
      [[], /contains no key/],
      [Array.from({ length: 17 }, () => randomBytes(32)), /17 keys; at most 16/],
      [createSecretKey(short), /too short/],
      [rsa.privateKey, /rsa private key is not supported/],
      [rsa.publicKey.export({ type: 'spki', format: 'pem' }), /rsa public key is not supported/],
      [encrypted, /ENCRYPTED PRIVATE KEY.*unencrypted/],
      ['-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEI\n', /without its END line/],
      ['-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n', /line 1: not a usable key/],
      [42, /expected a secret/],
      [null, /expected a secret/],
    ];
    for (const [key, problem] of cases) {
      for (const fn of [() => signSequencer(seq, key as never), () => verifySequencer(signSequencer(seq, secret), key as never)]) {
        const e = refusal(fn);
        expect(e.argument, String(problem)).toBe('sequencerKey');
        expect(e.message).toMatch(problem);
        expect(e.message).not.toContain(short.toString('hex'));
        expect(e.message).not.toContain(secret.toString('hex'));
      }
    }
  });
});

describe('loadSequencerKey (the --sequencer-key FILE of leasehold serve)', () => {
  const dir = tempDir();
  afterAll(() => dir.cleanup());
  const file = (name: string, text: string): string => {
    const path = join(dir.path, name);
    writeFileSync(path, text, { mode: 0o600 });
    return path;
  };

  it('reads `openssl rand -hex 32` and `openssl rand -base64 32` output; the keys sign and verify as the text would', () => {
    for (const args of [
      ['rand', '-hex', '32'],
      ['rand', '-base64', '32'],
    ]) {
      const text = execFileSync('openssl', args, { encoding: 'utf8' });
      const keys = loadSequencerKey(file(`seq-${args[1]}.key`, text));
      expect(keys).toHaveLength(1);
      const signed = signSequencer(formatSequencer('job', 'exclusive', 3n), keys);
      expect(signed).toBe(signSequencer(formatSequencer('job', 'exclusive', 3n), text));
      expect(verifySequencer(signed, text).token).toBe(3n);
    }
  });

  it('reads an Ed25519 key pair made by openssl: the service loads the private key, a resource verifies with the public one', () => {
    const privatePath = join(dir.path, 'seq.pem');
    execFileSync('openssl', ['genpkey', '-algorithm', 'ed25519', '-out', privatePath]);
    const publicText = execFileSync('openssl', ['pkey', '-in', privatePath, '-pubout'], { encoding: 'utf8' });
    const signed = signSequencer(formatSequencer('job', 'shared', 11n), loadSequencerKey(privatePath));
    expect(verifySequencer(signed, publicText).token).toBe(11n);
    expect(verifySequencer(signed, loadSequencerKey(file('seq.pub.pem', publicText), { use: 'verify' })).token).toBe(11n);
    // the lock service cannot sign with a public key: refused at load, not at the first grant
    expect(refusal(() => loadSequencerKey(join(dir.path, 'seq.pub.pem'))).message).toMatch(/seq\.pub\.pem.*Ed25519 public key, which can only verify/);
  });

  it('refuses a missing, empty or malformed file naming --sequencer-key and the path', () => {
    const missing = refusal(() => loadSequencerKey(join(dir.path, 'nope.key')));
    expect(missing).toMatchObject({ argument: '--sequencer-key' });
    expect(missing.message).toMatch(/cannot read ".*nope\.key"/);
    expect(refusal(() => loadSequencerKey(file('empty.key', '\n'))).message).toMatch(/empty\.key": contains no key/);
    const short = refusal(() => loadSequencerKey(file('short.key', 'abcdef\n')));
    expect(short.message).toBe(
      `invalid --sequencer-key: ${JSON.stringify(join(dir.path, 'short.key'))}: line 1: a secret of 3 bytes is too short; at least 32 random bytes (openssl rand -hex 32)`,
    );
    expect(refusal(() => loadSequencerKey(file('x.key', 'x'), { argument: 'keyFile' })).argument).toBe('keyFile');
  });
});

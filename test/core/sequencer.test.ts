import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { InvalidArgumentError } from '../../src/core/errors.js';
import { formatSequencer, MAX_TOKEN, parseSequencer, toToken } from '../../src/core/token.js';
import { MAX_KEY_BYTES } from '../../src/core/validate.js';

const keyArb = fc
  .string({ unit: 'grapheme', minLength: 1, maxLength: 200 })
  .filter((k) => !k.includes('\0') && new TextEncoder().encode(k).length <= MAX_KEY_BYTES);
const tokenArb = fc.bigInt({ min: 1n, max: MAX_TOKEN });

describe('sequencer', () => {
  it('round-trips any key, mode and token', () => {
    fc.assert(
      fc.property(keyArb, fc.constantFrom('exclusive' as const, 'shared' as const), tokenArb, (key, mode, token) => {
        const s = formatSequencer(key, mode, token);
        expect(parseSequencer(s)).toEqual({ version: 1, key, mode, token });
        expect(toToken(s)).toBe(token);
      }),
    );
  });

  it('is printable ASCII made of HTTP token characters (safe in a header)', () => {
    fc.assert(
      fc.property(keyArb, tokenArb, (key, token) => {
        expect(formatSequencer(key, 'exclusive', token)).toMatch(/^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/);
      }),
    );
  });

  it('is never mistaken for a decimal token, and a decimal token is never read as a sequencer', () => {
    fc.assert(
      fc.property(keyArb, tokenArb, (key, token) => {
        expect(formatSequencer(key, 'shared', token)).not.toMatch(/^[0-9]/);
        expect(toToken(token.toString())).toBe(token);
      }),
    );
  });

  it('garbage gets InvalidArgumentError, never a crash or a wrong answer', () => {
    fc.assert(
      fc.property(
        fc.oneof(
          fc.string({ maxLength: 300 }),
          fc.string({ maxLength: 300 }).map((t) => `lh1s.${t}`),
        ),
        (s) => {
          try {
            const parsed = parseSequencer(s);
            // anything accepted must be canonical: it formats back to itself (a signed one, to its unsigned fields)
            const unsigned = s.startsWith('lh1s.') ? `lh1.${s.slice(5, s.lastIndexOf('.'))}` : s;
            expect(formatSequencer(parsed.key, parsed.mode, parsed.token)).toBe(unsigned);
          } catch (error) {
            expect(error).toBeInstanceOf(InvalidArgumentError);
          }
        },
      ),
      { numRuns: 2000 },
    );
    fc.assert(
      fc.property(fc.anything(), (v) => {
        try {
          toToken(v);
        } catch (error) {
          expect(error).toBeInstanceOf(InvalidArgumentError);
        }
      }),
    );
  });

  it('names the problem', () => {
    expect(() => parseSequencer('lh2.e.1.YQ')).toThrow(/version 2 is not supported/);
    expect(() => parseSequencer('lh1.x.1.YQ')).toThrow(/not a leasehold sequencer/);
    expect(() => parseSequencer('lh1.e.0.YQ')).toThrow(InvalidArgumentError);
    expect(() => parseSequencer(`lh1.e.${MAX_TOKEN + 1n}.YQ`)).toThrow(/outside/);
    expect(() => parseSequencer('lh1.e.1.YR')).toThrow(/base64url/); // non-canonical encoding of "a"
    expect(() => parseSequencer('lh1.e.1.gA')).toThrow(/UTF-8/); // a lone continuation byte
    expect(() => parseSequencer('x'.repeat(5000))).toThrow(/not a sequencer/);
    // the signed form (lh1s.): its signature is read, not checked, here
    const mac = 'A'.repeat(43);
    expect(parseSequencer(`lh1s.s.9.YQ.${mac}`)).toEqual({ version: 1, key: 'a', mode: 'shared', token: 9n });
    expect(toToken(`lh1s.e.9.YQ.${'A'.repeat(86)}`)).toBe(9n);
    expect(() => parseSequencer('lh1s.e.9.YQ')).toThrow(/not a well-formed signed sequencer/);
    expect(() => parseSequencer(`lh1s.e.9.YQ.${mac}A`)).toThrow(/not a well-formed signed sequencer/); // 44 characters: neither HMAC nor Ed25519
    expect(() => parseSequencer(`lh1s.e.9.YQ.${'A'.repeat(42)}B`)).toThrow(/signature part is not canonical/);
    expect(() => parseSequencer(`lh1s.e.9.YR.${mac}`)).toThrow(/base64url/);
    expect(() => parseSequencer(`lh2s.e.9.YQ.${mac}`)).toThrow(/version 2 is not supported/);
    expect(() => parseSequencer(`lh1.e.9.YQ.${mac}`)).toThrow(/not a leasehold sequencer/);
    expect(() => toToken('0')).toThrow(InvalidArgumentError);
    expect(() => toToken('007')).toThrow(InvalidArgumentError);
    expect(() => toToken(7)).toThrow(/expected a bigint/);
  });
});

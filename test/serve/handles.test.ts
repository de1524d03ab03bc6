/**
 * The lock service's handles (src/serve/handles.ts): a lease handle carries every field of the grant
 * and reads back exactly; anything that is not one of ours is refused as malformed (naming the
 * field); the owner is derived from the caller and the seed (another caller, another owner); a
 * session handle verifies only for the caller it was made for.
 */
import { describe, expect, it } from 'vitest';
import { InvalidArgumentError } from '../../src/core/errors.js';
import { ANONYMOUS, type Caller } from '../../src/serve/index.js';
import {
  decodeLeaseHandle,
  decodeSessionHandle,
  deriveOwner,
  encodeLeaseHandle,
  encodeSessionHandle,
  type LeaseHandle,
  ownerSeed,
} from '../../src/serve/handles.js';

const lease: LeaseHandle = {
  key: 'tenant/42 — ключ 🔑',
  token: (1n << 62n) + 5n,
  mode: 'shared',
  limit: 10_000,
  lockDelayMs: 2_147_483_647,
  ttlMs: 30_000,
  label: 'svc-a:web-3',
  session: '7f1c0a3e-1d2b-4e5f-9a8b-0c1d2e3f4a5b',
  minHold: { grantedAt: 1_764_000_000_000, minHoldMs: 300_000 },
  seed: ownerSeed(),
};

const callerA: Caller = { name: 'svc-a', prefixes: [''], secret: Buffer.alloc(32, 1) };
const callerB: Caller = { name: 'svc-b', prefixes: [''], secret: Buffer.alloc(32, 2) };

describe('lease handles', () => {
  it('read back every field, with and without the optional ones', () => {
    const plain: LeaseHandle = { ...lease, mode: 'exclusive', limit: undefined, session: undefined, minHold: undefined, key: 'k' };
    for (const h of [lease, plain, { ...lease, key: '😀'.repeat(256), label: 'x'.repeat(200) }]) {
      const text = encodeLeaseHandle(h);
      expect(text).toMatch(/^lhl1\.[A-Za-z0-9_-]+$/);
      expect(text.length).toBeLessThan(2_000);
      const back = decodeLeaseHandle(text);
      expect({ ...back, seed: Buffer.from(back.seed) }).toEqual({ ...h, seed: Buffer.from(h.seed) });
    }
  });

  it('anything else is malformed: InvalidArgumentError naming the field', () => {
    const good = encodeLeaseHandle(lease);
    const bad = [
      '',
      'lhl1.',
      'lhl2.AAAA',
      good.replace('lhl1.', 'lhs1.'),
      `${good}=`,
      `${good}AA`, // trailing bytes
      good.slice(0, -6), // ends early
      `lhl1.${Buffer.from([0x80]).toString('base64url')}`, // an unknown flag
      `lhl1.${'A'.repeat(5_000)}`,
    ];
    for (const text of bad) {
      expect(() => decodeLeaseHandle(text), JSON.stringify(text.slice(0, 30))).toThrow(InvalidArgumentError);
      try {
        decodeLeaseHandle(text, 'lease');
      } catch (error) {
        expect((error as InvalidArgumentError).argument).toBe('lease');
      }
    }
  });

  it('the owner is derived from the caller and the seed; an Idempotency-Key gives the same seed each time', () => {
    const seed = ownerSeed();
    expect(deriveOwner('svc-a', seed)).toBe(deriveOwner('svc-a', seed));
    expect(deriveOwner('svc-a', seed)).not.toBe(deriveOwner('svc-b', seed));
    expect(deriveOwner('svc-a', seed)).toMatch(/^http:[A-Za-z0-9_-]{43}$/);
    expect(Buffer.from(ownerSeed('retry-1'))).toEqual(Buffer.from(ownerSeed('retry-1')));
    expect(Buffer.from(ownerSeed())).not.toEqual(Buffer.from(ownerSeed()));
    expect(ownerSeed()).toHaveLength(16);
  });
});

describe('session handles', () => {
  it('verify for their caller only: another caller (or a forged MAC) reads as an unknown session', () => {
    const text = encodeSessionHandle({ id: 'sess-1', ttlMs: 7_000 }, callerA);
    expect(decodeSessionHandle(text, callerA)).toEqual({ id: 'sess-1', ttlMs: 7_000 });
    expect(decodeSessionHandle(text, callerB)).toBeUndefined();
    expect(decodeSessionHandle(text, { ...callerA, name: 'svc-b' })).toBeUndefined();
    const [, record, mac] = text.split('.') as [string, string, string];
    const flipped = `${mac.startsWith('A') ? 'B' : 'A'}${mac.slice(1)}`;
    expect(decodeSessionHandle(`lhs1.${record}.${flipped}`, callerA)).toBeUndefined();
    // The anonymous caller's handles verify (a server without --auth has one caller).
    expect(decodeSessionHandle(encodeSessionHandle({ id: 'x', ttlMs: 10 }, ANONYMOUS), ANONYMOUS)).toEqual({ id: 'x', ttlMs: 10 });
  });

  it('anything that is not a session handle is malformed, naming the field', () => {
    for (const text of ['', 'lhs1.', 'lhs1.AAAA', 'lhs1.AAAA.BBBB', 'lhs1.AAAAAAA.AAAAAAAAAAAAAAAAAAAAAA.x', 'lhl1.AAAA.BBBB']) {
      expect(() => decodeSessionHandle(text, callerA), text).toThrow(InvalidArgumentError);
    }
  });
});

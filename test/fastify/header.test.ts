/** The Idempotency-Key header as the draft writes it (an sf-string) and as clients send it bare. */
import { describe, expect, it } from 'vitest';
import { MAX_IDEMPOTENCY_KEY_LENGTH, parseIdempotencyKey } from '../../src/fastify/index.js';

describe('parseIdempotencyKey', () => {
  it('reads a Structured Field String and a bare key alike', () => {
    expect(parseIdempotencyKey('"8e03978e-40d5-43e8-bc93-6894a57f9324"')).toEqual({ kind: 'key', key: '8e03978e-40d5-43e8-bc93-6894a57f9324' });
    expect(parseIdempotencyKey('8e03978e-40d5-43e8-bc93-6894a57f9324')).toEqual({ kind: 'key', key: '8e03978e-40d5-43e8-bc93-6894a57f9324' });
    expect(parseIdempotencyKey('  "a b \\"c\\" \\\\"  ')).toEqual({ kind: 'key', key: 'a b "c" \\' });
    expect(parseIdempotencyKey(['k1'])).toEqual({ kind: 'key', key: 'k1' });
  });

  it('tells a missing header from one that is not a key', () => {
    expect(parseIdempotencyKey(undefined)).toEqual({ kind: 'missing' });
    for (const bad of ['', '""', '"open', '"a"b', '"a";p=1', '"\\x"', 'a b', 'a"b', 'a\\b', 'é', '"é"', 'x'.repeat(MAX_IDEMPOTENCY_KEY_LENGTH + 1)]) {
      expect(parseIdempotencyKey(bad), bad).toMatchObject({ kind: 'invalid' });
    }
    expect(parseIdempotencyKey(['a', 'b'])).toMatchObject({ kind: 'invalid', reason: expect.stringContaining('more than once') });
    expect(parseIdempotencyKey('x'.repeat(MAX_IDEMPOTENCY_KEY_LENGTH))).toMatchObject({ kind: 'key' });
  });
});

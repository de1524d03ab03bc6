import { describe, expect, it } from 'vitest';
import { formatDuration, parseDuration } from '../../src/util/duration.js';
import { InvalidArgumentError } from '../../src/index.js';

describe('parseDuration', () => {
  it.each([
    ['500ms', 500],
    ['10s', 10_000],
    ['2m', 120_000],
    ['1h', 3_600_000],
    ['1.2s', 1_200],
    ['.5s', 500],
    ['30', 30_000],
    ['0', 0],
    ['0ms', 0],
    ['1.5ms', 2],
    ['596h', 596 * 3_600_000],
  ])('%s is %d ms', (text, ms) => {
    expect(parseDuration(text)).toBe(ms);
  });

  it.each(['', ' 1s', '1s ', '-1s', '-0', '1e3', '1x', 's', '1.s', '1,5s', '10 s', '1S', '+1s', 'Infinity', 'NaN', '0x10', '1d', '1s2'])(
    'rejects %j',
    (text) => {
      expect(() => parseDuration(text, '--ttl')).toThrow(InvalidArgumentError);
    },
  );

  it('names the option and says what it expects', () => {
    expect(() => parseDuration('soon', '--pause')).toThrow(/--pause.*like 500ms, 10s/);
    expect(() => parseDuration('-5s', '--wait')).toThrow(/--wait.*negative/);
  });

  it('rejects what a timer cannot express (overflow)', () => {
    expect(parseDuration('596h')).toBeLessThanOrEqual(2_147_483_647);
    expect(() => parseDuration('597h')).toThrow(/too long/);
    expect(() => parseDuration('9'.repeat(400))).toThrow(/too long/);
  });

  it('accepts forever only when asked to', () => {
    expect(parseDuration('forever', '--wait', { allowForever: true })).toBe(Infinity);
    expect(() => parseDuration('forever', '--ttl')).toThrow(InvalidArgumentError);
  });

  it('rejects non-strings', () => {
    expect(() => parseDuration(5 as unknown as string)).toThrow(InvalidArgumentError);
  });
});

describe('formatDuration', () => {
  it.each([
    [0, '0ms'],
    [350, '350ms'],
    [1_000, '1s'],
    [1_200, '1.2s'],
    [45_000, '45s'],
    [125_000, '2m05s'],
    [3 * 3_600_000 + 7 * 60_000, '3h07m'],
    [Infinity, 'forever'],
  ])('%d ms is %s', (ms, text) => {
    expect(formatDuration(ms)).toBe(text);
  });

  it('round-trips through parseDuration for the values the CLI prints by default', () => {
    for (const text of ['30s', '10s', '1s', '1.2s', '500ms']) expect(formatDuration(parseDuration(text))).toBe(text);
  });
});

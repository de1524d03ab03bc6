import { InvalidArgumentError } from './errors.js';
import { checkKey, checkMode, describe, type LockMode } from './validate.js';

/** Tokens live in [1, 2^63): they fit PostgreSQL `bigint`, SQLite `INTEGER` and Redis integers. */
export const MIN_TOKEN = 1n;
export const MAX_TOKEN = (1n << 63n) - 1n;

/** What a fence accepts as a token: the bigint itself, its decimal string, or a lease's sequencer. */
export type TokenInput = bigint | string;

export function checkToken(value: unknown, argument = 'token'): bigint {
  if (typeof value !== 'bigint') throw new InvalidArgumentError(argument, `expected a bigint, got ${describe(value)}`);
  if (value < MIN_TOKEN || value > MAX_TOKEN) throw new InvalidArgumentError(argument, `${value} is outside [1, 2^63)`);
  return value;
}

const DECIMAL = /^[1-9][0-9]{0,18}$/;

/** Reads a token from a bigint, a decimal string or a sequencer string. */
export function toToken(value: unknown, argument = 'token'): bigint {
  if (typeof value === 'bigint') return checkToken(value, argument);
  if (typeof value === 'string') {
    if (DECIMAL.test(value)) return checkToken(BigInt(value), argument);
    if (value.startsWith(SEQUENCER_PREFIX)) return parseSequencer(value, argument).token;
    throw new InvalidArgumentError(argument, `expected a decimal token or a sequencer, got ${describe(value)}`);
  }
  throw new InvalidArgumentError(argument, `expected a bigint, a decimal string or a sequencer, got ${describe(value)}`);
}

/**
 * A sequencer names a grant: `lh1.<e|s>.<token>.<base64url(key)>`. Versioned (`lh1`), printable
 * ASCII made only of HTTP token characters (safe in a header), the key encoded so that any key
 * round-trips. It starts with a letter, so it can never be mistaken for a decimal token.
 */
export interface Sequencer {
  readonly version: 1;
  readonly key: string;
  readonly mode: LockMode;
  readonly token: bigint;
}

const SEQUENCER_PREFIX = 'lh';
const SEQUENCER_V1 = /^lh1\.([es])\.([1-9][0-9]{0,18})\.([A-Za-z0-9_-]+)$/;
/** A sequencer of the longest key is about 1.4 KB; anything far longer is garbage. */
const MAX_SEQUENCER_LENGTH = 2048;
const utf8Strict = new TextDecoder('utf-8', { fatal: true });

export function formatSequencer(key: string, mode: LockMode, token: bigint): string {
  checkKey(key);
  checkMode(mode);
  checkToken(token);
  const encoded = Buffer.from(key, 'utf8').toString('base64url');
  return `lh1.${mode === 'exclusive' ? 'e' : 's'}.${token}.${encoded}`;
}

export function parseSequencer(value: unknown, argument = 'sequencer'): Sequencer {
  if (typeof value !== 'string') throw new InvalidArgumentError(argument, `expected a sequencer string, got ${describe(value)}`);
  if (value.length > MAX_SEQUENCER_LENGTH) throw new InvalidArgumentError(argument, `is ${value.length} characters long; not a sequencer`);
  const m = SEQUENCER_V1.exec(value);
  if (!m) {
    if (/^lh[0-9]+\./.test(value) && !value.startsWith('lh1.')) {
      throw new InvalidArgumentError(argument, `sequencer version ${value.slice(2, value.indexOf('.'))} is not supported (this version reads lh1)`);
    }
    throw new InvalidArgumentError(argument, `not a leasehold sequencer (expected lh1.<e|s>.<token>.<key>): ${describe(value)}`);
  }
  const [, modeChar, tokenText, encodedKey] = m as unknown as [string, string, string, string];
  const token = checkToken(BigInt(tokenText), argument);
  let key: string;
  try {
    const bytes = Buffer.from(encodedKey, 'base64url');
    // Canonical encoding only: a sequencer that does not re-encode to itself was not made by us.
    if (bytes.toString('base64url') !== encodedKey) throw new Error('non-canonical base64url');
    key = utf8Strict.decode(bytes);
  } catch (cause) {
    throw new InvalidArgumentError(argument, 'its key part is not valid base64url-encoded UTF-8', { cause });
  }
  checkKey(key, `${argument} key`);
  return Object.freeze({ version: 1, key, mode: modeChar === 'e' ? 'exclusive' : 'shared', token });
}

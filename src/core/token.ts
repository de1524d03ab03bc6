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
 *
 * A lock service started with a sequencer key signs its sequencers:
 * `lh1s.<e|s>.<token>.<base64url(key)>.<base64url(signature)>` (see sequencer-sign.ts). The
 * distinct tag means a parser that knows only `lh1.` refuses a signed sequencer outright instead of
 * misreading it; this one reads both forms and ignores the signature, which only
 * `verifySequencer` (or a fence given a `sequencerKey`) checks.
 */
export interface Sequencer {
  readonly version: 1;
  readonly key: string;
  readonly mode: LockMode;
  readonly token: bigint;
}

/** A sequencer as read, with the parts a signature covers (for sequencer-sign.ts). */
export interface SequencerParts {
  readonly sequencer: Sequencer;
  /** The unsigned fields `<e|s>.<token>.<base64url(key)>`, exactly as written. */
  readonly fields: string;
  /** The signature's base64url text, or undefined for an unsigned (`lh1.`) sequencer. */
  readonly signature: string | undefined;
}

const SEQUENCER_PREFIX = 'lh';
const FIELDS = '([es])\\.([1-9][0-9]{0,18})\\.([A-Za-z0-9_-]+)';
const SEQUENCER_V1 = new RegExp(`^lh1\\.${FIELDS}$`);
/**
 * The signed form: an HMAC-SHA-256 (32 bytes, 43 characters) or an Ed25519 signature (64 bytes,
 * 86 characters). The form does not say which: the verifier's key decides the algorithm, so a
 * sequencer cannot talk a verifier into a weaker check (JWT's `alg: none`).
 */
const SEQUENCER_V1_SIGNED = new RegExp(`^lh1s\\.${FIELDS}\\.([A-Za-z0-9_-]{43}|[A-Za-z0-9_-]{86})$`);
/** A sequencer of the longest key is about 1.4 KB, 1.5 KB signed; anything far longer is garbage. */
const MAX_SEQUENCER_LENGTH = 2048;
const utf8Strict = new TextDecoder('utf-8', { fatal: true });

export function formatSequencer(key: string, mode: LockMode, token: bigint): string {
  checkKey(key);
  checkMode(mode);
  checkToken(token);
  const encoded = Buffer.from(key, 'utf8').toString('base64url');
  return `lh1.${mode === 'exclusive' ? 'e' : 's'}.${token}.${encoded}`;
}

/** Reads a sequencer, signed (`lh1s.`) or not (`lh1.`); the signature is not checked here. */
export function parseSequencer(value: unknown, argument = 'sequencer'): Sequencer {
  return readSequencer(value, argument).sequencer;
}

/** parseSequencer, also returning the signed fields and the signature (unchecked). */
export function readSequencer(value: unknown, argument = 'sequencer'): SequencerParts {
  if (typeof value !== 'string') throw new InvalidArgumentError(argument, `expected a sequencer string, got ${describe(value)}`);
  if (value.length > MAX_SEQUENCER_LENGTH) throw new InvalidArgumentError(argument, `is ${value.length} characters long; not a sequencer`);
  const m = SEQUENCER_V1.exec(value) ?? SEQUENCER_V1_SIGNED.exec(value);
  if (!m) {
    const version = /^lh([0-9]+)s?\./.exec(value);
    if (version && version[1] !== '1') {
      throw new InvalidArgumentError(argument, `sequencer version ${version[1]} is not supported (this version reads lh1 and lh1s)`);
    }
    if (value.startsWith('lh1s.')) {
      throw new InvalidArgumentError(argument, `not a well-formed signed sequencer (expected lh1s.<e|s>.<token>.<key>.<signature>): ${describe(value)}`);
    }
    throw new InvalidArgumentError(argument, `not a leasehold sequencer (expected lh1.<e|s>.<token>.<key>): ${describe(value)}`);
  }
  const [, modeChar, tokenText, encodedKey, signature] = m as unknown as [string, string, string, string, string | undefined];
  const token = checkToken(BigInt(tokenText), argument);
  let key: string;
  try {
    key = utf8Strict.decode(canonicalBase64url(encodedKey));
  } catch (cause) {
    throw new InvalidArgumentError(argument, 'its key part is not valid base64url-encoded UTF-8', { cause });
  }
  checkKey(key, `${argument} key`);
  if (signature !== undefined) {
    try {
      canonicalBase64url(signature);
    } catch (cause) {
      throw new InvalidArgumentError(argument, 'its signature part is not canonical base64url', { cause });
    }
  }
  const sequencer: Sequencer = Object.freeze({ version: 1, key, mode: modeChar === 'e' ? 'exclusive' : 'shared', token });
  return Object.freeze({ sequencer, fields: `${modeChar}.${tokenText}.${encodedKey}`, signature });
}

/** Decodes base64url, refusing any text that does not re-encode to itself: a sequencer not made by us. */
function canonicalBase64url(text: string): Buffer {
  const bytes = Buffer.from(text, 'base64url');
  if (bytes.toString('base64url') !== text) throw new Error('non-canonical base64url');
  return bytes;
}

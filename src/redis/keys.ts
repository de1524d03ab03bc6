import { InvalidArgumentError } from '../core/errors.js';
import { describe } from '../core/validate.js';

/**
 * Lock keys carry the user's key inside a hash tag, `{…}`, so every key of one lock lands in one
 * Redis Cluster slot. `}` and `%` are percent-encoded so the tag always ends where we put it;
 * the mapping is character-wise, so a prefix of the key encodes to a prefix of its encoding.
 */
export function encodeKey(key: string): string {
  if (!key.includes('%') && !key.includes('}')) return key;
  return key.replace(/[%}]/g, (c) => (c === '%' ? '%25' : '%7D'));
}

export function decodeKey(encoded: string): string {
  return encoded.replace(/%25|%7D/g, (m) => (m === '%25' ? '%' : '}'));
}

/** The lock key of `key` under `prefix`: `<prefix>{<encoded key>}`; the other keys of the lock are named after it. */
export function lockKeyOf(prefix: string, key: string): string {
  return `${prefix}{${encodeKey(key)}}`;
}

/** The user's key back from a lock key under `prefix` (the inverse of {@link lockKeyOf}). */
export function keyOfLock(prefix: string, lockKey: string): string {
  return decodeKey(lockKey.slice(prefix.length + 1, -1));
}

/** The SCAN MATCH pattern of the lock keys (and their companions) of keys starting with `keyPrefix`. */
export function lockPattern(prefix: string, keyPrefix: string): string {
  return `${globEscape(prefix)}{${globEscape(encodeKey(keyPrefix))}*`;
}

/** Escapes a literal for a SCAN MATCH glob. */
export function globEscape(literal: string): string {
  return literal.replace(/[*?[\]\\]/g, '\\$&');
}

/** A key prefix: printable, at most 100 characters, without `{` or `}` (they would move the hash tag). */
export function checkKeyPrefix(value: unknown, argument: string): string {
  if (typeof value !== 'string' || value.length > 100 || /[{}\x00-\x1f\x7f]/.test(value)) {
    throw new InvalidArgumentError(argument, `expected up to 100 printable characters without { or }, got ${describe(value)}`);
  }
  return value;
}

import { MAX_TIMER_MS, type Clock } from './clock.js';
import { InvalidArgumentError } from './errors.js';

/** Longest key, in UTF-8 bytes. Long enough for any composite name, short enough for every backend's key limits. */
export const MAX_KEY_BYTES = 1024;
/** Shortest ttl: below this, renewal at ttl/3 would be a few milliseconds and the drift margin would swallow it. */
export const MIN_TTL_MS = 10;
/** Longest ttl or wait that a timer can express (about 24.8 days). */
export const MAX_DURATION_MS = MAX_TIMER_MS;

export type LockMode = 'exclusive' | 'shared';
export const LOCK_MODES: readonly LockMode[] = Object.freeze(['exclusive', 'shared']);

const utf8 = new TextEncoder();

export function checkKey(value: unknown, argument = 'key'): string {
  if (typeof value !== 'string') throw new InvalidArgumentError(argument, `expected a string, got ${describe(value)}`);
  if (value.length === 0) throw new InvalidArgumentError(argument, 'must not be empty');
  if (!value.isWellFormed()) throw new InvalidArgumentError(argument, 'contains a lone surrogate (not valid Unicode)');
  if (value.includes('\0')) throw new InvalidArgumentError(argument, 'must not contain NUL characters');
  // UTF-8 takes at most 3 bytes per UTF-16 code unit, so only long keys need counting (encoding allocates).
  if (value.length * 3 > MAX_KEY_BYTES) {
    const bytes = utf8.encode(value).length;
    if (bytes > MAX_KEY_BYTES) throw new InvalidArgumentError(argument, `is ${bytes} bytes long; at most ${MAX_KEY_BYTES} bytes`);
  }
  return value;
}

/** A prefix for listing: like a key but may be empty. */
export function checkPrefix(value: unknown, argument = 'prefix'): string {
  if (value === undefined || value === '') return '';
  return checkKey(value, argument);
}

export function checkInteger(value: unknown, argument: string, min: number, max: number): number {
  if (typeof value !== 'number' || !Number.isInteger(value)) {
    throw new InvalidArgumentError(argument, `expected an integer number of milliseconds, got ${describe(value)}`);
  }
  if (value < min || value > max) throw new InvalidArgumentError(argument, `${value} is out of range [${min}, ${max}]`);
  return value;
}

export function checkTtl(value: unknown, argument = 'ttlMs'): number {
  return checkInteger(value, argument, MIN_TTL_MS, MAX_DURATION_MS);
}

/** A wait: a non-negative integer or Infinity. */
export function checkWait(value: unknown, argument = 'waitMs'): number {
  if (value === Infinity) return Infinity;
  return checkInteger(value, argument, 0, MAX_DURATION_MS);
}

export function checkMode(value: unknown, argument = 'mode'): LockMode {
  if (value === 'exclusive' || value === 'shared') return value;
  throw new InvalidArgumentError(argument, `expected 'exclusive' or 'shared', got ${describe(value)}`);
}

export function checkBoolean(value: unknown, argument: string): boolean {
  if (typeof value !== 'boolean') throw new InvalidArgumentError(argument, `expected a boolean, got ${describe(value)}`);
  return value;
}

export function checkSignal(value: unknown, argument = 'signal'): AbortSignal {
  if (
    typeof value !== 'object' ||
    value === null ||
    typeof (value as AbortSignal).aborted !== 'boolean' ||
    typeof (value as AbortSignal).addEventListener !== 'function'
  ) {
    throw new InvalidArgumentError(argument, `expected an AbortSignal, got ${describe(value)}`);
  }
  return value as AbortSignal;
}

export function checkClock(value: unknown, argument = 'clock'): Clock {
  const c = value as Clock;
  if (typeof c !== 'object' || c === null || typeof c.now !== 'function' || typeof c.setTimeout !== 'function' || typeof c.clearTimeout !== 'function') {
    throw new InvalidArgumentError(argument, 'expected { now(), setTimeout(fn, ms), clearTimeout(handle) }');
  }
  return c;
}

export function checkObject(value: unknown, argument: string): Record<string, unknown> {
  if (value === undefined) return {};
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw new InvalidArgumentError(argument, `expected an options object, got ${describe(value)}`);
  }
  return value as Record<string, unknown>;
}

/** Rejects options the function does not know: a typo (`ttl` for `ttlMs`) should not be silently ignored. */
export function checkKnownOptions(options: Record<string, unknown>, known: readonly string[], argument: string): void {
  for (const name of Object.keys(options)) {
    if (!known.includes(name)) {
      throw new InvalidArgumentError(`${argument}.${name}`, `unknown option; expected one of ${known.join(', ')}`);
    }
  }
}

export function describe(value: unknown): string {
  if (value === null) return 'null';
  if (typeof value === 'string') return value.length > 40 ? `a string of length ${value.length}` : JSON.stringify(value);
  if (typeof value === 'number' || typeof value === 'boolean') return String(value);
  if (typeof value === 'bigint') return `${value}n`;
  if (Array.isArray(value)) return 'an array';
  return typeof value === 'object' ? 'an object' : typeof value;
}

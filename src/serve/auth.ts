/**
 * Who is calling (docs/http-api.md, "Security"). With `--auth FILE` every request carries
 * `Authorization: Bearer <token>`, and the file lists the callers:
 *
 *   { "callers": [ { "name": "svc-a", "tokenSha256": "<hex SHA-256 of the token>", "prefixes": ["tenant-a/"] } ] }
 *
 * The server keeps only the hashes: a presented token is hashed and compared with every caller's
 * hash in constant time (no early exit, so the time taken says nothing about which caller, or how
 * much of a hash, matched). Without `--auth` every request is the caller `anonymous`, prefix "".
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { InvalidArgumentError } from '../core/errors.js';
import { checkLabel } from '../core/options.js';
import { checkKey, checkKnownOptions, checkObject, describe } from '../core/validate.js';

/** One caller: its name (the default label of its grants), its key prefixes, its secret. */
export interface Caller {
  readonly name: string;
  /** Keys it may use start with one of these ("" is every key). */
  readonly prefixes: readonly string[];
  /** The raw SHA-256 of its bearer token: the key of its session handles' MACs (see handles.ts). */
  readonly secret: Uint8Array;
}

/** The parsed `--auth` file. */
export interface AuthConfig {
  readonly callers: readonly Caller[];
}

/** Every request to a server without `--auth`. */
export const ANONYMOUS: Caller = Object.freeze({
  name: 'anonymous',
  prefixes: Object.freeze(['']),
  // Not a secret: without --auth there is one caller, so session handles need no binding between callers.
  secret: createHash('sha256').update('leasehold anonymous caller', 'utf8').digest(),
});

/** Most callers one file may list (each request compares against all of them). */
const MAX_CALLERS = 10_000;
/** Most prefixes per caller. */
const MAX_PREFIXES = 1_000;
const HEX_SHA256 = /^[0-9a-f]{64}$/;
/** Longest bearer token read (longer ones are unknown without hashing megabytes). */
const MAX_TOKEN_LENGTH = 4096;

/** Reads and checks an `--auth` file; `InvalidArgumentError` naming the file and the field at fault. */
export function loadAuthFile(path: string): AuthConfig {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (cause) {
    throw new InvalidArgumentError('--auth', `cannot read ${JSON.stringify(path)}: ${(cause as Error).message}`, { cause });
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (cause) {
    throw new InvalidArgumentError('--auth', `${JSON.stringify(path)} is not JSON: ${(cause as Error).message}`, { cause });
  }
  return parseAuthConfig(json);
}

/** Checks the auth file's content (format fixed by issue 19); unknown fields are refused, as everywhere. */
export function parseAuthConfig(value: unknown): AuthConfig {
  const root = checkObject(value, 'auth');
  checkKnownOptions(root, ['callers'], 'auth');
  if (!Array.isArray(root.callers) || root.callers.length === 0 || root.callers.length > MAX_CALLERS)
    throw new InvalidArgumentError('auth.callers', `expected an array of 1 to ${MAX_CALLERS} callers, got ${describe(root.callers)}`);
  const names = new Set<string>();
  const hashes = new Set<string>();
  const callers = root.callers.map((entry: unknown, i: number): Caller => {
    const at = `auth.callers[${i}]`;
    if (entry === undefined) throw new InvalidArgumentError(at, 'expected an object');
    const c = checkObject(entry, at);
    checkKnownOptions(c, ['name', 'tokenSha256', 'prefixes'], at);
    const name = checkLabel(c.name, `${at}.name`);
    if (names.has(name)) throw new InvalidArgumentError(`${at}.name`, `${JSON.stringify(name)} is listed twice`);
    names.add(name);
    if (typeof c.tokenSha256 !== 'string' || !HEX_SHA256.test(c.tokenSha256.toLowerCase()))
      throw new InvalidArgumentError(`${at}.tokenSha256`, 'expected 64 hex digits (printf %s "$TOKEN" | sha256sum)');
    const hash = c.tokenSha256.toLowerCase();
    if (hashes.has(hash)) throw new InvalidArgumentError(`${at}.tokenSha256`, 'the same token is listed for two callers');
    hashes.add(hash);
    if (!Array.isArray(c.prefixes) || c.prefixes.length === 0 || c.prefixes.length > MAX_PREFIXES)
      throw new InvalidArgumentError(`${at}.prefixes`, `expected an array of 1 to ${MAX_PREFIXES} key prefixes ("" is every key), got ${describe(c.prefixes)}`);
    const prefixes = c.prefixes.map((p: unknown, j: number) => (p === '' ? '' : checkKey(p, `${at}.prefixes[${j}]`)));
    return Object.freeze({ name, prefixes: Object.freeze(prefixes), secret: Buffer.from(hash, 'hex') });
  });
  return Object.freeze({ callers: Object.freeze(callers) });
}

/**
 * The caller of a request: `ANONYMOUS` without auth; with auth, the caller whose hash matches the
 * bearer token, or undefined (a 401) for a missing, malformed or unknown one.
 */
export function authenticate(auth: AuthConfig | undefined, authorization: string | undefined): Caller | undefined {
  if (!auth) return ANONYMOUS;
  const m = typeof authorization === 'string' ? /^Bearer +([\x21-\x7e]+) *$/i.exec(authorization) : null;
  if (!m || m[1]!.length > MAX_TOKEN_LENGTH) return undefined;
  const presented = createHash('sha256').update(m[1]!, 'utf8').digest();
  let found: Caller | undefined;
  // Every hash is compared, whatever matched before: constant time in which caller it is.
  for (const caller of auth.callers) {
    if (timingSafeEqual(presented, caller.secret) && !found) found = caller;
  }
  return found;
}

/** True when `key` starts with one of the caller's prefixes. */
export function mayUse(caller: Caller, key: string): boolean {
  return caller.prefixes.some((p) => key.startsWith(p));
}

/**
 * The prefixes to list for a request's `prefix`: the request's own when it lies inside one of the
 * caller's prefixes; else each of the caller's prefixes that lies inside the request's (a listing of
 * "" by a caller of "a/" and "b/" lists both); none (a 403) when they do not overlap.
 */
export function listingPrefixes(caller: Caller, prefix: string): string[] {
  if (mayUse(caller, prefix)) return [prefix];
  return caller.prefixes.filter((p) => p.startsWith(prefix));
}

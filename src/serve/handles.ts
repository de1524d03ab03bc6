/**
 * The handles the lock service gives its clients instead of keeping state (docs/http-api.md,
 * "Handles"): everything a later renew, release or keep-alive needs travels in the handle, so any
 * server over the same backend serves it, after a restart too.
 *
 * - A lease handle (`lhl1.` + base64url of a small binary record) carries the grant's key, token,
 *   mode, limit, lock-delay, ttl, label, session, min-hold, and a random owner seed. The backend owner
 *   id is derived from the seed and the caller's name (never stored, never sent), so the handle of
 *   another caller derives another owner: the backend answers it as it answers an unknown lease.
 *   Tampering gains nothing for the same reason (a changed seed or key is another, unknown owner).
 * - A session handle (`lhs1.<record>.<mac>`) carries the backend's session id and ttl, with an
 *   HMAC-SHA-256 keyed by the caller's secret (the SHA-256 of its bearer token, which only the
 *   servers' auth file and the caller can know): backend session ids can be guessable (etcd lease
 *   ids are), so the caller binding cannot rest on their secrecy. A handle whose MAC does not verify
 *   for this caller is answered as an unknown session.
 *
 * A string that is not a handle at all (wrong prefix, bad base64url, a record that does not parse
 * exactly) is malformed: `InvalidArgumentError` naming the field. A well-formed handle is never
 * refused as malformed because of whose it is.
 */
import { createHash, createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import { InvalidArgumentError } from '../core/errors.js';
import { checkLabel, MAX_LIMIT } from '../core/options.js';
import { checkToken } from '../core/token.js';
import { checkKey, MAX_DURATION_MS, MIN_TTL_MS, type LockMode } from '../core/validate.js';

const LEASE_PREFIX = 'lhl1.';
const SESSION_PREFIX = 'lhs1.';
/** Random owner seed: 128 bits (docs/http-api.md). */
const SEED_BYTES = 16;
/** A seed derived from an Idempotency-Key: a SHA-256. */
const DERIVED_SEED_BYTES = 32;
/** Longest session id a handle carries (the backends' ids are UUIDs or 64-bit integers). */
const MAX_SESSION_ID_BYTES = 256;
/** The MAC of a session handle, truncated to 128 bits (plenty against forgery, shorter URLs). */
const SESSION_MAC_BYTES = 16;
/** A handle longer than this is not one of ours (a key of 1,024 bytes makes about 1.8 KB). */
const MAX_HANDLE_LENGTH = 4096;

const FLAG_SHARED = 1;
const FLAG_LIMIT = 2;
const FLAG_SESSION = 4;
const FLAG_MIN_HOLD = 8;
const KNOWN_FLAGS = FLAG_SHARED | FLAG_LIMIT | FLAG_SESSION | FLAG_MIN_HOLD;

const utf8Strict = new TextDecoder('utf-8', { fatal: true });

/** What a lease handle carries. */
export interface LeaseHandle {
  readonly key: string;
  readonly token: bigint;
  readonly mode: LockMode;
  readonly limit: number | undefined;
  readonly lockDelayMs: number;
  /** The ttl the grant was made with (the default of a renew). */
  readonly ttlMs: number;
  /** The grant's public label (sent again with renewals, for backends that may re-record it). */
  readonly label: string;
  /** The backend session id the lease lives by, if any. */
  readonly session: string | undefined;
  /** With `minHoldMs`: the grant's time on the granting server's wall clock (ms since the epoch). */
  readonly minHold: { readonly grantedAt: number; readonly minHoldMs: number } | undefined;
  /** 16 random bytes, or the 32-byte SHA-256 of the acquire's Idempotency-Key. */
  readonly seed: Uint8Array;
}

/** What a session handle carries. */
export interface SessionHandle {
  readonly id: string;
  /** The ttl the session was opened with (the default of a keep-alive). */
  readonly ttlMs: number;
}

/** A fresh owner seed, or the one an Idempotency-Key stands for (a retry derives the same owner). */
export function ownerSeed(idempotencyKey?: string): Uint8Array {
  if (idempotencyKey === undefined) return randomBytes(SEED_BYTES);
  return createHash('sha256').update(idempotencyKey, 'utf8').digest();
}

/** The backend owner id of a lease over HTTP: `"http:" + base64url(SHA-256(callerName + "\n" + seed))`. */
export function deriveOwner(callerName: string, seed: Uint8Array): string {
  return `http:${createHash('sha256').update(`${callerName}\n`, 'utf8').update(seed).digest('base64url')}`;
}

export function encodeLeaseHandle(h: LeaseHandle): string {
  const key = Buffer.from(h.key, 'utf8');
  const label = Buffer.from(h.label, 'latin1');
  const session = h.session === undefined ? undefined : Buffer.from(h.session, 'utf8');
  const flags =
    (h.mode === 'shared' ? FLAG_SHARED : 0) | (h.limit !== undefined ? FLAG_LIMIT : 0) | (session ? FLAG_SESSION : 0) | (h.minHold ? FLAG_MIN_HOLD : 0);
  const w = new Writer();
  w.u8(flags);
  w.u8(h.seed.length);
  w.bytes(h.seed);
  w.u64(h.token);
  w.u32(h.ttlMs);
  w.u32(h.lockDelayMs);
  if (h.limit !== undefined) w.u16(h.limit);
  if (h.minHold) {
    w.u64(BigInt(h.minHold.grantedAt));
    w.u32(h.minHold.minHoldMs);
  }
  w.u16(key.length);
  w.bytes(key);
  w.u8(label.length);
  w.bytes(label);
  if (session) {
    w.u16(session.length);
    w.bytes(session);
  }
  return LEASE_PREFIX + w.done().toString('base64url');
}

/** Reads a lease handle; `InvalidArgumentError(field)` when it is not one. */
export function decodeLeaseHandle(value: string, field = 'lease'): LeaseHandle {
  const bytes = handleBytes(value, LEASE_PREFIX, field);
  const malformed = (): Error => new RangeError('a field of the record is out of range');
  try {
    const r = new Reader(bytes);
    const flags = r.u8();
    if ((flags & ~KNOWN_FLAGS) !== 0) throw malformed();
    const seedLength = r.u8();
    if (seedLength !== SEED_BYTES && seedLength !== DERIVED_SEED_BYTES) throw malformed();
    const seed = r.bytes(seedLength);
    const token = checkToken(r.u64(), field);
    const ttlMs = inRange(r.u32(), MIN_TTL_MS, MAX_DURATION_MS, malformed);
    const lockDelayMs = inRange(r.u32(), 0, MAX_DURATION_MS, malformed);
    const limit = flags & FLAG_LIMIT ? inRange(r.u16(), 1, MAX_LIMIT, malformed) : undefined;
    let minHold: LeaseHandle['minHold'];
    if (flags & FLAG_MIN_HOLD) {
      const grantedAt = Number(r.u64());
      minHold = { grantedAt: inRange(grantedAt, 0, Number.MAX_SAFE_INTEGER, malformed), minHoldMs: inRange(r.u32(), 1, MAX_DURATION_MS, malformed) };
    }
    const key = checkKey(utf8Strict.decode(r.bytes(r.u16())), field);
    const label = checkLabel(Buffer.from(r.bytes(r.u8())).toString('latin1'), field);
    let session: string | undefined;
    if (flags & FLAG_SESSION) {
      const length = r.u16();
      if (length === 0 || length > MAX_SESSION_ID_BYTES) throw malformed();
      session = utf8Strict.decode(r.bytes(length));
    }
    r.end();
    const mode: LockMode = flags & FLAG_SHARED ? 'shared' : 'exclusive';
    if (limit !== undefined && mode !== 'shared') throw malformed();
    return { key, token, mode, limit, lockDelayMs, ttlMs, label, session, minHold, seed };
  } catch (error) {
    // A field out of range, a record that ends early or runs on, bad UTF-8: all the same to the caller.
    throw new InvalidArgumentError(field, 'not a lease handle of this service', { cause: error });
  }
}

/**
 * The session handle of `session` for `caller`: the record and its MAC under the caller's secret
 * (the raw SHA-256 of its bearer token; a fixed value for the anonymous caller of a server without
 * --auth, where every request is the same caller).
 */
export function encodeSessionHandle(s: SessionHandle, caller: { name: string; secret: Uint8Array }): string {
  const id = Buffer.from(s.id, 'utf8');
  if (id.length === 0 || id.length > MAX_SESSION_ID_BYTES) throw new InvalidArgumentError('session', `the backend's session id is ${id.length} bytes long`);
  const w = new Writer();
  w.u32(s.ttlMs);
  w.bytes(id);
  const record = w.done();
  return `${SESSION_PREFIX}${record.toString('base64url')}.${sessionMac(record, caller).toString('base64url')}`;
}

/**
 * Reads a session handle: the session, or undefined when its MAC is not this caller's (another
 * caller's session, or a forged one: answered as an unknown session). `InvalidArgumentError(field)`
 * when the string is not a session handle at all.
 */
export function decodeSessionHandle(value: string, caller: { name: string; secret: Uint8Array }, field = 'session'): SessionHandle | undefined {
  if (typeof value !== 'string' || !value.startsWith(SESSION_PREFIX) || value.length > MAX_HANDLE_LENGTH)
    throw new InvalidArgumentError(field, 'not a session handle of this service');
  const parts = value.slice(SESSION_PREFIX.length).split('.');
  const malformed = (cause?: unknown): InvalidArgumentError => new InvalidArgumentError(field, 'not a session handle of this service', { cause });
  if (parts.length !== 2) throw malformed();
  const record = canonicalBase64url(parts[0]!, malformed);
  const mac = canonicalBase64url(parts[1]!, malformed);
  if (mac.length !== SESSION_MAC_BYTES || record.length < 5 || record.length > 4 + MAX_SESSION_ID_BYTES) throw malformed();
  let session: SessionHandle;
  try {
    const r = new Reader(record);
    const ttlMs = inRange(r.u32(), 1, MAX_DURATION_MS, malformed);
    const id = utf8Strict.decode(r.rest());
    session = { id, ttlMs };
  } catch (error) {
    throw error instanceof InvalidArgumentError ? error : malformed(error);
  }
  return timingSafeEqual(mac, sessionMac(record, caller)) ? session : undefined;
}

function sessionMac(record: Uint8Array, caller: { name: string; secret: Uint8Array }): Buffer {
  return createHmac('sha256', caller.secret).update(`lhs1\n${caller.name}\n`, 'utf8').update(record).digest().subarray(0, SESSION_MAC_BYTES);
}

function handleBytes(value: string, prefix: string, field: string): Buffer {
  if (typeof value !== 'string' || !value.startsWith(prefix) || value.length > MAX_HANDLE_LENGTH)
    throw new InvalidArgumentError(field, `not a ${field} handle of this service`);
  return canonicalBase64url(value.slice(prefix.length), (cause) => new InvalidArgumentError(field, `not a ${field} handle of this service`, { cause }));
}

/** Base64url that re-encodes to itself (no padding, no stray characters): only what we wrote. */
function canonicalBase64url(text: string, malformed: (cause?: unknown) => Error): Buffer {
  if (!/^[A-Za-z0-9_-]+$/.test(text)) throw malformed();
  const bytes = Buffer.from(text, 'base64url');
  if (bytes.toString('base64url') !== text) throw malformed();
  return bytes;
}

function inRange(n: number, min: number, max: number, malformed: () => Error): number {
  if (!Number.isSafeInteger(n) || n < min || n > max) throw malformed();
  return n;
}

/** Big-endian fields into a growing buffer. */
class Writer {
  readonly #chunks: Buffer[] = [];
  u8(n: number): void {
    this.#chunks.push(Buffer.from([n]));
  }
  u16(n: number): void {
    const b = Buffer.alloc(2);
    b.writeUInt16BE(n);
    this.#chunks.push(b);
  }
  u32(n: number): void {
    const b = Buffer.alloc(4);
    b.writeUInt32BE(n);
    this.#chunks.push(b);
  }
  u64(n: bigint): void {
    const b = Buffer.alloc(8);
    b.writeBigUInt64BE(n);
    this.#chunks.push(b);
  }
  bytes(b: Uint8Array): void {
    this.#chunks.push(Buffer.from(b));
  }
  done(): Buffer {
    return Buffer.concat(this.#chunks);
  }
}

/** Reads what {@link Writer} wrote; throws RangeError past the end. */
class Reader {
  readonly #b: Buffer;
  #at = 0;
  constructor(b: Buffer) {
    this.#b = b;
  }
  #take(n: number): number {
    if (this.#at + n > this.#b.length) throw new RangeError('handle record ends early');
    const at = this.#at;
    this.#at += n;
    return at;
  }
  u8(): number {
    return this.#b.readUInt8(this.#take(1));
  }
  u16(): number {
    return this.#b.readUInt16BE(this.#take(2));
  }
  u32(): number {
    return this.#b.readUInt32BE(this.#take(4));
  }
  u64(): bigint {
    return this.#b.readBigUInt64BE(this.#take(8));
  }
  bytes(n: number): Uint8Array {
    const at = this.#take(n);
    return this.#b.subarray(at, at + n);
  }
  rest(): Uint8Array {
    return this.bytes(this.#b.length - this.#at);
  }
  end(): void {
    if (this.#at !== this.#b.length) throw new RangeError('handle record has trailing bytes');
  }
}

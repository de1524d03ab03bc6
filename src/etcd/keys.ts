/**
 * Where the etcd backend keeps things. Under a prefix (default `leasehold/`), each lock key has one
 * directory, named by the lock key percent-encoded (so any key round-trips and none contains the
 * `/` separator):
 *
 * ```
 * <prefix><enc key>/q/e/<name>   an exclusive request: a waiter, then the holder
 * <prefix><enc key>/q/s/<name>   a shared request
 * <prefix><enc key>/q/p/<name>   a semaphore permit request (a shared request with a limit, in its value)
 * <prefix><enc key>/d/<name>     the lock-delay marker of a holder with lockDelayMs > 0
 * ```
 *
 * A name stands for one request of one client (the backend's names, reused once both keys of a
 * name are deleted; the functions below take any string and encode it).
 *
 * A request's create revision is its place in the queue and, once granted, its fencing token.
 */
import type { LockMode } from '../core/validate.js';

/** Bytes kept as they are; everything else (including `/` and `%`) becomes %XX of its UTF-8 bytes. */
const SAFE = /^[A-Za-z0-9._~:-]$/;
const utf8 = new TextEncoder();

/**
 * Percent-encodes the UTF-8 bytes of `s` except a small safe set. Prefix-preserving: the encoding
 * of a prefix is a prefix of the encoding, so a lock-key prefix becomes an etcd range.
 */
export function encodePart(s: string): string {
  let out = '';
  for (const ch of s) {
    if (SAFE.test(ch)) out += ch;
    else for (const b of utf8.encode(ch)) out += `%${b.toString(16).toUpperCase().padStart(2, '0')}`;
  }
  return out;
}

export function decodePart(s: string): string {
  return decodeURIComponent(s);
}

export const MODE_TAG: Readonly<Record<LockMode, 'e' | 's'>> = Object.freeze({ exclusive: 'e', shared: 's' });

/**
 * The tag of a request's keys: permits are shared requests under a tag of their own, so a grant's
 * guards can tell them from plain shared requests by range (a plain shared grant needs no permit
 * requests around, a permit needs no plain shared ones).
 */
export function entryTag(mode: LockMode, permit: boolean): 'e' | 's' | 'p' {
  return permit && mode === 'shared' ? 'p' : MODE_TAG[mode];
}

/** The etcd keys of one lock key. */
export class KeyLayout {
  /** `<prefix><enc key>/`: every key of this lock. */
  readonly base: string;
  /** `<base>q/`: requests of both modes, in arrival (create revision) order. */
  readonly queue: string;
  /** `<base>q/e/`: exclusive requests only. */
  readonly exclusive: string;
  /** `<base>q/s/`: plain shared requests (no limit). */
  readonly shared: string;
  /** `<base>q/p/`: semaphore permit requests. */
  readonly permits: string;
  /** `<base>d/`: lock-delay markers. */
  readonly delays: string;

  constructor(prefix: string, key: string) {
    this.base = `${prefix}${encodePart(key)}/`;
    this.queue = `${this.base}q/`;
    this.exclusive = `${this.queue}e/`;
    this.shared = `${this.queue}s/`;
    this.permits = `${this.queue}p/`;
    this.delays = `${this.base}d/`;
  }

  /** The request key of `name` in `mode`; with `permit`, a shared request is a semaphore permit's. */
  entry(mode: LockMode, name: string, permit = false): string {
    return `${this.queue}${entryTag(mode, permit)}/${encodePart(name)}`;
  }

  delay(name: string): string {
    return `${this.delays}${encodePart(name)}`;
  }
}

/** What an etcd key under the prefix is, or undefined for keys that are not ours. */
export type ParsedKey =
  | { kind: 'entry'; encKey: string; mode: LockMode; encOwner: string; permit?: true }
  | { kind: 'delay'; encKey: string; encOwner: string };

export function parseKey(prefix: string, etcdKey: string): ParsedKey | undefined {
  if (!etcdKey.startsWith(prefix)) return undefined;
  const parts = etcdKey.slice(prefix.length).split('/');
  const [encKey, kind, a, b] = parts;
  if (!encKey) return undefined;
  if (kind === 'q' && parts.length === 4 && (a === 'e' || a === 's') && b) {
    return { kind: 'entry', encKey, mode: a === 'e' ? 'exclusive' : 'shared', encOwner: b };
  }
  if (kind === 'q' && parts.length === 4 && a === 'p' && b) return { kind: 'entry', encKey, mode: 'shared', encOwner: b, permit: true };
  if (kind === 'd' && parts.length === 3 && a) return { kind: 'delay', encKey, encOwner: a };
  return undefined;
}

/** The end of the etcd range of every key starting with `prefix` (the prefix with its last byte + 1). */
export function rangeEnd(prefix: Buffer): Buffer {
  const end = Buffer.from(prefix);
  for (let i = end.length - 1; i >= 0; i--) {
    if (end[i]! < 0xff) {
      end[i] = end[i]! + 1;
      return end.subarray(0, i + 1);
    }
  }
  return Buffer.from([0]); // every key
}

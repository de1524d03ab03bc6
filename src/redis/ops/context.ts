import type { Conn } from '../conn/types.js';
import type { Deadlines } from '../deadline.js';
import type { LuaRunner } from '../lua/runner.js';

/** What the operations of one redis backend share: its connection, its runner (of REDIS_LIBRARY) and its key names. */
export interface OpContext {
  readonly conn: Conn;
  readonly runner: LuaRunner;
  /** Bounds the calls made outside the runner (SCAN). */
  readonly deadlines: Deadlines;
  /** Prepended to every key and channel. */
  readonly prefix: string;
  /** `<prefix>session:`; a session's key is this and its id. */
  readonly sessionPrefix: string;
  /** `retainMs` as the decimal string the scripts take. */
  readonly retain: string;
  /** The lock key of a user's key (`<prefix>{<encoded key>}`); its queue and waiters keys are named in the Lua (other_keys). */
  lockKey(key: string): string;
}

/** A duration as the decimal integer the Lua stores as given (core passes integers; round a stray fraction up). */
export function decimal(ms: number): string {
  return Number.isInteger(ms) ? String(ms) : String(Math.ceil(ms));
}

import { createHash } from 'node:crypto';
import type { Conn } from '../conn/types.js';
import { replyCode } from '../errors.js';

/**
 * A Lua script with its SHA1, run with EVALSHA and, when the server does not have it yet
 * (`NOSCRIPT`, the protocol's error code), with EVAL (which also caches it for next time).
 *
 * Typed as redis-semaphore's `createEval<[args], reply>`: `Keys` and `Args` are the script's KEYS
 * and ARGV (tuples of strings, named where the script is defined), `Reply` what it returns as the
 * driver hands it over (Lua strings as strings, Lua integers as numbers, tables as arrays). The
 * types are the script's documentation made checkable; nothing is converted at run time.
 */
export class LuaScript<Keys extends readonly string[] = readonly string[], Args extends readonly string[] = readonly string[], Reply = unknown> {
  readonly sha: string;
  constructor(
    readonly name: string,
    readonly source: string,
  ) {
    this.sha = createHash('sha1').update(source).digest('hex');
  }

  async run(conn: Conn, keys: Keys, args: Args): Promise<Reply> {
    const tail = [String(keys.length), ...keys, ...args];
    try {
      return (await conn.command(['EVALSHA', this.sha, ...tail])) as Reply;
    } catch (error) {
      if (replyCode(error) !== 'NOSCRIPT') throw error;
      return (await conn.command(['EVAL', this.source, ...tail])) as Reply;
    }
  }
}

/** Reads an integer reply element (a number, or a decimal string). */
export function int(value: unknown): number {
  return typeof value === 'number' ? value : Number(value);
}

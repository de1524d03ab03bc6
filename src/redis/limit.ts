import { type InvalidArgumentError, limitConflict as refuse } from '../core/errors.js';

/**
 * Core's refusal of a shared request whose limit the key's holders do not share, from what the Lua
 * reports: `held` is the holders' limit as a decimal ('' for plain shared holders).
 */
export function limitConflict(key: string, held: string, limit: number | undefined): InvalidArgumentError {
  return refuse(key, held === '' ? undefined : Number(held), limit);
}

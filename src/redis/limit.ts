import { InvalidArgumentError } from '../core/errors.js';

/**
 * The refusal of a shared request whose limit the key's holders do not share (`AcquireRequest.limit`),
 * naming both. `held`: the holders' limit as the Lua reports it (a decimal; '' for plain shared
 * holders); `limit`: the request's (undefined: a plain shared request).
 */
export function limitConflict(key: string, held: string, limit: number | undefined): InvalidArgumentError {
  const holders = held === '' ? 'by shared holders without a limit' : `as a semaphore of ${held} permits`;
  const request = limit === undefined ? 'this request is a plain shared one, without a limit' : `this request asks for ${limit}`;
  return new InvalidArgumentError('limit', `key ${JSON.stringify(key)} is held ${holders}; ${request}`);
}

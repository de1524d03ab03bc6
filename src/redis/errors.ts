import { BackendUnavailableError, InvalidArgumentError, LeaseholdError } from '../core/errors.js';

/**
 * True when `error` is an instance of a class named one of `names` (found on its prototype chain):
 * how driver errors are told apart without importing the drivers (their `name` cannot be relied
 * on: node-redis leaves it at 'Error').
 */
export function hasErrorClass(error: unknown, ...names: string[]): boolean {
  if (!(error instanceof Error)) return false;
  for (let p: unknown = Object.getPrototypeOf(error); p !== null && p !== Error.prototype; p = Object.getPrototypeOf(p)) {
    const name = (p as { constructor?: { name?: unknown } }).constructor?.name;
    if (typeof name === 'string' && names.includes(name)) return true;
  }
  return false;
}

/**
 * The error code of a Redis error reply: its first word (`NOSCRIPT`, `WRONGTYPE`, `CROSSSLOT`…),
 * which the protocol defines as the error's kind. Undefined for errors that are not replies
 * (connection loss, timeouts), whatever their message says. A reply error is an ioredis
 * `ReplyError` (redis-errors) or a node-redis `ErrorReply` (v4+; v5's `SimpleError` and
 * `BlobError` extend it); error elements inside an array reply (a batch) are the same classes.
 * The one place replies are classified.
 */
export function replyCode(error: unknown): string | undefined {
  if (!hasErrorClass(error, 'ReplyError', 'ErrorReply')) return undefined;
  return /^([A-Z][A-Z_]*)(?:\s|$)/.exec((error as Error).message)?.[1];
}

/** Maps a driver error to a LeaseholdError: data of another type at our key → InvalidArgumentError, the rest → BackendUnavailableError. */
export function mapRedisError(backend: string, what: string, error: unknown): LeaseholdError {
  if (error instanceof LeaseholdError) return error;
  const message = error instanceof Error ? error.message : String(error);
  switch (replyCode(error)) {
    case 'WRONGTYPE':
      return new InvalidArgumentError(
        'key',
        `${what}: a Redis key leasehold uses holds a value of another type (is the prefix shared with other data?): ${message}`,
        { cause: error },
      );
    case 'CROSSSLOT':
      return new InvalidArgumentError(
        'options.sessions',
        `${what}: keys of different cluster slots in one script; sessions need a single Redis node (pass sessions: false on Redis Cluster): ${message}`,
        { cause: error },
      );
    default:
      return new BackendUnavailableError(backend, `${what} failed: ${message}`, { cause: error });
  }
}

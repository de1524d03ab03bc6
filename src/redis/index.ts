// Placeholder until the Redis backend lands (issue 3); replaced by the real module.
import type { Backend } from '../core/backend.js';
import { InvalidArgumentError } from '../core/errors.js';

export function redisBackend(_options: { url?: string; client?: unknown }): Backend {
  throw new InvalidArgumentError('backend', 'the Redis backend is not built yet');
}
export function redlockBackend(_options: { urls?: string[]; clients?: unknown[] }): Backend {
  throw new InvalidArgumentError('backend', 'the Redlock backend is not built yet');
}

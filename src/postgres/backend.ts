// Placeholder until the PostgreSQL backend lands (issue 4); replaced by the real module.
import type { Backend } from '../core/backend.js';
import { InvalidArgumentError } from '../core/errors.js';

export function postgresBackend(_options: { connectionString?: string; pool?: unknown }): Backend {
  throw new InvalidArgumentError('backend', 'the PostgreSQL backend is not built yet');
}

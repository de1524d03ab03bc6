// Placeholder until the etcd backend lands (issue 4); replaced by the real module.
import type { Backend } from '../core/backend.js';
import { InvalidArgumentError } from '../core/errors.js';

export function etcdBackend(_options: { hosts?: string[]; client?: unknown }): Backend {
  throw new InvalidArgumentError('backend', 'the etcd backend is not built yet');
}

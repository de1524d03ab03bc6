import { createRequire } from 'node:module';
import { InvalidArgumentError } from '../core/errors.js';

const require = createRequire(import.meta.url);

/**
 * Loads an optional peer dependency (prom-client, @opentelemetry/api) when a function that needs it
 * is first called, so `leasehold/metrics` imports nothing a user has not installed. A missing
 * package is an InvalidArgumentError naming it, never a raw MODULE_NOT_FOUND.
 */
export function loadPeer<T>(name: string, entry: string): T {
  try {
    return require(name) as T;
  } catch (error) {
    if ((error as { code?: string }).code === 'MODULE_NOT_FOUND') {
      throw new InvalidArgumentError('dependency', `${entry} needs the package ${name}: npm install ${name}`, { cause: error });
    }
    throw error;
  }
}

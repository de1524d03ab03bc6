import type { Backend } from './core/backend.js';
import { InvalidArgumentError } from './core/errors.js';
import { describe } from './core/validate.js';

/** Where `createLocks()` keeps its leases when given neither a backend nor LEASEHOLD_URL. */
export const DEFAULT_URL = 'sqlite:./leasehold.db';

/**
 * Reads a coordinator URL (checked now, synchronously) and returns a loader that imports the
 * backend's module and connects on first use, so `leasehold` never loads drivers you do not use.
 *
 * - `memory:` — this process only
 * - `sqlite:PATH` — one machine, many processes (`sqlite:./leasehold.db`, `sqlite:/var/lib/app/locks.db`)
 */
export function backendLoader(url: unknown): () => Promise<Backend> {
  if (typeof url !== 'string' || url.length === 0) throw new InvalidArgumentError('url', `expected a URL string, got ${describe(url)}`);
  const scheme = /^([a-z][a-z0-9+.-]*):/i.exec(url)?.[1]?.toLowerCase();
  switch (scheme) {
    case 'memory': {
      if (url !== 'memory:') throw new InvalidArgumentError('url', `memory: takes nothing after the colon, got ${JSON.stringify(url)}`);
      return async () => (await import('./memory/index.js')).memoryBackend();
    }
    case 'sqlite': {
      const path = url.slice('sqlite:'.length).replace(/^\/\/(?=\/)/, '');
      if (path.length === 0) throw new InvalidArgumentError('url', 'sqlite: needs a file path, e.g. sqlite:./leasehold.db');
      return async () => (await import('./sqlite/index.js')).sqliteBackend({ path });
    }
    default:
      throw new InvalidArgumentError(
        'url',
        `unsupported scheme in ${JSON.stringify(url.length > 80 ? `${url.slice(0, 80)}…` : url)}; expected memory: or sqlite:PATH`,
      );
  }
}

/** Connects to the coordinator named by `url` (see {@link backendLoader} for the schemes). */
export function backendFromUrl(url: string): Promise<Backend> {
  return backendLoader(url)();
}

/**
 * Drivers are optional peer dependencies: `npm i leasehold` installs none of pg, ioredis or etcd3,
 * and each backend entry point (`leasehold/postgres`, …) loads its own through a small
 * `src/<backend>/driver.ts`. A driver that is not installed is an InvalidArgumentError naming the
 * package to install (argument `dependency`), never a raw MODULE_NOT_FOUND from deep inside.
 *
 * Core never names a package: the caller passes its own `require` (from
 * `createRequire(import.meta.url)`), so the package resolves from the caller's place.
 */
import { InvalidArgumentError } from './errors.js';

/** The part of Node's `require` (as made by `createRequire`) that `requirePeer` uses. */
export interface PeerRequire {
  (id: string): unknown;
  resolve(id: string): string;
}

/**
 * Loads the package `name` for `entry` (the public entry point that needs it, e.g.
 * `leasehold/postgres`). Only the package itself being absent is mapped to the InvalidArgumentError;
 * any other failure while loading it (a broken install, a missing dependency of the driver) is
 * thrown as it is.
 */
export function requirePeer<T>(require: PeerRequire, name: string, entry: string): T {
  try {
    require.resolve(name);
  } catch (error) {
    if (isModuleNotFound(error)) throw missingPeer(name, entry, error);
    throw error;
  }
  return require(name) as T;
}

/** The error for a peer dependency that is not installed. */
export function missingPeer(name: string, entry: string, cause?: unknown): InvalidArgumentError {
  return new InvalidArgumentError('dependency', `${entry} needs the package ${name}, which is not installed: npm install ${name}`, { cause });
}

/** True for Node's "cannot find module/package" errors (CommonJS and ESM resolution). */
export function isModuleNotFound(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  return code === 'MODULE_NOT_FOUND' || code === 'ERR_MODULE_NOT_FOUND';
}

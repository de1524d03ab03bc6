import { StaleTokenError, InvalidArgumentError } from '../core/errors.js';
import type { Fence } from '../core/fence.js';
import { toToken, type TokenInput } from '../core/token.js';
import { checkKey, describe } from '../core/validate.js';

/**
 * A fence for state inside this process: `mutate()` runs inside a per-resource critical section,
 * the high-water mark is raised only when `mutate` succeeds. Nothing is rolled back for you: if
 * `mutate` fails halfway, undo your own changes before rethrowing.
 */
export function memoryFence(): Fence<void> {
  const highest = new Map<string, bigint>();
  const tails = new Map<string, Promise<unknown>>();

  return {
    async write<R>(resource: string, token: TokenInput, mutate: (tx: void) => R | Promise<R>): Promise<R> {
      checkKey(resource, 'resource');
      const t = toToken(token);
      if (typeof mutate !== 'function') throw new InvalidArgumentError('mutate', `expected a function, got ${describe(mutate)}`);
      const previous = tails.get(resource) ?? Promise.resolve();
      const run = previous.then(async () => {
        const high = highest.get(resource);
        if (high !== undefined && t < high) throw new StaleTokenError(resource, t, high);
        const result = await mutate();
        highest.set(resource, t);
        return result;
      });
      const tail = run.catch(() => {});
      tails.set(resource, tail);
      void tail.then(() => {
        if (tails.get(resource) === tail) tails.delete(resource);
      });
      return run;
    },
    async highest(resource: string): Promise<bigint | null> {
      checkKey(resource, 'resource');
      return highest.get(resource) ?? null;
    },
  };
}

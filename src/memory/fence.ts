import { StaleTokenError, InvalidArgumentError } from '../core/errors.js';
import { FENCE_GUARD_OPTIONS, fenceTokenCheck, type Fence, type FenceGuardOptions } from '../core/fence.js';
import type { TokenInput } from '../core/token.js';
import { checkKey, checkKnownOptions, checkObject, describe } from '../core/validate.js';

/**
 * Options of memoryFence: those every fence takes (FenceGuardOptions): which lock guards which
 * resource (`lockKey`, `requireSequencer`) and the lock service's key that signed sequencers must
 * verify with (`sequencerKey`).
 */
export type MemoryFenceOptions = FenceGuardOptions;

/**
 * A fence for state inside this process: `mutate()` runs inside a per-resource critical section,
 * the high-water mark is raised only when `mutate` succeeds. Nothing is rolled back for you: if
 * `mutate` fails halfway, undo your own changes before rethrowing. `mutate` gets no handle, so it
 * cannot end the critical section early; a `mutate` that never settles holds the resource forever
 * (and one that writes the same resource through this fence waits for itself): keep it bounded.
 */
export function memoryFence(options?: MemoryFenceOptions): Fence<void> {
  const o = checkObject(options, 'options');
  checkKnownOptions(o, FENCE_GUARD_OPTIONS, 'options');
  const readToken = fenceTokenCheck(o);
  const highest = new Map<string, bigint>();
  const tails = new Map<string, Promise<unknown>>();

  return {
    async write<R>(resource: string, token: TokenInput, mutate: () => R | Promise<R>, writeOptions?: unknown): Promise<R> {
      checkKey(resource, 'resource');
      const t = readToken(resource, token, writeOptions);
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

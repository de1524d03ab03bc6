import type { TokenInput } from './token.js';

/**
 * A fence guards one kind of protected resource. It keeps, per resource name, the highest token it
 * has accepted, and `write` checks the token and runs the mutation in one atomic step (I3):
 * accepted iff token >= highest (equal: the same holder writing again); a refusal throws
 * `StaleTokenError` and changes nothing; an error thrown by `mutate` undoes the mutation where the
 * store has transactions, leaves the high-water mark where it was, and reaches the caller unchanged.
 *
 * `Tx` is what `mutate` works with: a transaction client, a database handle, a MULTI.
 */
export interface Fence<Tx> {
  /** Checks `token` (a bigint, a decimal string or a sequencer) and runs `mutate` atomically with the check. */
  write<R>(resource: string, token: TokenInput, mutate: (tx: Tx) => R | Promise<R>): Promise<R>;
  /** The highest token accepted for `resource`, or null if none. */
  highest(resource: string): Promise<bigint | null>;
}

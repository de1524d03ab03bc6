import { InvalidArgumentError } from './errors.js';
import { sequencerVerifier, type SequencerKeys } from './sequencer-sign.js';
import { parseSequencer, toToken, type TokenInput } from './token.js';
import { checkBoolean, checkKey, checkKnownOptions, checkObject, describe } from './validate.js';

/**
 * A fence guards one kind of protected resource. It keeps, per resource name, the highest token it
 * has accepted, and `write` checks the token and runs the mutation in one atomic step (I3):
 * accepted iff token >= highest (equal: the same holder writing again); a refusal throws
 * `StaleTokenError` and changes nothing; an error thrown by `mutate` undoes the mutation where the
 * store has transactions, leaves the high-water mark where it was, and reaches the caller unchanged.
 *
 * `Tx` is what `mutate` works with: a transaction client, a database handle, a MULTI. It is a
 * guarded view: calls that would end or escape the fence's transaction (COMMIT, ROLLBACK, EXEC,
 * release…) are refused with InvalidArgumentError naming `mutate`, the write is then rolled back
 * and rejects with that error even if `mutate` caught it; after `write` settles every call through
 * it is refused.
 */
export interface Fence<Tx> {
  /** Checks `token` (a bigint, a decimal string or a sequencer) and runs `mutate` atomically with the check. */
  write<R>(resource: string, token: TokenInput, mutate: (tx: Tx) => R | Promise<R>, options?: FenceWriteOptions): Promise<R>;
  /** The highest token accepted for `resource`, or null if none. */
  highest(resource: string): Promise<bigint | null>;
}

/** Options of one `fence.write`. */
export interface FenceWriteOptions {
  /**
   * The lock key whose tokens guard this resource (overrides the fence's `lockKey` option for this
   * call). A sequencer naming another key is refused with InvalidArgumentError (`token`), nothing
   * changed. @default the fence's `lockKey(resource)`, else unchecked
   */
  lockKey?: string;
}

/**
 * Options every fence factory takes (beside its own): which lock guards which resource.
 *
 * Tokens are only comparable within one lock key: every key counts on its own (and a Redis
 * backend's numbers are not a SQLite backend's). A fence that takes any key's token for a resource
 * lets a holder of another lock write it, and a token from a lock with larger numbers raises the
 * mark beyond anything the resource's own lock will grant for a long time: that lock is locked out.
 */
export interface FenceGuardOptions {
  /**
   * The lock key that guards `resource`, or undefined when the fence should not check. When it
   * gives a key, a sequencer naming another key is refused with InvalidArgumentError (`token`).
   * @default no check (any key's sequencer is accepted, as before)
   */
  lockKey?: (resource: string) => string | undefined;
  /**
   * When a lock key is known for the resource (option or per call), refuse bare tokens (bigint,
   * decimal string): only a sequencer says which lock it came from. Without it a bare token is
   * accepted unchecked, since it names no key. @default false
   */
  requireSequencer?: boolean;
  /**
   * The lock service's sequencer key (what `leasehold serve --sequencer-key` signs with; for an
   * Ed25519 key pair, its public key): the fence then accepts only sequencers that verify with it,
   * and refuses bare tokens, unsigned sequencers and forged ones with InvalidArgumentError
   * (`token`), nothing changed. The key file's text, bytes, a KeyObject, or several for rotation
   * (any verifies). With a shared secret, whoever holds it can also sign: see `verifySequencer`.
   * @default none (a signed sequencer is read like an unsigned one, its signature unchecked)
   */
  sequencerKey?: SequencerKeys;
}

/** The names of FenceGuardOptions, for each factory's list of known options. */
export const FENCE_GUARD_OPTIONS: readonly string[] = Object.freeze(['lockKey', 'requireSequencer', 'sequencerKey']);

/** Reads a write's token and checks it against the lock key that guards the resource (and, with `sequencerKey`, its signature). */
export type FenceTokenCheck = (resource: string, token: TokenInput, options: unknown) => bigint;

/**
 * The one place every fence reads `write`'s token and per-call options: validates the
 * FenceGuardOptions given to a factory (already checked to be an object) and returns the check.
 * Runs before the fence touches its store, so a refusal changes nothing.
 */
export function fenceTokenCheck(factoryOptions: Record<string, unknown>): FenceTokenCheck {
  const lockKeyOf = factoryOptions.lockKey;
  if (lockKeyOf !== undefined && typeof lockKeyOf !== 'function') {
    throw new InvalidArgumentError('options.lockKey', `expected a function (resource) => lock key | undefined, got ${describe(lockKeyOf)}`);
  }
  const requireSequencer = factoryOptions.requireSequencer === undefined ? false : checkBoolean(factoryOptions.requireSequencer, 'options.requireSequencer');
  // Keys are read and checked once, here: a bad key fails the factory, not every write.
  const verify = factoryOptions.sequencerKey === undefined ? undefined : sequencerVerifier(factoryOptions.sequencerKey, 'options.sequencerKey');

  return (resource, token, options) => {
    let expected: string | undefined;
    if (options !== undefined) {
      const o = checkObject(options, 'options');
      checkKnownOptions(o, ['lockKey'], 'options');
      if (o.lockKey !== undefined) expected = checkKey(o.lockKey, 'options.lockKey');
    }
    if (expected === undefined && lockKeyOf !== undefined) {
      const key: unknown = (lockKeyOf as (r: string) => unknown)(resource);
      if (key !== undefined) expected = checkKey(key, 'lockKey');
    }
    if (verify !== undefined) {
      if (typeof token !== 'string' || !token.startsWith('lh')) {
        toToken(token); // a malformed token is named as such first
        throw new InvalidArgumentError(
          'token',
          `this fence accepts only sequencers signed by the lock service (sequencerKey): a bare token names no issuer and anyone can make one up; got ${describe(token)} (nothing was changed)`,
        );
      }
      const s = verify(token, 'token');
      if (expected !== undefined && s.key !== expected) throw otherLock(s.key, s.token, resource, expected);
      return s.token;
    }
    if (expected === undefined || typeof token !== 'string' || !token.startsWith('lh')) {
      const t = toToken(token);
      if (expected !== undefined && requireSequencer) {
        throw new InvalidArgumentError(
          'token',
          `resource ${JSON.stringify(resource)} is guarded by lock ${JSON.stringify(expected)}: pass the lease's sequencer, not a bare token, so the fence can check which lock it came from (requireSequencer)`,
        );
      }
      return t;
    }
    const s = parseSequencer(token, 'token');
    if (s.key !== expected) throw otherLock(s.key, s.token, resource, expected);
    return s.token;
  };
}

function otherLock(key: string, token: bigint, resource: string, expected: string): InvalidArgumentError {
  return new InvalidArgumentError(
    'token',
    `the sequencer names lock ${JSON.stringify(key)}, but resource ${JSON.stringify(resource)} is guarded by lock ${JSON.stringify(expected)}; its token ${token} means nothing here (nothing was changed)`,
  );
}

/**
 * A guarded view of what `mutate` is handed (a pooled client, a database, a MULTI): every method
 * call goes through `refuse`, which names the misuse (or returns undefined to let it through);
 * methods returning the object itself return the view (chaining stays guarded). The first misuse
 * is kept in `misuse` even if `mutate` swallows the error, so the fence can roll back and report
 * it. `revoke()` (when `write` settles) refuses every later call.
 */
export interface GuardedHandle<T> {
  readonly handle: T;
  readonly misuse: InvalidArgumentError | undefined;
  revoke(): void;
}

export function guardHandle<T extends object>(
  target: T,
  refuse: (method: string, args: unknown[]) => string | undefined,
  /** Methods whose refusal is a rejected promise (their API is asynchronous) rather than a throw. */
  asyncMethods: ReadonlySet<string> = new Set(),
): GuardedHandle<T> {
  let misuse: InvalidArgumentError | undefined;
  let revoked = false;
  const fail = (problem: string): InvalidArgumentError => {
    const error = new InvalidArgumentError('mutate', problem);
    misuse ??= error;
    return error;
  };
  const handle: T = new Proxy(target, {
    get(t, prop) {
      const value: unknown = Reflect.get(t, prop, t);
      if (typeof value !== 'function' || typeof prop !== 'string') return value;
      return (...args: unknown[]): unknown => {
        const problem = revoked ? `${prop}() was called after the fenced write settled; keep no reference to what mutate is handed` : refuse(prop, args);
        if (problem !== undefined) {
          const error = revoked ? new InvalidArgumentError('mutate', problem) : fail(problem);
          if (asyncMethods.has(prop)) return Promise.reject(error);
          throw error;
        }
        const result: unknown = (value as (...a: unknown[]) => unknown).apply(t, args);
        return result === t ? handle : result;
      };
    },
  });
  return {
    handle,
    get misuse() {
      return misuse;
    },
    revoke() {
      revoked = true;
    },
  };
}

/**
 * The SQL statement that `sql` starts with when it ends or opens a transaction (COMMIT, END,
 * ROLLBACK but not ROLLBACK TO, ABORT, BEGIN, START TRANSACTION, PREPARE TRANSACTION), in upper
 * case; undefined otherwise. Reads past leading white space and comments. Only the first
 * statement of a string is read: the fences also check, before they commit, that the transaction
 * is still theirs.
 */
export function transactionControl(sql: string): string | undefined {
  const words = leadingWords(sql, 4);
  const [first, second, third] = words;
  switch (first) {
    case 'COMMIT':
    case 'END':
    case 'ABORT':
    case 'BEGIN':
      return first;
    case 'START':
      return second === 'TRANSACTION' ? 'START TRANSACTION' : undefined;
    case 'PREPARE':
      return second === 'TRANSACTION' ? 'PREPARE TRANSACTION' : undefined;
    case 'ROLLBACK': {
      const next = second === 'WORK' || second === 'TRANSACTION' ? third : second;
      return next === 'TO' ? undefined : 'ROLLBACK';
    }
    default:
      return undefined;
  }
}

/** Up to `n` leading words of `sql` in upper case, skipping white space and -- or /* *\/ comments. */
function leadingWords(sql: string, n: number): string[] {
  const words: string[] = [];
  let i = 0;
  while (i < sql.length && words.length < n) {
    const c = sql[i]!;
    if (/\s/.test(c)) {
      i++;
    } else if (sql.startsWith('--', i)) {
      const end = sql.indexOf('\n', i);
      i = end < 0 ? sql.length : end + 1;
    } else if (sql.startsWith('/*', i)) {
      const end = sql.indexOf('*/', i + 2);
      i = end < 0 ? sql.length : end + 2;
    } else {
      const m = /^[A-Za-z_]+/.exec(sql.slice(i, i + 64));
      if (!m) break;
      words.push(m[0].toUpperCase());
      i += m[0].length;
    }
  }
  return words;
}

/**
 * The lock service's sequencers (`--sequencer-key`, issue 19 point 4): signed when the server has a
 * key, so a resource can check offline that a sequencer came from this service (`verifySequencer`,
 * a fence's `sequencerKey`) instead of calling back (Chubby's CheckSequencer, which the check route
 * still is). Without a key, sequencers are unsigned (`lh1.`) and read as before.
 */
import type { KeyObject } from 'node:crypto';
import { InvalidArgumentError } from '../core/errors.js';
import { sequencerKeyObjects, sequencerVerifier, signSequencer } from '../core/sequencer-sign.js';
import { formatSequencer, parseSequencer, type Sequencer } from '../core/token.js';
import type { LockMode } from '../core/validate.js';
import type { ServeContext } from './context.js';

/**
 * The server's sequencer keys, read once (not per grant) and checked to sign: an Ed25519 public key
 * first would make every grant fail, so it is refused when the server is made.
 * @throws InvalidArgumentError naming `argument` (no key material in it)
 */
export function signingKeys(value: unknown, argument: string): readonly KeyObject[] {
  const keys = sequencerKeyObjects(value, argument);
  if (keys[0]!.type === 'public') {
    throw new InvalidArgumentError(argument, 'its first key is an Ed25519 public key, which can only verify: the lock service signs with the private key');
  }
  return keys;
}

/** The sequencer of a grant, as the acquire answer carries it: signed with the first key when the server has one. */
export function issuedSequencer(ctx: ServeContext, key: string, mode: LockMode, token: bigint): string {
  const unsigned = formatSequencer(key, mode, token);
  return ctx.sequencerKey ? signSequencer(unsigned, ctx.sequencerKey) : unsigned;
}

/** Verifications per key set: the check route verifies with the server's keys, read once. */
const verifiers = new WeakMap<readonly KeyObject[], ReturnType<typeof sequencerVerifier>>();

/**
 * A sequencer sent to the check route. With a key, only one this service signed is read: unsigned,
 * forged, altered or another service's is an InvalidArgumentError naming `sequencer` (a 400), not
 * `valid: false`, which says "not held now" about a sequencer that was genuinely issued. Without a
 * key, any well-formed sequencer (a signed one's signature unchecked).
 */
export function checkedSequencer(ctx: ServeContext, value: unknown): Sequencer {
  const keys = ctx.sequencerKey;
  // Malformed: the same 400 as without a key.
  const read = parseSequencer(value, 'sequencer');
  if (!keys) return read;
  let verify = verifiers.get(keys);
  if (!verify) verifiers.set(keys, (verify = sequencerVerifier(keys, 'sequencerKey')));
  try {
    return verify(value, 'sequencer');
  } catch (error) {
    if (!(error instanceof InvalidArgumentError)) throw error;
    const problem = error.message.replace(/^invalid sequencer: /, '');
    throw new InvalidArgumentError('sequencer', `not signed by this service: ${problem}`, { cause: error });
  }
}

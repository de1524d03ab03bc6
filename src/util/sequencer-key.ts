/**
 * The `--sequencer-key FILE` of `leasehold serve`: reads the key file once at start-up, so a
 * missing or malformed file stops the server before it listens instead of failing each grant.
 * The file's format is SequencerKey's (src/core/sequencer-sign.ts): one key per line, hex or
 * base64 of 32 or more random bytes (`openssl rand -hex 32 > seq.key`), or PEM blocks of Ed25519
 * keys; `#` comments; the first key signs, the others still verify (rotation).
 */
import { readFileSync } from 'node:fs';
import type { KeyObject } from 'node:crypto';
import { InvalidArgumentError } from '../core/errors.js';
import { sequencerKeyObjects } from '../core/sequencer-sign.js';

export interface LoadSequencerKeyOptions {
  /** The argument named in errors. @default '--sequencer-key' */
  argument?: string;
  /** 'sign' (the lock service) also requires that the first key can sign: a secret or an Ed25519 private key. @default 'sign' */
  use?: 'sign' | 'verify';
}

/**
 * The keys of the file at `path`, ready for `signSequencer` / `verifySequencer` (which take the
 * array as it is: the first signs). Never puts key material in an error.
 * @throws InvalidArgumentError naming `--sequencer-key`: unreadable file, no key, a malformed or
 * short key, or (use 'sign') a first key that is an Ed25519 public key
 */
export function loadSequencerKey(path: string, options: LoadSequencerKeyOptions = {}): readonly KeyObject[] {
  const argument = options.argument ?? '--sequencer-key';
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (cause) {
    throw new InvalidArgumentError(argument, `cannot read ${JSON.stringify(path)}: ${(cause as Error).message}`, { cause });
  }
  let keys: readonly KeyObject[];
  try {
    keys = sequencerKeyObjects(text, argument);
  } catch (error) {
    if (!(error instanceof InvalidArgumentError)) throw error;
    const prefix = `invalid ${argument}: `;
    const problem = error.message.startsWith(prefix) ? error.message.slice(prefix.length) : error.message;
    throw new InvalidArgumentError(argument, `${JSON.stringify(path)}: ${problem}`, { cause: error });
  }
  if ((options.use ?? 'sign') === 'sign' && keys[0]!.type === 'public') {
    throw new InvalidArgumentError(
      argument,
      `${JSON.stringify(path)}: its first key is an Ed25519 public key, which can only verify; the lock service signs with the private key (openssl genpkey -algorithm ed25519)`,
    );
  }
  return keys;
}

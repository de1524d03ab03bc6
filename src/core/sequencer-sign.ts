/**
 * Signed sequencers (issue 19, point 4). A lock service started with `--sequencer-key` signs the
 * sequencers it hands out, so a protected resource can check offline that a sequencer was issued
 * by that service and not made up by a client: Chubby's resources had to call back to Chubby
 * (CheckSequencer) for that.
 *
 * Form: `lh1s.<e|s>.<token>.<base64url(key)>.<base64url(signature)>`, the signature taken over a
 * domain-separated message (`SIGNED_MESSAGE_CONTEXT`, then `lh1s.<e|s>.<token>.<base64url(key)>`)
 * that covers version, mode, token and key. Two kinds of key:
 *
 * - a shared secret (HMAC-SHA-256): the lock service and every resource hold the same bytes, so
 *   WHOEVER CAN VERIFY CAN ALSO SIGN — a resource given the secret could forge sequencers for
 *   every other resource. Fine when the resources are as trusted as the lock service;
 * - an Ed25519 key pair: the lock service holds the private key and signs, resources hold only the
 *   public key and can verify but not sign.
 *
 * The verifier's key decides the algorithm, never the sequencer. Several keys may be given for
 * rotation: the first signs, any of them verifies.
 *
 * What a signature does not prove: that the lease is still held (a fence's token check is what
 * refuses the old holder, I3), or that the bearer is the holder (a sequencer is a bearer
 * credential: whoever saw it can replay it until a higher token reaches the resource).
 */
import { createHmac, createPrivateKey, createPublicKey, createSecretKey, KeyObject, sign, timingSafeEqual, verify } from 'node:crypto';
import { InvalidArgumentError } from './errors.js';
import { readSequencer, type Sequencer } from './token.js';
import { describe } from './validate.js';

/**
 * A sequencer key: a secret of at least 32 bytes (HMAC-SHA-256) as bytes, or a KeyObject (a
 * secret key, or an Ed25519 private key that signs or public key that only verifies), or text in
 * the key file's format: one key per line, each 32 or more random bytes as hex or base64
 * (`openssl rand -hex 32`), or PEM blocks of Ed25519 keys (`openssl genpkey -algorithm ed25519`
 * makes a private key, `openssl pkey -pubout` its public key); blank lines and `#` comments are
 * ignored, and the first key listed is the one that signs.
 */
export type SequencerKey = string | Uint8Array | KeyObject;
/** One key, or several for rotation: the first signs, any of them verifies. */
export type SequencerKeys = SequencerKey | readonly SequencerKey[];

/** Shortest shared secret: 256 bits, the size of HMAC-SHA-256's output; shorter ones can be guessed offline from one sequencer. */
export const MIN_SEQUENCER_SECRET_BYTES = 32;
/** Most keys at once: rotation needs two or three; a verifier tries each in turn. */
const MAX_SEQUENCER_KEYS = 16;
/** Prefixed to every signed message, so a key shared with another use never signs a sequencer by accident. */
const SIGNED_MESSAGE_CONTEXT = 'leasehold signed sequencer\n';
const HMAC_BYTES = 32;
const ED25519_SIGNATURE_BYTES = 64;

const HEX = /^(?:[0-9a-fA-F]{2})+$/;
const BASE64 = /^[A-Za-z0-9+/_-]+={0,2}$/;
const PEM_BEGIN = /^-----BEGIN ([A-Z0-9 ]+)-----$/;

/**
 * Signs a sequencer (signed or not; a signed one is signed again) with the first of `key`.
 * @throws InvalidArgumentError naming `sequencer` (not a sequencer) or `sequencerKey` (a key that
 * is too short, malformed, or an Ed25519 public key, which cannot sign)
 */
export function signSequencer(sequencer: string, key: SequencerKeys): string {
  const signer = sequencerKeyObjects(key, 'sequencerKey')[0]!;
  const parts = readSequencer(sequencer, 'sequencer');
  return `lh1s.${parts.fields}.${signWith(signer, signedMessage(parts.fields), 'sequencerKey').toString('base64url')}`;
}

/**
 * Checks offline that `sequencer` was signed with one of `key` and returns what it says.
 * @throws InvalidArgumentError naming `sequencer` when it is malformed, unsigned, or its signature
 * does not verify (forged, altered, or signed with another key); naming `sequencerKey` for a bad key
 */
export function verifySequencer(sequencer: string, key: SequencerKeys): Sequencer {
  return sequencerVerifier(key, 'sequencerKey')(sequencer, 'sequencer');
}

/**
 * Reads and checks `key` once and returns the verification `verifySequencer` does, for callers
 * that verify many sequencers with one set of keys (the fences).
 */
export function sequencerVerifier(key: unknown, keyArgument: string): (sequencer: unknown, argument: string) => Sequencer {
  const keys = sequencerKeyObjects(key, keyArgument);
  return (sequencer, argument) => {
    const parts = readSequencer(sequencer, argument);
    if (parts.signature === undefined) {
      throw new InvalidArgumentError(
        argument,
        'is not signed (an lh1. sequencer): only sequencers signed by the lock service (lh1s.) are accepted here, since anyone can write an unsigned one',
      );
    }
    const signature = Buffer.from(parts.signature, 'base64url');
    const message = signedMessage(parts.fields);
    for (const k of keys) if (verifyWith(k, message, signature)) return parts.sequencer;
    throw new InvalidArgumentError(
      argument,
      `its signature does not match ${keys.length === 1 ? 'the verification key' : `any of the ${keys.length} verification keys`}: forged, altered, or signed with another key`,
    );
  };
}

/**
 * Every key of `value` as a KeyObject (secret, Ed25519 private or Ed25519 public), checked, in
 * order: the first signs. Never puts key material in an error message.
 */
export function sequencerKeyObjects(value: unknown, argument: string): readonly KeyObject[] {
  const keys: KeyObject[] = [];
  for (const item of Array.isArray(value) ? (value as unknown[]) : [value]) keys.push(...keyObjectsOf(item, argument));
  if (keys.length === 0) throw new InvalidArgumentError(argument, 'contains no key');
  if (keys.length > MAX_SEQUENCER_KEYS) throw new InvalidArgumentError(argument, `holds ${keys.length} keys; at most ${MAX_SEQUENCER_KEYS}`);
  return Object.freeze(keys);
}

function keyObjectsOf(value: unknown, argument: string): KeyObject[] {
  if (value instanceof KeyObject) return [checkKeyObject(value, argument)];
  if (value instanceof Uint8Array) return [secretKey(value, argument)];
  if (typeof value === 'string') return parseKeyText(value, argument);
  throw new InvalidArgumentError(argument, `expected a secret (string or bytes), a KeyObject or an array of them, got ${describe(value)}`);
}

function checkKeyObject(key: KeyObject, argument: string, where = ''): KeyObject {
  if (key.type === 'secret') {
    if (key.symmetricKeySize! < MIN_SEQUENCER_SECRET_BYTES) throw tooShort(argument, key.symmetricKeySize!, where);
    return key;
  }
  if (key.asymmetricKeyType !== 'ed25519') {
    throw new InvalidArgumentError(argument, `${where}a ${key.asymmetricKeyType} ${key.type} key is not supported: use a shared secret or an Ed25519 key`);
  }
  return key;
}

function secretKey(bytes: Uint8Array, argument: string, where = ''): KeyObject {
  if (bytes.length < MIN_SEQUENCER_SECRET_BYTES) throw tooShort(argument, bytes.length, where);
  return createSecretKey(Buffer.from(bytes));
}

function tooShort(argument: string, bytes: number, where = ''): InvalidArgumentError {
  return new InvalidArgumentError(
    argument,
    `${where}a secret of ${bytes} bytes is too short; at least ${MIN_SEQUENCER_SECRET_BYTES} random bytes (openssl rand -hex 32)`,
  );
}

/** The key file's format (see SequencerKey): lines of hex or base64, PEM blocks, blank lines and # comments. */
function parseKeyText(text: string, argument: string): KeyObject[] {
  const keys: KeyObject[] = [];
  const lines = text.split(/\r?\n/);
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i]!.trim();
    if (line === '' || line.startsWith('#')) continue;
    const where = `line ${i + 1}`;
    const begin = PEM_BEGIN.exec(line);
    if (begin) {
      const end = lines.findIndex((l, j) => j > i && l.trim() === `-----END ${begin[1]}-----`);
      if (end < 0) throw new InvalidArgumentError(argument, `${where}: a PEM block (${begin[1]}) without its END line`);
      keys.push(pemKey(begin[1]!, lines.slice(i, end + 1).join('\n'), where, argument));
      i = end;
    } else if (HEX.test(line)) {
      keys.push(secretKey(Buffer.from(line, 'hex'), argument, `${where}: `));
    } else if (BASE64.test(line)) {
      keys.push(secretKey(Buffer.from(line, 'base64'), argument, `${where}: `));
    } else {
      throw new InvalidArgumentError(
        argument,
        `${where} is neither hex nor base64 nor a PEM block (a secret: 32 or more random bytes, e.g. openssl rand -hex 32)`,
      );
    }
  }
  return keys;
}

function pemKey(label: string, pem: string, where: string, argument: string): KeyObject {
  let key: KeyObject;
  try {
    if (label === 'PRIVATE KEY') key = createPrivateKey(pem);
    else if (label === 'PUBLIC KEY') key = createPublicKey(pem);
    else throw new Error(`a PEM block of type ${label} (expected PRIVATE KEY or PUBLIC KEY${label.includes('ENCRYPTED') ? ', unencrypted' : ''})`);
  } catch (cause) {
    throw new InvalidArgumentError(argument, `${where}: not a usable key: ${(cause as Error).message}`, { cause });
  }
  return checkKeyObject(key, argument, `${where}: `);
}

function signedMessage(fields: string): Buffer {
  return Buffer.from(`${SIGNED_MESSAGE_CONTEXT}lh1s.${fields}`, 'utf8');
}

function signWith(key: KeyObject, message: Buffer, argument: string): Buffer {
  if (key.type === 'secret') return createHmac('sha256', key).update(message).digest();
  if (key.type === 'private') return sign(null, message, key);
  throw new InvalidArgumentError(argument, 'its first key is an Ed25519 public key, which can only verify: sign with the private key');
}

function verifyWith(key: KeyObject, message: Buffer, signature: Buffer): boolean {
  if (key.type === 'secret') {
    if (signature.length !== HMAC_BYTES) return false;
    // Constant time: a compare that stops at the first differing byte tells a forger how far it got.
    return timingSafeEqual(createHmac('sha256', key).update(message).digest(), signature);
  }
  if (signature.length !== ED25519_SIGNATURE_BYTES) return false;
  return verify(null, message, key, signature);
}

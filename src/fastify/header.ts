/**
 * The `Idempotency-Key` request header (draft-ietf-httpapi-idempotency-key-header): an Item
 * Structured Field whose value is a String, `Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"`.
 * Many clients send the key bare (Stripe's `Idempotency-Key: 8e03…`); both are read.
 */

/** The longest key taken, in characters: as Stripe's and most APIs' limit (a UUID is 36). */
export const MAX_IDEMPOTENCY_KEY_LENGTH = 255;

/** What a request's header says: no key, a key, or a value that is not one (with the reason). */
export type ParsedKey = { kind: 'missing' } | { kind: 'key'; key: string } | { kind: 'invalid'; reason: string };

/**
 * Reads the header's value(s) as Node hands them over. A quoted value is a Structured Field String
 * (printable ASCII; `\"` and `\\` escaped; parameters are not accepted); an unquoted one is taken as
 * is when it is visible ASCII without quotes or backslashes. Empty, repeated or longer than
 * {@link MAX_IDEMPOTENCY_KEY_LENGTH} is invalid.
 */
export function parseIdempotencyKey(value: string | string[] | undefined): ParsedKey {
  if (value === undefined) return { kind: 'missing' };
  if (Array.isArray(value)) {
    if (value.length === 0) return { kind: 'missing' };
    if (value.length > 1) return { kind: 'invalid', reason: 'the Idempotency-Key header is given more than once' };
    value = value[0]!;
  }
  const raw = value.trim();
  let key: string;
  if (raw.startsWith('"')) {
    const parsed = sfString(raw);
    if (parsed === undefined)
      return { kind: 'invalid', reason: 'a quoted Idempotency-Key must be one Structured Field String (RFC 8941), e.g. "8e03978e-40d5"' };
    key = parsed;
  } else {
    if (!/^[\x21-\x7e]*$/.test(raw) || raw.includes('"') || raw.includes('\\'))
      return { kind: 'invalid', reason: 'the Idempotency-Key must be printable ASCII, e.g. a UUID (quoted, or bare without spaces)' };
    key = raw;
  }
  if (key.length === 0) return { kind: 'invalid', reason: 'the Idempotency-Key is empty' };
  if (key.length > MAX_IDEMPOTENCY_KEY_LENGTH)
    return { kind: 'invalid', reason: `the Idempotency-Key is longer than ${MAX_IDEMPOTENCY_KEY_LENGTH} characters` };
  return { kind: 'key', key };
}

/** An RFC 8941 sf-string that makes up the whole of `raw` (which starts with `"`), unescaped; undefined if it is not one. */
function sfString(raw: string): string | undefined {
  let out = '';
  for (let i = 1; i < raw.length; i++) {
    const c = raw[i]!;
    if (c === '\\') {
      const next = raw[++i];
      if (next !== '"' && next !== '\\') return undefined;
      out += next;
    } else if (c === '"') {
      return i === raw.length - 1 ? out : undefined;
    } else {
      const code = c.charCodeAt(0);
      if (code < 0x20 || code > 0x7e) return undefined;
      out += c;
    }
  }
  return undefined; // no closing quote
}

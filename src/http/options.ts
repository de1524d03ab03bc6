import { InvalidArgumentError } from '../core/errors.js';
import { checkInteger, checkKnownOptions, checkObject, describe, MAX_DURATION_MS } from '../core/validate.js';

export interface HttpBackendOptions {
  /**
   * The lock service (`leasehold serve`): `http://host:7070` or `https://host`, optionally under a
   * base path (`https://proxy/locks` sends `/locks/v1/…`). A bearer token may be given as the
   * URL's user-info (`https://TOKEN@host`, or `https://name:TOKEN@host`, the name ignored) for the
   * places that take only a URL (`LEASEHOLD_URL`, `--url`); it is sent as `Authorization: Bearer`,
   * never as Basic credentials.
   */
  url: string;
  /** Bearer token for a server run with `--auth FILE` (see docs/http-api.md, Security). */
  token?: string;
  /** Extra trusted CA certificates (PEM) for an `https://` server with a private CA, as `node:https` takes them. */
  ca?: string | Buffer | readonly (string | Buffer)[];
  /**
   * Longest wait for one request's answer, beyond the time the server may hold a long poll. Core
   * bounds its own calls by `operationTimeoutMs` (5 s) and gives late answers back; this one ends
   * requests that nothing else bounds (a close, a give-back) on a server that stopped answering.
   * @default 10000
   */
  timeoutMs?: number;
}

/** Defaults of the client, each with its reason. */
export const HTTP_DEFAULTS = Object.freeze({
  /** 10 s: longer than core's 5 s call bound (core's deadline, with its late-answer handling, comes first). */
  timeoutMs: 10_000,
  /**
   * 25 s per long poll (the server allows 60 s): under the 30–60 s idle timeouts of common proxies
   * and load balancers, so a wait is not cut by one of them; a longer wait is asked again at once.
   */
  longPollMs: 25_000,
  /** 1 s: an event stream (watch) that dropped is opened again this soon. */
  reconnectMs: 1_000,
  /** 10 s: a watched key is compared with the server's `inspect` this often, in case an event was missed. */
  watchRefreshMs: 10_000,
  /** 64 MiB: the largest answer read (an `inspect` of many keys); a longer one is a failed call, not memory exhausted. */
  maxAnswerBytes: 64 * 1024 * 1024,
});

/** The options, checked, with the URL split into where requests go and the token. */
export interface ResolvedHttpOptions {
  /** Origin and base path, without credentials. */
  readonly base: URL;
  readonly secure: boolean;
  readonly token: string | undefined;
  readonly ca: string | Buffer | (string | Buffer)[] | undefined;
  readonly timeoutMs: number;
}

/** Checks `options` (each error names the option) and splits the URL. */
export function resolveHttpOptions(options: unknown): ResolvedHttpOptions {
  const o = checkObject(options, 'options');
  checkKnownOptions(o, ['url', 'token', 'ca', 'timeoutMs'], 'options');
  if (typeof o.url !== 'string' || o.url.length === 0)
    throw new InvalidArgumentError('options.url', `expected an http:// or https:// URL, got ${describe(o.url)}`);
  let url: URL;
  try {
    url = new URL(o.url);
  } catch {
    throw new InvalidArgumentError('options.url', `${JSON.stringify(redactUrl(o.url))} is not a valid URL, e.g. http://127.0.0.1:7070`);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new InvalidArgumentError('options.url', `expected an http:// or https:// URL, got ${JSON.stringify(redactUrl(o.url))}`);
  }
  if (url.search !== '' || url.hash !== '') throw new InvalidArgumentError('options.url', 'the lock service URL takes no query or fragment');
  // user-info: `TOKEN@` or `name:TOKEN@` (percent-decoded); never sent as Basic credentials
  const fromUrl = url.password !== '' ? decodeUserInfo(url.password) : url.username !== '' ? decodeUserInfo(url.username) : undefined;
  url.username = '';
  url.password = '';
  if (o.token !== undefined && fromUrl !== undefined) throw new InvalidArgumentError('options.token', 'given both as an option and in the URL: give it once');
  const token = o.token === undefined ? fromUrl : o.token;
  if (token !== undefined && (typeof token !== 'string' || !/^[\x21-\x7e]{1,4096}$/.test(token))) {
    throw new InvalidArgumentError('options.token', 'expected 1–4096 visible ASCII characters (a bearer token)');
  }
  const ca = checkCa(o.ca);
  if (ca !== undefined && url.protocol !== 'https:') throw new InvalidArgumentError('options.ca', 'a CA certificate is for an https:// URL');
  const timeoutMs = o.timeoutMs === undefined ? HTTP_DEFAULTS.timeoutMs : checkInteger(o.timeoutMs, 'options.timeoutMs', 1, MAX_DURATION_MS);
  return { base: url, secure: url.protocol === 'https:', token, ca, timeoutMs };
}

function decodeUserInfo(part: string): string {
  try {
    return decodeURIComponent(part);
  } catch {
    throw new InvalidArgumentError('options.url', 'the token in the URL is not validly percent-encoded');
  }
}

function checkCa(value: unknown): ResolvedHttpOptions['ca'] {
  if (value === undefined) return undefined;
  const one = (v: unknown): v is string | Buffer => (typeof v === 'string' && v.length > 0) || Buffer.isBuffer(v);
  if (one(value)) return value;
  if (Array.isArray(value) && value.length > 0 && value.every(one)) return [...value];
  throw new InvalidArgumentError('options.ca', `expected PEM certificates (a string, a Buffer or an array of them), got ${describe(value)}`);
}

/** A URL fit for a message: user-info (the token) masked, length bounded. */
export function redactUrl(url: string): string {
  const masked = url.replace(/^([a-z][a-z0-9+.-]*:\/\/)[^@/]*@/i, '$1***@');
  return masked.length > 80 ? `${masked.slice(0, 80)}…` : masked;
}

import { InvalidArgumentError, type LeaseholdError } from '../core/errors.js';
import type { Answer } from './transport.js';
import { unavailable } from './transport.js';

/** The service's error body: `{ code, message, field?, holder? }` (docs/http-api.md, Conventions). */
export interface ErrorBody {
  readonly code: string | undefined;
  readonly message: string | undefined;
  /** The field to blame, on a 400 (and on a 404 naming a session that is gone). */
  readonly field: string | undefined;
  readonly holder: string | undefined;
}

/** The error body of an answer, whatever its shape (a proxy's HTML page reads as all undefined). */
export function errorBody(answer: Answer): ErrorBody {
  const b = (typeof answer.body === 'object' && answer.body !== null ? answer.body : {}) as Record<string, unknown>;
  const str = (v: unknown): string | undefined => (typeof v === 'string' && v.length > 0 ? v.slice(0, 2_000) : undefined);
  return { code: str(b.code), message: str(b.message), field: str(b.field), holder: str(b.holder) };
}

/**
 * A refused or failed request as a leasehold error (never a raw HTTP status):
 *
 * - 400 / 413: the input was refused, nothing changed: `InvalidArgumentError` naming the field the
 *   server blames (`limit`, `ttlMs`, …), or `request` when it names none.
 * - 401: `InvalidArgumentError('token')`; 403: `InvalidArgumentError('key')` (or `prefix`, for a
 *   listing: outside the caller's prefixes). Neither gets better by asking again, so core gives up at once.
 * - 404 (an unknown route) and 501: `InvalidArgumentError('url')`: not a lock service of this
 *   version at that URL, or a route its backend does not support.
 * - 429, 5xx (503 BACKEND_UNAVAILABLE, a proxy's 502), anything else: `BackendUnavailableError`
 *   ('http'), retryable.
 *
 * The answers a call expects (409 busy, 410 lost, a 404 of a gone session) are read by the call
 * itself before it comes here.
 */
export function answerError(answer: Answer, what: string, where: string, forbidden: 'key' | 'prefix' = 'key'): LeaseholdError {
  const e = errorBody(answer);
  const said = e.message ?? e.code ?? 'no reason given';
  switch (answer.status) {
    case 400:
    case 413: {
      const field = e.field ?? 'request';
      return new InvalidArgumentError(field, withoutPrefix(said, field));
    }
    case 401:
      return new InvalidArgumentError('token', `the lock service refused the credentials for ${what} (401 ${e.code ?? 'UNAUTHORIZED'}): ${said}`);
    case 403:
      return new InvalidArgumentError(forbidden, `${what} was refused (403 ${e.code ?? 'FORBIDDEN'}): ${said}`);
    case 404:
    case 501:
      return new InvalidArgumentError(
        'url',
        `${where} does not serve ${what} (HTTP ${answer.status} ${e.code ?? ''}): is it a leasehold lock service (v1)? ${said}`,
      );
    default:
      return unavailable(`${what}: HTTP ${answer.status}${e.code ? ` ${e.code}` : ''}: ${said}`);
  }
}

/** The server's message already reads `invalid limit: …` (a leasehold InvalidArgumentError): not twice. */
function withoutPrefix(message: string, field: string): string {
  const prefix = `invalid ${field}: `;
  return message.startsWith(prefix) ? message.slice(prefix.length) : message;
}

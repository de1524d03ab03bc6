/**
 * JSON-schema pieces the routes share. The schemas check types and ranges (the first failure is a
 * 400 naming its field, see errors.ts); the library's own checks (keys, labels, limits against mode)
 * run after them, so a value is refused over HTTP exactly when the library would refuse it.
 */
import { MAX_LIMIT } from '../core/options.js';
import { MAX_DURATION_MS, MIN_TTL_MS } from '../core/validate.js';

/** The longest long poll one acquire request may ask for (docs/http-api.md). */
export const MAX_WAIT_MS = 60_000;

export const ttlMs = { type: 'integer', minimum: MIN_TTL_MS, maximum: MAX_DURATION_MS } as const;
export const durationMs = { type: 'integer', minimum: 0, maximum: MAX_DURATION_MS } as const;
export const waitMs = { type: 'integer', minimum: 0, maximum: MAX_WAIT_MS } as const;
export const limit = { type: 'integer', minimum: 1, maximum: MAX_LIMIT } as const;
export const mode = { type: 'string', enum: ['exclusive', 'shared'] } as const;

/** A body of named optional fields and nothing else (an unknown field is a 400 naming it). */
export function strictBody(properties: Record<string, unknown>, required: readonly string[] = []): Record<string, unknown> {
  return { type: 'object', additionalProperties: false, properties, ...(required.length > 0 && { required }) };
}

/** One path parameter, a non-empty string (its content is checked by the route). */
export function pathParam(name: string): Record<string, unknown> {
  return { type: 'object', additionalProperties: false, required: [name], properties: { [name]: { type: 'string', minLength: 1 } } };
}

/** The error answer, for the OpenAPI document. */
export const errorResponse = {
  type: 'object',
  required: ['code', 'message'],
  properties: { code: { type: 'string' }, message: { type: 'string' }, field: { type: 'string' }, holder: { type: 'string' } },
} as const;

/**
 * Every error answer of the lock service is `{ code, message }` (plus `field` on a 400 when one
 * field is to blame, `holder` on a busy answer), with the status of docs/http-api.md's table:
 * leasehold's own errors by class (never by message text), fastify's by their code, anything else a
 * 500 `INTERNAL` that is logged (a bug: bad input never gets a 5xx).
 */
import type { FastifyError, FastifyReply, FastifyRequest } from 'fastify';
import {
  AcquireTimeoutError,
  BackendUnavailableError,
  ClosedError,
  InvalidArgumentError,
  LeaseholdError,
  LeaseLostError,
  type ErrorCode,
} from '../core/errors.js';

/** The service's own codes, beside leasehold's. */
export type ServiceCode = 'UNAUTHORIZED' | 'FORBIDDEN' | 'NOT_FOUND' | 'PAYLOAD_TOO_LARGE' | 'RATE_LIMITED' | 'NOT_SUPPORTED' | 'SUPERSEDED' | 'INTERNAL';

/** An error answer: its status, code and message (and extras such as `field`, `holder`). */
export interface ErrorBody {
  readonly code: ErrorCode | ServiceCode;
  readonly message: string;
  readonly field?: string;
  readonly holder?: string;
}

/** An answer of the service's own (401, 403, 404, 409 SUPERSEDED, 413, 429, 501), thrown from a hook or a route. */
export class ServiceError extends Error {
  override readonly name = 'ServiceError';
  constructor(
    readonly statusCode: number,
    readonly code: ServiceCode,
    message: string,
    /** The request field the answer is about (`session` on a 404 for a session that is gone). */
    readonly field?: string,
  ) {
    super(message);
  }
}

export const unauthorized = (): ServiceError => new ServiceError(401, 'UNAUTHORIZED', 'missing or unknown bearer token (Authorization: Bearer <token>)');
export const forbidden = (what: string): ServiceError => new ServiceError(403, 'FORBIDDEN', `${what} is outside this caller's key prefixes`);
export const notFound = (what: string, field?: string): ServiceError => new ServiceError(404, 'NOT_FOUND', what, field);
/** The acquire's wait was taken over by a later request with the same Idempotency-Key (routes/locks.ts). */
export const superseded = (): ServiceError =>
  new ServiceError(409, 'SUPERSEDED', 'a later acquire with the same Idempotency-Key took this wait over (its queue place goes on with it)');
export const notSupported = (what: string): ServiceError => new ServiceError(501, 'NOT_SUPPORTED', what);

/** Status and body of an error that escaped a route or a hook. */
export function errorAnswer(error: unknown): { status: number; body: ErrorBody } {
  if (error instanceof ServiceError)
    return { status: error.statusCode, body: { code: error.code, message: error.message, ...(error.field !== undefined && { field: error.field }) } };
  if (error instanceof LeaseholdError) return leaseholdAnswer(error);
  const fe = error as Partial<FastifyError> | null;
  if (fe && typeof fe === 'object' && typeof fe.code === 'string') {
    const fastify = fastifyAnswer(fe as FastifyError);
    if (fastify) return fastify;
  }
  return { status: 500, body: { code: 'INTERNAL', message: 'internal error (logged by the server)' } };
}

function leaseholdAnswer(error: LeaseholdError): { status: number; body: ErrorBody } {
  if (error instanceof InvalidArgumentError) {
    const field = fieldOf(error.argument);
    // Core names an acquire option `options.ttlMs`; over HTTP it is the body's `ttlMs`.
    const message = field === error.argument ? error.message : error.message.replace(`invalid ${error.argument}:`, `invalid ${field}:`);
    return { status: 400, body: { code: error.code, message, field } };
  }
  if (error instanceof AcquireTimeoutError)
    return { status: 409, body: { code: error.code, message: error.message, ...(error.holder !== undefined && { holder: error.holder }) } };
  if (error instanceof LeaseLostError) return { status: 410, body: { code: error.code, message: error.message } };
  if (error instanceof ClosedError)
    return { status: 503, body: { code: error.code, message: 'the server is shutting down; try again (another server, or this one after its restart)' } };
  if (error instanceof BackendUnavailableError) return { status: 503, body: { code: error.code, message: error.message } };
  // STALE_TOKEN, PARTIAL_WRITE, IDEMPOTENCY_MISMATCH: nothing the routes do raises them.
  return { status: 500, body: { code: 'INTERNAL', message: error.message } };
}

/** `options.ttlMs` (core's name for an acquire option) is the body's `ttlMs`. */
function fieldOf(argument: string): string {
  return argument.startsWith('options.') ? argument.slice('options.'.length) : argument;
}

/** The statuses of fastify's own errors: malformed input is a 400 naming what it can. */
function fastifyAnswer(error: FastifyError): { status: number; body: ErrorBody } | undefined {
  switch (error.code) {
    case 'FST_ERR_VALIDATION':
      return { status: 400, body: validationBody(error) };
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return { status: 413, body: { code: 'PAYLOAD_TOO_LARGE', message: 'the request body is over the limit (64 KiB)' } };
    case 'FST_ERR_CTP_INVALID_JSON_BODY':
      return { status: 400, body: { code: 'INVALID_ARGUMENT', message: 'invalid body: not valid JSON', field: 'body' } };
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
    case 'FST_ERR_CTP_INVALID_CONTENT_LENGTH':
      return { status: 400, body: { code: 'INVALID_ARGUMENT', message: 'invalid content-type: bodies are JSON (application/json)', field: 'content-type' } };
    case 'FST_ERR_BAD_URL':
      return { status: 400, body: { code: 'INVALID_ARGUMENT', message: 'invalid path: a segment is not valid percent-encoded UTF-8', field: 'path' } };
    case 'FST_ERR_MAX_PARAM_LENGTH':
      return { status: 400, body: { code: 'INVALID_ARGUMENT', message: 'invalid path: a segment is too long', field: 'path' } };
    default:
      // Any other client error fastify raises (4xx) keeps its status; it is the request's fault.
      if (typeof error.statusCode === 'number' && error.statusCode >= 400 && error.statusCode < 500)
        return { status: error.statusCode, body: { code: 'INVALID_ARGUMENT', message: error.message } };
      return undefined;
  }
}

interface AjvError {
  keyword: string;
  instancePath: string;
  params: Record<string, unknown>;
  message?: string;
}

/** A schema failure, as `invalid <field>: <problem>`, the field named as the library names it. */
function validationBody(error: FastifyError): ErrorBody {
  const first = (error.validation as AjvError[] | undefined)?.[0];
  const where = (error as { validationContext?: string }).validationContext ?? 'body';
  if (!first) return { code: 'INVALID_ARGUMENT', message: `invalid ${where}`, field: where };
  let field = first.instancePath.replace(/^\//, '').replace(/\//g, '.');
  let problem = first.message ?? 'is invalid';
  if (first.keyword === 'additionalProperties') {
    field = joinField(field, String(first.params.additionalProperty));
    problem = 'unknown field';
  } else if (first.keyword === 'required') {
    field = joinField(field, String(first.params.missingProperty));
    problem = 'is required';
  } else if (first.keyword === 'enum') {
    problem = `expected one of ${(first.params.allowedValues as unknown[]).map((v) => JSON.stringify(v)).join(', ')}`;
  }
  if (field === '') field = where === 'querystring' ? 'query' : where;
  return { code: 'INVALID_ARGUMENT', message: `invalid ${field}: ${problem}`, field };
}

function joinField(parent: string, name: string): string {
  return parent === '' ? name : `${parent}.${name}`;
}

/** The app's error handler: the answer of {@link errorAnswer}; 5xx other than 503 are logged (no URL, see app.ts). */
export function sendError(error: unknown, request: FastifyRequest, reply: FastifyReply): FastifyReply {
  const { status, body } = errorAnswer(error);
  if (status >= 500 && status !== 503) request.log.error({ err: error }, 'internal error');
  return reply.status(status).type('application/json; charset=utf-8').send(body);
}

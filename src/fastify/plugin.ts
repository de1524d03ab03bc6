import type { FastifyInstance, FastifyPluginAsync, FastifyReply, FastifyRequest } from 'fastify';
import { AcquireTimeoutError, BackendUnavailableError, IdempotencyMismatchError, InvalidArgumentError } from '../core/errors.js';
import { createIdempotency, type IdempotencyOptions, type IdempotentResult } from '../core/idempotency.js';
import type { Lease } from '../core/lease.js';
import { checkInteger, checkKnownOptions, checkObject, describe } from '../core/validate.js';
import { parseIdempotencyKey } from './header.js';

/** What `run` needs of an idempotency: `createIdempotency(...)`'s, typed structurally. */
export interface IdempotencyRunner {
  run<T>(key: string, options: { payload?: unknown } | undefined, fn: (lease: Lease) => T | Promise<T>): Promise<IdempotentResult<T>>;
}

/** A route's `config.idempotency`: `false` opts the route out, `true` in (any method), an object in with its own `required`. */
export type IdempotencyRouteConfig = boolean | { required?: boolean };

export interface FastifyIdempotencyOptions {
  /**
   * `createIdempotency({ locks, store, ... })`, or its options (the plugin creates it, with
   * `waitMs: 0` unless you give one: a repeat while the first request runs is answered 409 at
   * once, as the draft says; with a `waitMs` it waits that long for the first one's response).
   */
  idempotency: IdempotencyRunner | IdempotencyOptions<unknown>;
  /** A request without the header is refused with 400 (`true`, or a function of the request saying so); otherwise it runs without idempotency. @default false */
  required?: boolean | ((request: FastifyRequest) => boolean);
  /** The methods whose routes honour the header unless a route says otherwise (`config: { idempotency }`). @default ['POST', 'PATCH'] */
  methods?: readonly string[];
  /** The largest response body stored, in bytes; a larger one is sent but not stored (a retry runs again), and says so. @default 1048576 (1 MiB) */
  maxBodyBytes?: number;
  /** The response headers stored and replayed with the status and body (lower case). @default FASTIFY_IDEMPOTENCY_DEFAULTS.headers */
  headers?: readonly string[];
  /**
   * Scopes the key, e.g. by the authenticated client, so one client cannot replay another's
   * response with the same key and request: the record's key is `<scope>:<Idempotency-Key>`.
   * @default none (keys are global to the store)
   */
  scope?: (request: FastifyRequest) => string;
}

export const FASTIFY_IDEMPOTENCY_DEFAULTS = Object.freeze({
  /** The draft's examples: POST and PATCH are the methods that are not idempotent by definition. */
  methods: Object.freeze(['POST', 'PATCH']) as readonly string[],
  /** 1 MiB: a record is one value in the store, read on every repeat; larger answers are rarely the result of a create. */
  maxBodyBytes: 1_048_576,
  /** What says what the body is and where the created thing lives; not Set-Cookie (a session is not the request's result). */
  headers: Object.freeze([
    'content-type',
    'content-encoding',
    'content-language',
    'content-location',
    'location',
    'etag',
    'last-modified',
    'link',
    'cache-control',
  ]) as readonly string[],
  /** Set to `true` on a replayed response (Stripe's name for it). */
  replayedHeader: 'idempotent-replayed',
  /** Set to `false` on a response that was too large (or a stream) to store: a repeat of the request runs the route again. */
  storedHeader: 'idempotency-stored',
  /** 0 ms: a repeat while the first request runs is a 409 at once (when the plugin creates the idempotency). */
  waitMs: 0,
});

/** What is stored per request: the status, the headers that matter, the body (base64 when it was bytes). */
interface StoredResponse {
  status: number;
  headers: Record<string, string | string[]>;
  body: string | null;
  base64?: true;
}

/** A request whose route runs under a claim: settling `outcome` lets `run` store (or give the key back). */
interface Attempt {
  settle: (response: StoredResponse | Error) => void;
  run: Promise<IdempotentResult<StoredResponse>>;
  error: unknown;
  done: boolean;
}

/** The reason a response was not stored, given to `run` as fn's failure (the claim is removed). */
class NotStored extends Error {}

/** An error answer of the plugin: `{ code, message }`. */
function refuse(reply: FastifyReply, status: number, code: string, message: string): FastifyReply {
  return reply.code(status).type('application/json; charset=utf-8').send({ code, message });
}

async function plugin(fastify: FastifyInstance, options: FastifyIdempotencyOptions): Promise<void> {
  const o = checkObject(options, 'options');
  checkKnownOptions(o, ['idempotency', 'required', 'methods', 'maxBodyBytes', 'headers', 'scope'], 'options');
  const idem = runnerOf(o.idempotency);
  const required = (o.required ?? false) as boolean | ((request: FastifyRequest) => boolean);
  if (typeof required !== 'boolean' && typeof required !== 'function')
    throw new InvalidArgumentError('options.required', `expected a boolean or a function of the request, got ${describe(required)}`);
  const methods = new Set(stringList(o.methods, 'options.methods', FASTIFY_IDEMPOTENCY_DEFAULTS.methods).map((m) => m.toUpperCase()));
  const maxBodyBytes =
    o.maxBodyBytes === undefined ? FASTIFY_IDEMPOTENCY_DEFAULTS.maxBodyBytes : checkInteger(o.maxBodyBytes, 'options.maxBodyBytes', 0, 2 ** 31 - 1);
  const kept = stringList(o.headers, 'options.headers', FASTIFY_IDEMPOTENCY_DEFAULTS.headers).map((h) => h.toLowerCase());
  const scope = o.scope as ((request: FastifyRequest) => string) | undefined;
  if (scope !== undefined && typeof scope !== 'function') throw new InvalidArgumentError('options.scope', `expected a function, got ${describe(scope)}`);

  const attempts = new WeakMap<FastifyRequest, Attempt>();
  if (!fastify.hasRequestDecorator('idempotencyLease')) fastify.decorateRequest('idempotencyLease', null);

  fastify.addHook('preHandler', async (request, reply) => {
    const config = (request.routeOptions.config as { idempotency?: unknown } | undefined)?.idempotency;
    if (request.is404 || config === false || (config === undefined && !methods.has(request.method))) return;
    const routeRequired = typeof config === 'object' && config !== null && 'required' in config ? Boolean(config.required) : undefined;
    const parsed = parseIdempotencyKey(request.headers['idempotency-key']);
    if (parsed.kind === 'invalid') return refuse(reply, 400, 'IDEMPOTENCY_KEY_INVALID', parsed.reason);
    if (parsed.kind === 'missing') {
      if (routeRequired ?? (typeof required === 'function' ? required(request) : required))
        return refuse(reply, 400, 'IDEMPOTENCY_KEY_MISSING', `${request.method} ${request.routeOptions.url} requires an Idempotency-Key header`);
      return;
    }
    const key = scope ? `${scope(request)}:${parsed.key}` : parsed.key;
    // The request, as far as it decides the result: the same key with another request is a 422.
    const payload = { method: request.method, url: request.url, body: hashable(request.body) };

    let started!: () => void;
    const claimed = new Promise<'claimed'>((resolve) => (started = () => resolve('claimed')));
    let settle!: Attempt['settle'];
    const outcome = new Promise<StoredResponse>((resolve, reject) => (settle = (r) => (r instanceof Error ? reject(r) : resolve(r))));
    const run = idem.run<StoredResponse>(key, { payload }, (lease) => {
      request.idempotencyLease = lease;
      started();
      return outcome;
    });
    run.catch(() => {}); // awaited below or in onSend
    let first: 'claimed' | IdempotentResult<StoredResponse>;
    try {
      first = await Promise.race([claimed, run]);
    } catch (error) {
      if (error instanceof AcquireTimeoutError)
        return refuse(reply, 409, 'IDEMPOTENCY_IN_PROGRESS', 'a request with this Idempotency-Key is still being processed; retry later');
      if (error instanceof IdempotencyMismatchError)
        return refuse(reply, 422, 'IDEMPOTENCY_MISMATCH', 'this Idempotency-Key was used with another request (method, URL or body)');
      if (error instanceof BackendUnavailableError) return refuse(reply, 503, 'BACKEND_UNAVAILABLE', error.message);
      throw error;
    }
    if (first === 'claimed') {
      attempts.set(request, { settle, run, error: undefined, done: false });
      return;
    }
    const stored = first.value;
    reply.code(stored.status);
    for (const [name, value] of Object.entries(stored.headers)) reply.header(name, value);
    reply.header(FASTIFY_IDEMPOTENCY_DEFAULTS.replayedHeader, 'true');
    return reply.send(stored.body === null ? undefined : stored.base64 ? Buffer.from(stored.body, 'base64') : stored.body);
  });

  // A thrown error (the route's, or a later hook's) is not the request's result: the key is given back.
  fastify.addHook('onError', async (request, _reply, error) => {
    const attempt = attempts.get(request);
    if (attempt && !attempt.done) attempt.error ??= error;
  });

  fastify.addHook('onSend', async (request, reply, payload) => {
    const attempt = attempts.get(request);
    if (!attempt || attempt.done) return payload;
    attempt.done = true;
    let notStored: string | undefined;
    if (attempt.error !== undefined) attempt.settle(attempt.error instanceof Error ? attempt.error : new Error(String(attempt.error)));
    else if (reply.statusCode >= 500) attempt.settle(new NotStored(`status ${reply.statusCode}`));
    else {
      const body = capture(payload);
      if (body === undefined) notStored = 'the body is a stream';
      else if (body.bytes > maxBodyBytes) notStored = `the body is ${body.bytes} bytes, more than maxBodyBytes (${maxBodyBytes})`;
      if (body === undefined || notStored !== undefined) attempt.settle(new NotStored(notStored));
      else {
        const headers: Record<string, string | string[]> = {};
        for (const name of kept) {
          const value = reply.getHeader(name);
          if (value !== undefined) headers[name] = Array.isArray(value) ? value.map(String) : String(value);
        }
        attempt.settle({ status: reply.statusCode, headers, ...body.stored });
      }
    }
    try {
      await attempt.run;
    } catch (error) {
      if (error instanceof NotStored) {
        if (notStored !== undefined) {
          reply.header(FASTIFY_IDEMPOTENCY_DEFAULTS.storedHeader, 'false');
          request.log.warn(
            { idempotencyKey: request.headers['idempotency-key'] },
            `idempotency: response not stored (${notStored}); a repeat runs the route again`,
          );
        }
      } else if (error !== attempt.error) {
        // The response stands (the route ran); only its record could not be written: a takeover
        // refused it (StaleTokenError: another attempt's result is the stored one) or the store failed.
        request.log.error({ err: error, idempotencyKey: request.headers['idempotency-key'] }, 'idempotency: the response could not be stored');
      }
    }
    return payload;
  });

  // A request that ends without onSend (a response never sent) gives its key back.
  fastify.addHook('onResponse', async (request) => {
    const attempt = attempts.get(request);
    if (!attempt || attempt.done) return;
    attempt.done = true;
    attempt.settle(new NotStored('no response was sent'));
    await attempt.run.catch(() => {});
  });
}

function runnerOf(value: unknown): IdempotencyRunner {
  const v = value as { run?: unknown; locks?: unknown; store?: unknown } | null | undefined;
  if (typeof v === 'object' && v !== null && typeof v.run === 'function') return v as IdempotencyRunner;
  if (typeof v === 'object' && v !== null && v.locks !== undefined && v.store !== undefined)
    return createIdempotency({ waitMs: FASTIFY_IDEMPOTENCY_DEFAULTS.waitMs, ...(v as IdempotencyOptions<unknown>) });
  throw new InvalidArgumentError('options.idempotency', `expected createIdempotency(...) or its options ({ locks, store }), got ${describe(value)}`);
}

function stringList(value: unknown, argument: string, fallback: readonly string[]): string[] {
  if (value === undefined) return [...fallback];
  if (!Array.isArray(value) || value.some((v) => typeof v !== 'string' || v === ''))
    throw new InvalidArgumentError(argument, `expected an array of names, got ${describe(value)}`);
  return value as string[];
}

/** The request body as the payload hash can take it (bytes as base64). */
function hashable(body: unknown): unknown {
  if (Buffer.isBuffer(body) || body instanceof Uint8Array) return { base64: Buffer.from(body).toString('base64') };
  return body;
}

/** The serialized payload of onSend as stored, with its size; undefined for a stream. */
function capture(payload: unknown): { bytes: number; stored: Pick<StoredResponse, 'body' | 'base64'> } | undefined {
  if (payload === null || payload === undefined) return { bytes: 0, stored: { body: null } };
  if (typeof payload === 'string') return { bytes: Buffer.byteLength(payload), stored: { body: payload } };
  if (payload instanceof Uint8Array) return { bytes: payload.byteLength, stored: { body: Buffer.from(payload).toString('base64'), base64: true } };
  return undefined;
}

/**
 * The `Idempotency-Key` plugin (draft-ietf-httpapi-idempotency-key-header) over leasehold's
 * idempotency: register it before the routes it covers (it is not encapsulated, like
 * fastify-plugin's). On the routes it covers (POST and PATCH by default; a route's
 * `config: { idempotency: false | true | { required } }` says otherwise), a request with the header
 * claims its key with a lease and runs the route; the status, the headers that matter and the body
 * are stored when the route answered without throwing and below 500. A repeat gets them again, with
 * `Idempotent-Replayed: true`. Refusals are `{ code, message }` JSON:
 *
 * - 400 `IDEMPOTENCY_KEY_MISSING`: no header on a route that requires one; 400 `IDEMPOTENCY_KEY_INVALID`: not a key.
 * - 409 `IDEMPOTENCY_IN_PROGRESS`: the first request with this key is still running.
 * - 422 `IDEMPOTENCY_MISMATCH`: the key was used with another request (method, URL or body).
 * - 503 `BACKEND_UNAVAILABLE`: the coordinator or the store did not answer.
 *
 * Not stored (the key is given back, and a repeat runs the route again): an error thrown by the
 * route or a hook after the claim, a status of 500 or more, a body larger than `maxBodyBytes` or a
 * stream (these two say so: `Idempotency-Stored: false` and a warning in the log). The route's
 * handler finds its claim's lease in `request.idempotencyLease` (null when not covered), to pass
 * `lease.token` to a fence.
 */
export const fastifyIdempotency: FastifyPluginAsync<FastifyIdempotencyOptions> = Object.assign(plugin, {
  [Symbol.for('skip-override')]: true,
  [Symbol.for('fastify.display-name')]: 'leasehold-idempotency',
  [Symbol.for('plugin-meta')]: { name: 'leasehold-idempotency', fastify: '5.x' },
});

declare module 'fastify' {
  interface FastifyRequest {
    /** The lease of this request's idempotency claim (leasehold/fastify): its token fences the route's writes. Null when the route is not covered. */
    idempotencyLease: Lease | null;
  }
  interface FastifyContextConfig {
    /** leasehold/fastify: `false` opts the route out, `true` in (any method), `{ required }` in, requiring the header or not. */
    idempotency?: IdempotencyRouteConfig;
  }
}

/**
 * The lock service's fastify app (`leasehold serve`; docs/http-api.md is its contract): strict JSON
 * bodies, bearer-token callers, a per-caller rate limit, and the routes, each module registering its
 * own (routes/*.ts) over one shared {@link ServeContext}. Stateless: everything a later request needs
 * is in the handles the clients hold, so servers over one backend are interchangeable and a restart
 * loses nothing.
 */
import { createRequire } from 'node:module';
import type { FastifyInstance, FastifyRequest, FastifyServerOptions } from 'fastify';
import type { Backend } from '../core/backend.js';
import { systemClock, type Clock } from '../core/clock.js';
import { ClosedError, InvalidArgumentError } from '../core/errors.js';
import { TypedEmitter, type LockEvents } from '../core/events.js';
import { guardBackend } from '../core/guard.js';
import { Locks } from '../core/locks.js';
import { DEFAULTS } from '../core/options.js';
import { requirePeer } from '../core/peer.js';
import { checkInteger, describe, MAX_DURATION_MS } from '../core/validate.js';
import { backendLoader } from '../connect.js';
import { authenticate, type AuthConfig } from './auth.js';
import { CallerRateStore } from './rate-limit.js';
import type { SequencerKeys } from '../core/sequencer-sign.js';
import { callerOf, setCaller, type RouteModule, type ServeContext } from './context.js';
import { sendError, ServiceError, unauthorized } from './errors.js';
import { signingKeys } from './sequencers.js';
import { registerOpenApi, openApiRoutes } from './openapi.js';
import { dashboardRoutes } from './routes/dashboard.js';
import { eventRoutes } from './routes/events.js';
import { healthRoutes } from './routes/health.js';
import { leaseRoutes } from './routes/leases.js';
import { lockRoutes } from './routes/locks.js';
import { metricsRoutes } from './routes/metrics.js';
import { sessionRoutes } from './routes/sessions.js';

/** The service's defaults, each with its reason. */
export const SERVE_DEFAULTS = Object.freeze({
  /** 1,000 requests/s per caller: a busy client renewing thousands of leases fits; a loop gone wrong does not take the server. */
  rateLimit: 1_000,
  /** 64 KiB: the largest legitimate body (an acquire with a 1 KiB key and a label) is far smaller. */
  bodyLimit: 64 * 1024,
  /** 10 s to send a whole request: a client that trickles its headers or body is cut off. */
  requestTimeoutMs: 10_000,
  /** A connection silent this long is closed: longer than the longest long poll (60 s), so a waiting request is never cut. */
  connectionTimeoutMs: 75_000,
  /** An idle keep-alive connection is closed after 10 s. */
  keepAliveTimeoutMs: 10_000,
});

/** Longest path segment (a key of 1,024 UTF-8 bytes, percent-encoded, is 3,072 characters; a lease handle under 2,000). */
const MAX_PARAM_LENGTH = 4096;

/** The routes of version 1, in registration order. */
const ROUTES: readonly RouteModule[] = [sessionRoutes, lockRoutes, leaseRoutes, healthRoutes, eventRoutes, metricsRoutes, openApiRoutes, dashboardRoutes];

export interface LockServerOptions {
  /** The coordinator's URL (as for `createLocks`): the server opens it, and closes it when it closes. */
  readonly url?: string;
  /** Or the backend itself (or its loader): the server uses it and never closes it (it is the caller's). */
  readonly backend?: Backend | (() => Promise<Backend>);
  /** The `--auth` callers (auth.ts: `loadAuthFile`); undefined: every request is `anonymous` with prefix "". */
  readonly auth?: AuthConfig;
  /** Requests per second per caller, beyond which a 429. @default 1000 */
  readonly rateLimit?: number;
  /** Longest single backend call (beyond it, 503). @default 5000 */
  readonly operationTimeoutMs?: number;
  /** fastify's logger options (pino): requests are logged by route pattern, never by URL (handles are secrets). @default false */
  readonly logger?: boolean | { level?: string; stream?: { write(line: string): unknown } };
  /** TLS: PEM certificate and key (`--tls-cert`, `--tls-key`). */
  readonly https?: { readonly cert: string | Buffer; readonly key: string | Buffer };
  /** @default SERVE_DEFAULTS.requestTimeoutMs, connectionTimeoutMs, keepAliveTimeoutMs */
  readonly timeouts?: { readonly requestMs?: number; readonly connectionMs?: number; readonly keepAliveMs?: number };
  /** Monotonic clock of the waits and call bounds (tests). @default systemClock */
  readonly clock?: Clock;
  /** Wall clock, ms since the epoch, for min-hold deadlines (tests). @default Date.now */
  readonly wallNow?: () => number;
  /** Route modules registered after the built-in ones, with the same context. */
  readonly routes?: readonly RouteModule[];
  /**
   * Signs the sequencers the server issues (`--sequencer-key`; `loadSequencerKey` reads the file):
   * a secret (HMAC-SHA-256) or an Ed25519 private key, or several (the first signs, any verifies on
   * POST /v1/sequencers/check). @default none: sequencers are unsigned (`lh1.`)
   */
  readonly sequencerKey?: SequencerKeys;
}

const OPTION_NAMES = ['url', 'backend', 'auth', 'rateLimit', 'operationTimeoutMs', 'logger', 'https', 'timeouts', 'clock', 'wallNow', 'routes', 'sequencerKey'];

/** The fastify app with the server's context on it (`app.leasehold`), not listening yet. */
export type LockServerApp = FastifyInstance & { readonly leasehold: ServeContext };

/**
 * Builds the lock service's app, not listening (`inject` works; `startLockServer` listens). Loads
 * the backend now: a URL it cannot use is an `InvalidArgumentError` here, not at the first request.
 * `app.close()` ends waiting long polls (503 CLOSED), then closes the backend if the server opened it.
 */
export async function createLockServer(options: LockServerOptions): Promise<LockServerApp> {
  const o = checkOptions(options);
  // Checked before the backend is opened, so a bad key leaves nothing open.
  const sequencerKey = o.sequencerKey === undefined ? undefined : signingKeys(o.sequencerKey, 'options.sequencerKey');
  const fastify = requirePeer<typeof import('fastify')>(createRequire(import.meta.url), 'fastify', 'leasehold serve');
  const rateLimit = requirePeer<typeof import('@fastify/rate-limit')>(createRequire(import.meta.url), '@fastify/rate-limit', 'leasehold serve');

  const owned = o.url !== undefined;
  const source = o.url !== undefined ? backendLoader(o.url) : o.backend!;
  const raw = typeof source === 'function' ? await source() : source;
  // A backend the caller passed stays open when the server closes: it is theirs (as with a client
  // passed to a backend). Called through, never copied: a backend may be a class instance whose
  // methods live on its prototype and use its private fields (etcd's).
  const backend = guardBackend(raw, { closesBackend: owned });
  const clock = o.clock ?? systemClock;
  const operationTimeoutMs = o.operationTimeoutMs ?? DEFAULTS.operationTimeoutMs;
  const closing = new AbortController();
  const ctx: ServeContext = {
    backend,
    locks: new Locks({ backend, clock, holderName: 'leasehold serve', operationTimeoutMs }),
    auth: o.auth,
    clock,
    wallNow: o.wallNow ?? Date.now,
    operationTimeoutMs,
    events: new TypedEmitter<LockEvents>(),
    closing: closing.signal,
    acquiring: new Set(),
    ownerWaits: new Map(),
    sequencerKey,
  };

  const timeouts = { ...o.timeouts };
  const app = fastify.default({
    logger: loggerOptions(o.logger),
    // Requests are logged below by route pattern: fastify's own lines carry the URL, and URLs carry handles.
    // (fastify 5.12 moved the switch into a LogController; earlier 5.x read the top-level option.)
    ...(fastify.LogController ? { logController: new fastify.LogController({ disableRequestLogging: true }) } : { disableRequestLogging: true }),
    bodyLimit: SERVE_DEFAULTS.bodyLimit,
    requestTimeout: timeouts.requestMs ?? SERVE_DEFAULTS.requestTimeoutMs,
    connectionTimeout: timeouts.connectionMs ?? SERVE_DEFAULTS.connectionTimeoutMs,
    keepAliveTimeout: timeouts.keepAliveMs ?? SERVE_DEFAULTS.keepAliveTimeoutMs,
    // Open long polls must not hold close() up (they are ended by `closing` too).
    forceCloseConnections: true,
    // Answered by the hook below in the service's own format.
    return503OnClosing: false,
    routerOptions: { maxParamLength: MAX_PARAM_LENGTH },
    // Bodies are strict: no coercion ("5" is not 5), no silently dropped fields, no defaults filled in.
    ajv: { customOptions: { coerceTypes: false, removeAdditional: false, useDefaults: false, allErrors: false } },
    frameworkErrors: (error, request, reply) => void sendError(error, request, reply),
    ...(o.https && { https: { cert: o.https.cert, key: o.https.key } }),
  }) as unknown as FastifyInstance;

  app.decorate('leasehold', ctx);
  app.setErrorHandler((error, request, reply) => sendError(error, request, reply));
  app.setNotFoundHandler((request, reply) =>
    sendError(new ServiceError(404, 'NOT_FOUND', `no route ${request.method} ${routeShape(request.url)}`), request, reply),
  );
  jsonBodies(app);

  app.addHook('onRequest', async (request) => {
    if (closing.signal.aborted) throw new ClosedError('lock server');
    const caller = authenticate(o.auth, request.headers.authorization);
    if (!caller) throw unauthorized();
    setCaller(request, caller);
  });
  // A route without a body (or a POST sent without one) reads as {}: its schema still refuses unknown fields.
  app.addHook('preValidation', async (request) => {
    if (request.body === undefined || request.body === null) request.body = {};
  });
  app.addHook('onResponse', async (request, reply) => {
    request.log.info(
      { method: request.method, route: request.routeOptions.url ?? '(no route)', status: reply.statusCode, ms: Math.round(reply.elapsedTime) },
      'request',
    );
  });
  app.addHook('preClose', async () => {
    closing.abort(new ClosedError('lock server'));
    // Each waiting acquire now ends (503 CLOSED) and its answer is written before close() cuts the connections.
    await Promise.allSettled([...ctx.acquiring]);
  });
  app.addHook('onClose', async () => {
    await ctx.locks.close();
  });

  await app.register(rateLimit.default, {
    global: true,
    store: CallerRateStore,
    max: o.rateLimit ?? SERVE_DEFAULTS.rateLimit,
    timeWindow: 1_000,
    keyGenerator: (request: FastifyRequest) => `caller:${callerOf(request).name}`,
    errorResponseBuilder: (_request: FastifyRequest, context: { max: number; after: string }) =>
      new ServiceError(429, 'RATE_LIMITED', `over ${context.max} requests per second for this caller; retry in ${context.after}`),
  });
  // Before any route: the OpenAPI document is collected from the routes as they are registered.
  await registerOpenApi(app, ctx);
  for (const routes of [...ROUTES, ...(o.routes ?? [])]) routes(app, ctx);
  return app as LockServerApp;
}

function checkOptions(options: LockServerOptions): LockServerOptions {
  if (typeof options !== 'object' || options === null) throw new InvalidArgumentError('options', `expected an options object, got ${describe(options)}`);
  for (const name of Object.keys(options)) {
    if (!OPTION_NAMES.includes(name)) throw new InvalidArgumentError(`options.${name}`, `unknown option; expected one of ${OPTION_NAMES.join(', ')}`);
  }
  if ((options.url === undefined) === (options.backend === undefined)) throw new InvalidArgumentError('options', 'expected exactly one of url and backend');
  if (options.rateLimit !== undefined) checkInteger(options.rateLimit, 'options.rateLimit', 1, 1_000_000);
  if (options.operationTimeoutMs !== undefined) checkInteger(options.operationTimeoutMs, 'options.operationTimeoutMs', 1, MAX_DURATION_MS);
  return options;
}

/** Every body is JSON; an empty one (with or without a content-type) is no body. */
function jsonBodies(app: FastifyInstance): void {
  const json = app.getDefaultJsonParser('error', 'error');
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('application/json', { parseAs: 'string' }, (request, body, done) => {
    if (body === '') done(null, undefined);
    else json(request, body as string, done);
  });
}

/**
 * fastify's logger with request lines reduced to method and route pattern: lease and session handles
 * travel in URLs, and they are secrets (the `req` serializer is what fastify's error lines use).
 */
function loggerOptions(logger: LockServerOptions['logger']): FastifyServerOptions['logger'] {
  if (!logger) return false;
  const base = logger === true ? {} : logger;
  return {
    level: base.level ?? 'info',
    ...(base.stream && { stream: base.stream }),
    serializers: {
      req: (request: FastifyRequest) => ({ method: request.method, route: request.routeOptions?.url ?? '(no route)' }),
    },
  } as FastifyServerOptions['logger'];
}

/** A URL in a 404 message: its path's first two segments, never the rest (it may hold a handle). */
function routeShape(url: string): string {
  const path = url.split('?')[0] ?? '';
  const parts = path.split('/').slice(0, 3);
  return parts.join('/') + (path.split('/').length > 3 ? '/…' : '');
}

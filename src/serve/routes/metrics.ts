/**
 * `GET /metrics`: Prometheus text (docs/http-api.md, "Observing"). prom-client is an optional peer:
 * without it the server runs as before and this route answers 501 NOT_SUPPORTED.
 *
 * - the library's client series (src/metrics `instrumentLocks`) of the acquires the server makes
 *   for its callers: `leasehold_acquire_total{outcome}`, `leasehold_acquire_wait_seconds`. The
 *   server keeps no lease after answering (its callers renew and release them, through any
 *   server), so the series about holding (held time, leases held, losses, renewals) stay empty.
 * - `leasehold_http_requests_total{route,method,status}`, `leasehold_http_open_sessions`,
 *   `leasehold_http_long_polls`.
 *
 * No key, handle, session id or caller is ever a label (keys are unbounded; handles are secrets).
 */
import { createHash } from 'node:crypto';
import { createRequire } from 'node:module';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { InvalidArgumentError } from '../../core/errors.js';
import { requirePeer } from '../../core/peer.js';
import type { Locks } from '../../core/locks.js';
import { type InstrumentLocksOptions, instrumentLocks } from '../../metrics/prometheus.js';
import { callerOf, type RouteModule, type ServeContext } from '../context.js';
import { notSupported } from '../errors.js';

/** The route patterns whose answers the session and long-poll gauges follow (registered by sessions.ts and locks.ts). */
const OPEN_SESSION = '/v1/sessions';
const KEEP_ALIVE = '/v1/sessions/:session/keepalive';
const CLOSE_SESSION = '/v1/sessions/:session';
const ACQUIRE = '/v1/locks/:key/acquire';

/** The label of a request no route matched (a 404, or a 401 before routing told). */
const NO_ROUTE = '(no route)';
/** The status label of a request whose client went away before its answer was written. */
const ABORTED = 'aborted';

/** Sessions are pruned (ttl run out) at each scrape, and at every this many opened between scrapes. */
const PRUNE_EVERY = 1_000;

/** The few parts of prom-client used here, typed structurally (the package is an optional peer). */
interface PromClient {
  Registry: new () => PromRegistry;
  Counter: new (config: { name: string; help: string; labelNames: string[]; registers: PromRegistry[] }) => PromCounter;
  Gauge: new (config: { name: string; help: string; registers: PromRegistry[]; collect(this: { set(value: number): void }): void }) => unknown;
}
interface PromRegistry {
  readonly contentType: string;
  metrics(): Promise<string>;
  getSingleMetric(name: string): unknown;
  clear(): void;
}
interface PromCounter {
  inc(labels: Record<string, string>, value?: number): void;
}
interface PromHistogram {
  observe(labels: Record<string, string>, value: number): void;
}

const metricsSchema = {
  response: {
    200: {
      description: 'Prometheus text exposition format.',
      content: { 'text/plain': { schema: { type: 'string' } } },
    },
  },
};

export const metricsRoutes: RouteModule = (app, ctx) => {
  const prom = loadPromClient();
  if (!prom) {
    app.get('/metrics', { schema: metricsSchema }, async () => {
      throw notSupported('GET /metrics needs the package prom-client, which is not installed: npm install prom-client');
    });
    return;
  }
  const registry = new prom.Registry();
  const stopAcquires = countAcquires(ctx, registry);

  const requests = new prom.Counter({
    name: 'leasehold_http_requests_total',
    help: `Requests answered by this server, by route pattern (${NO_ROUTE} when none matched), method and status (${ABORTED}: the client went away before the answer).`,
    labelNames: ['route', 'method', 'status'],
    registers: [registry],
  });
  const sessions = new OpenSessions(ctx);
  new prom.Gauge({
    name: 'leasehold_http_open_sessions',
    help: 'Sessions opened through this server (POST /v1/sessions) that it has not seen end: not closed through it (DELETE), not reported gone by a keep-alive through it (404), and kept alive through it within their ttl. A session kept alive only through another server counts here until its ttl runs out from its last keep-alive here.',
    registers: [registry],
    collect() {
      this.set(sessions.count());
    },
  });
  const longPolls = new Set<FastifyRequest>();
  new prom.Gauge({
    name: 'leasehold_http_long_polls',
    help: 'Acquire requests with waitMs > 0 in flight on this server now (long polls waiting for a key, or being answered).',
    registers: [registry],
    collect() {
      this.set(longPolls.size);
    },
  });

  const counted = new WeakSet<FastifyRequest>();
  const count = (request: FastifyRequest, status: string): void => {
    if (counted.has(request)) return;
    counted.add(request);
    requests.inc({ route: request.routeOptions.url ?? NO_ROUTE, method: request.method, status });
  };
  app.addHook('onResponse', async (request, reply) => count(request, String(reply.statusCode)));
  app.addHook('preHandler', async (request, reply) => {
    // An answer cut off (the client went away) never reaches onResponse: counted when its connection closes.
    reply.raw.once('close', () => count(request, reply.raw.headersSent ? String(reply.statusCode) : ABORTED));
    if (request.routeOptions.url !== ACQUIRE || request.method !== 'POST') return;
    if (((request.body as { waitMs?: number } | undefined)?.waitMs ?? 0) <= 0) return;
    longPolls.add(request);
    reply.raw.once('close', () => longPolls.delete(request));
  });
  app.addHook('onSend', async (request, reply, payload) => {
    // Counting never changes an answer.
    try {
      sessions.follow(request, reply, payload);
    } catch (error) {
      request.log.error({ err: error }, 'metrics: a session answer could not be counted');
    }
    return payload;
  });
  app.addHook('onClose', async () => {
    stopAcquires();
    registry.clear();
  });

  app.get('/metrics', { schema: metricsSchema }, async (_request, reply) => reply.type(registry.contentType).send(await registry.metrics()));
};

/** prom-client, or undefined when it is not installed (any other failure to load it is thrown). */
function loadPromClient(): PromClient | undefined {
  try {
    return requirePeer<PromClient>(createRequire(import.meta.url), 'prom-client', 'GET /metrics');
  } catch (error) {
    if (error instanceof InvalidArgumentError && error.argument === 'dependency') return undefined;
    throw error;
  }
}

/**
 * The acquires the server makes for its callers (core's acquire loop, events on `ctx.events`) as a
 * client `instrumentLocks` counts: outcome (acquired, timeout, aborted, error) and the wait of each
 * grant, on the library's own series. `instrumentLocks` is given a view of those events without
 * `acquired`: it follows each grant until the lease's release or loss to time the hold, and the
 * server never holds what it grants (its callers release it, through any server), so that would
 * grow without end; the grants are counted here instead.
 */
function countAcquires(ctx: ServeContext, registry: PromRegistry): () => void {
  const backend = ctx.backend.name;
  const view = {
    backendName: backend,
    leases: () => [],
    on(name: string, listener: never) {
      if (name === 'acquired') return view;
      ctx.events.on(name as 'busy', listener);
      return view;
    },
    off(name: string, listener: never) {
      ctx.events.off(name as 'busy', listener);
      return view;
    },
  };
  const stopClient = instrumentLocks(view as unknown as Locks, { registry: registry as unknown as InstrumentLocksOptions['registry'] });
  const acquires = registry.getSingleMetric('leasehold_acquire_total') as PromCounter;
  const wait = registry.getSingleMetric('leasehold_acquire_wait_seconds') as PromHistogram;
  const onAcquired = (e: { waitedMs: number }): void => {
    acquires.inc({ backend, outcome: 'acquired' });
    wait.observe({ backend }, e.waitedMs / 1000);
  };
  ctx.events.on('acquired', onAcquired);
  return () => {
    ctx.events.off('acquired', onAcquired);
    stopClient();
  };
}

/**
 * The sessions this server has seen opened and not seen end (see the gauge's help). Kept by a hash
 * of the caller's name and the session handle (the handle is a secret: not kept as it is), with the
 * time its ttl runs out by this server's clock. Lost on restart, as any metric.
 */
class OpenSessions {
  readonly #ctx: ServeContext;
  readonly #expiresAt = new Map<string, number>();
  #openedSincePrune = 0;

  constructor(ctx: ServeContext) {
    this.#ctx = ctx;
  }

  count(): number {
    this.#prune();
    return this.#expiresAt.size;
  }

  /** Reads an answer about a session (onSend: its status and body are final here). */
  follow(request: FastifyRequest, reply: FastifyReply, payload: unknown): void {
    const route = request.routeOptions.url;
    const status = reply.statusCode;
    const opened = route === OPEN_SESSION && request.method === 'POST' && status === 201;
    const kept = route === KEEP_ALIVE && request.method === 'POST' && status === 200;
    const ended =
      (route === KEEP_ALIVE && request.method === 'POST' && status === 404) || (route === CLOSE_SESSION && request.method === 'DELETE' && status === 204);
    // Only the routes' own answers: every other (a 401, a 400, a 429) said nothing about a session.
    if (!opened && !kept && !ended) return;
    if (opened) {
      const body = parse(payload);
      if (typeof body?.session !== 'string' || typeof body.ttlMs !== 'number') return;
      this.#expiresAt.set(this.#id(request, body.session), this.#ctx.clock.now() + body.ttlMs);
      if (++this.#openedSincePrune >= PRUNE_EVERY) this.#prune();
      return;
    }
    const handle = (request.params as { session?: string } | undefined)?.session;
    if (typeof handle !== 'string') return;
    const id = this.#id(request, handle);
    if (!this.#expiresAt.has(id)) return;
    if (ended) {
      this.#expiresAt.delete(id);
      return;
    }
    const body = parse(payload);
    if (typeof body?.ttlMs === 'number') this.#expiresAt.set(id, this.#ctx.clock.now() + body.ttlMs);
  }

  /** The caller is known: these answers come from the routes, after the auth hook. */
  #id(request: FastifyRequest, handle: string): string {
    return createHash('sha256')
      .update(`${callerOf(request).name}\n${handle}`, 'utf8')
      .digest('base64url');
  }

  #prune(): void {
    this.#openedSincePrune = 0;
    const now = this.#ctx.clock.now();
    for (const [id, at] of this.#expiresAt) if (at <= now) this.#expiresAt.delete(id);
  }
}

function parse(payload: unknown): Record<string, unknown> | undefined {
  if (typeof payload !== 'string') return undefined;
  try {
    const value: unknown = JSON.parse(payload);
    return typeof value === 'object' && value !== null ? (value as Record<string, unknown>) : undefined;
  } catch {
    return undefined;
  }
}

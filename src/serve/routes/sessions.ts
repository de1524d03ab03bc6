/**
 * `POST /v1/sessions`, `POST /v1/sessions/{session}/keepalive`, `DELETE /v1/sessions/{session}`:
 * the backend's own sessions (one keep-alive renews every lease of the session). The handle binds
 * the session to its caller (handles.ts): another caller's handle is an unknown session — 404 on a
 * keep-alive, and a 204 that ends nothing on a DELETE.
 */
import type { FastifyRequest } from 'fastify';
import type { SessionSupport } from '../../core/backend.js';
import { DEFAULTS } from '../../core/options.js';
import { callerOf, bounded, type RouteModule, type ServeContext } from '../context.js';
import { notFound, notSupported } from '../errors.js';
import { decodeSessionHandle, encodeSessionHandle } from '../handles.js';
import * as s from '../schemas.js';

const ttlAnswer = { type: 'object', required: ['ttlMs'], properties: { ttlMs: { type: 'integer' } } } as const;

const openSchema = {
  body: s.strictBody({ ttlMs: s.ttlMs }),
  response: { 201: { type: 'object', required: ['session', 'ttlMs'], properties: { session: { type: 'string' }, ttlMs: { type: 'integer' } } } },
};
const keepAliveSchema = { params: s.pathParam('session'), body: s.strictBody({ ttlMs: s.ttlMs }), response: { 200: ttlAnswer } };
const closeSchema = { params: s.pathParam('session'), body: s.strictBody({}) };

const GONE = 'unknown session (expired, closed, or never opened): its leases are lost';

export const sessionRoutes: RouteModule = (app, ctx) => {
  app.post('/v1/sessions', { schema: openSchema }, async (request, reply) => {
    const sessions = supported(ctx);
    const ttlMs = (request.body as { ttlMs?: number }).ttlMs ?? DEFAULTS.ttlMs;
    // A session opened after its call timed out is nobody's: closed at once.
    const opened = await bounded(ctx, 'session open', sessions.open(ttlMs), ({ id }) => void sessions.close(id).catch(() => {}));
    const session = encodeSessionHandle({ id: opened.id, ttlMs: opened.ttlMs }, callerOf(request));
    return reply.status(201).send({ session, ttlMs: opened.ttlMs });
  });

  app.post('/v1/sessions/:session/keepalive', { schema: keepAliveSchema }, async (request) => {
    const r = request as FastifyRequest<{ Params: { session: string }; Body: { ttlMs?: number } }>;
    const session = decodeSessionHandle(r.params.session, callerOf(request));
    if (!session || !ctx.backend.sessions) throw notFound(GONE, 'session');
    const ttlMs = r.body.ttlMs ?? session.ttlMs;
    if (!(await bounded(ctx, 'session keep-alive', ctx.backend.sessions.keepAlive(session.id, ttlMs)))) throw notFound(GONE, 'session');
    return { ttlMs };
  });

  app.delete('/v1/sessions/:session', { schema: closeSchema }, async (request, reply) => {
    const session = decodeSessionHandle((request.params as { session: string }).session, callerOf(request));
    // Unknown, another caller's, or on a backend without sessions: nothing to end, and the same answer.
    if (session && ctx.backend.sessions) await bounded(ctx, 'session close', ctx.backend.sessions.close(session.id));
    return reply.status(204).send();
  });
};

function supported(ctx: ServeContext): SessionSupport {
  if (!ctx.backend.sessions) throw notSupported(`the ${ctx.backend.name} backend has no sessions (acquire leases on their own, and renew each)`);
  return ctx.backend.sessions;
}

/**
 * `POST /v1/leases/{lease}/renew` and `DELETE /v1/leases/{lease}`: everything comes from the handle
 * and the caller (the owner is derived, never stored), so any server over the backend answers.
 * A handle of another caller derives another owner: the backend does not renew it (410) and does not
 * release it (204, the lease stays held) — the same answers as for an unknown lease.
 */
import type { FastifyRequest } from 'fastify';
import { LeaseLostError } from '../../core/errors.js';
import { MIN_TTL_MS } from '../../core/validate.js';
import { callerOf, bounded, type RouteModule, type ServeContext } from '../context.js';
import { decodeLeaseHandle, deriveOwner, type LeaseHandle } from '../handles.js';
import * as s from '../schemas.js';

const renewSchema = {
  params: s.pathParam('lease'),
  body: s.strictBody({ ttlMs: s.ttlMs }),
  response: { 200: { type: 'object', required: ['ttlMs'], properties: { ttlMs: { type: 'integer' } } } },
};

const releaseSchema = { params: s.pathParam('lease'), body: s.strictBody({}) };

export const leaseRoutes: RouteModule = (app, ctx) => {
  app.post('/v1/leases/:lease/renew', { schema: renewSchema }, async (request) => {
    const r = request as FastifyRequest<{ Params: { lease: string }; Body: { ttlMs?: number } }>;
    const h = decodeLeaseHandle(r.params.lease);
    const owner = deriveOwner(callerOf(request).name, h.seed);
    const answer = await bounded(ctx, 'renew', renew(ctx, h, owner, r.body.ttlMs ?? h.ttlMs));
    if (!answer.renewed) throw new LeaseLostError(h.key, h.token, 'not-held');
    return { ttlMs: answer.ttlMs };
  });

  app.delete('/v1/leases/:lease', { schema: releaseSchema }, async (request, reply) => {
    const h = decodeLeaseHandle((request.params as { lease: string }).lease);
    const owner = deriveOwner(callerOf(request).name, h.seed);
    const holdLeft = h.minHold ? h.minHold.grantedAt + h.minHold.minHoldMs - ctx.wallNow() : 0;
    if (holdLeft > 0) {
      // A minimum hold (ShedLock's lockAtLeastFor), kept without a timer: one renewal for exactly what
      // is left of it, then the lease expires (not released: lock-delay, if any, follows, as in the library).
      await bounded(ctx, 'renew', renew(ctx, h, owner, Math.max(MIN_TTL_MS, Math.ceil(holdLeft))));
    } else {
      await bounded(ctx, 'release', ctx.backend.release({ key: h.key, owner, token: h.token, mode: h.mode }));
    }
    return reply.status(204).send();
  });
};

function renew(ctx: ServeContext, h: LeaseHandle, owner: string, ttlMs: number) {
  return ctx.backend.renew({
    key: h.key,
    owner,
    token: h.token,
    mode: h.mode,
    ttlMs,
    lockDelayMs: h.lockDelayMs,
    holder: h.label,
    ...(h.limit !== undefined && { limit: h.limit }),
  });
}

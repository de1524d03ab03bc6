/**
 * `GET /v1/health`: 200 `{ ok: true, backend, capabilities: { fair, minTtlMs, sessions } }` when the backend answers a request, 503 when it does
 * not (within the operation timeout). The probe is a renewal of a key nobody holds, by an owner no
 * lease has: one key's lookup on every backend, never a scan, and it changes nothing.
 */
import { MIN_TTL_MS } from '../../core/validate.js';
import { bounded, type RouteModule, type ServeContext } from '../context.js';

const PROBE = Object.freeze({ key: 'leasehold/health-probe', owner: 'http:health-probe', token: 1n, mode: 'exclusive', ttlMs: MIN_TTL_MS } as const);

const healthSchema = {
  response: {
    200: {
      type: 'object',
      required: ['ok', 'backend', 'capabilities'],
      properties: {
        ok: { type: 'boolean' },
        backend: { type: 'string' },
        capabilities: {
          type: 'object',
          required: ['fair', 'minTtlMs', 'sessions'],
          properties: { fair: { type: 'boolean' }, minTtlMs: { type: 'integer' }, sessions: { type: 'boolean' } },
        },
      },
    },
  },
};

export const healthRoutes: RouteModule = (app, ctx) => {
  app.get('/v1/health', { schema: healthSchema }, async () => {
    await probeBackend(ctx);
    const { fair, minTtlMs } = ctx.backend.capabilities;
    // What a client needs to know of the backend behind the service. httpBackend declares `fair`
    // whatever this says (arrival order is kept, or not, by this backend): a client reads it here.
    return { ok: true, backend: ctx.backend.name, capabilities: { fair, minTtlMs, sessions: ctx.backend.sessions !== undefined } };
  });
};

/** Resolves when the backend answers (within the operation timeout); rejects with its error (BackendUnavailableError) otherwise. */
export async function probeBackend(ctx: ServeContext): Promise<void> {
  await bounded(ctx, 'health probe', ctx.backend.renew(PROBE));
}

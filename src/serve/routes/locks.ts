/**
 * `POST /v1/locks/{key}/acquire` (a long poll over core's waiting loop), `GET /v1/locks` (inspect,
 * filtered to the caller's prefixes) and `POST /v1/sequencers/check` (Chubby's CheckSequencer).
 */
import type { FastifyReply, FastifyRequest } from 'fastify';
import { acquireAs, settledCalls } from '../../core/acquire-as.js';
import type { KeyState } from '../../core/backend.js';
import { ClosedError, InvalidArgumentError } from '../../core/errors.js';
import { checkLabel, DEFAULTS, resolveAcquireOptions } from '../../core/options.js';
import { checkKey, checkPrefix, type LockMode } from '../../core/validate.js';
import { listingPrefixes, mayUse } from '../auth.js';
import { bounded, callerOf, type OwnerWait, type RouteModule, type ServeContext } from '../context.js';
import { checkedSequencer, issuedSequencer } from '../sequencers.js';
import { forbidden, notFound, superseded } from '../errors.js';
import { decodeSessionHandle, deriveOwner, encodeLeaseHandle, ownerSeed } from '../handles.js';
import * as s from '../schemas.js';

interface AcquireBody {
  session?: string;
  ttlMs?: number;
  waitMs?: number;
  mode?: LockMode;
  limit?: number;
  lockDelayMs?: number;
  minHoldMs?: number;
  label?: string;
}

const SESSION_GONE = 'unknown session (expired, closed, or never opened): open a new one';

/** An Idempotency-Key: 1–255 visible ASCII characters (docs/http-api.md). */
const IDEMPOTENCY_KEY = /^[\x21-\x7e]{1,255}$/;

const acquireSchema = {
  params: s.pathParam('key'),
  body: s.strictBody({
    session: { type: 'string', minLength: 1 },
    ttlMs: s.ttlMs,
    waitMs: s.waitMs,
    mode: s.mode,
    limit: s.limit,
    lockDelayMs: s.durationMs,
    minHoldMs: s.durationMs,
    label: { type: 'string' },
  }),
  response: {
    200: {
      type: 'object',
      required: ['lease', 'key', 'token', 'sequencer', 'ttlMs', 'mode'],
      properties: {
        lease: { type: 'string' },
        key: { type: 'string' },
        token: { type: 'string' },
        sequencer: { type: 'string' },
        ttlMs: { type: 'integer' },
        mode: s.mode,
      },
    },
  },
};

const listSchema = {
  querystring: { type: 'object', additionalProperties: false, properties: { prefix: { type: 'string' } } },
};

const checkSchema = {
  body: s.strictBody({ sequencer: { type: 'string' } }, ['sequencer']),
  response: {
    200: {
      type: 'object',
      required: ['valid', 'key', 'mode', 'token', 'lastToken'],
      properties: { valid: { type: 'boolean' }, key: { type: 'string' }, mode: s.mode, token: { type: 'string' }, lastToken: { type: ['string', 'null'] } },
    },
  },
};

export const lockRoutes: RouteModule = (app, ctx) => {
  app.post('/v1/locks/:key/acquire', { schema: acquireSchema }, (request, reply) => {
    const answer = acquire(ctx, request as FastifyRequest<{ Params: { key: string }; Body: AcquireBody }>, reply);
    ctx.acquiring.add(answer);
    const done = (): void => {
      ctx.acquiring.delete(answer);
    };
    answer.then(done, done);
    return answer;
  });

  app.get('/v1/locks', { schema: listSchema }, async (request) => {
    const caller = callerOf(request);
    const prefix = checkPrefix((request.query as { prefix?: string }).prefix);
    const prefixes = listingPrefixes(caller, prefix);
    if (prefixes.length === 0) throw forbidden(`prefix ${JSON.stringify(prefix)}`);
    const states = await inspectUnder(ctx, prefixes);
    return { locks: states.map(lockJson) };
  });

  app.post('/v1/sequencers/check', { schema: checkSchema }, async (request) => {
    const caller = callerOf(request);
    const seq = checkedSequencer(ctx, (request.body as { sequencer: string }).sequencer);
    if (!mayUse(caller, seq.key)) throw forbidden(`key ${JSON.stringify(seq.key)}`);
    const state = (await ctx.locks.inspect(seq.key)).find((k) => k.key === seq.key);
    const valid = state?.holders.some((h) => h.token === seq.token && h.mode === seq.mode) ?? false;
    return { valid, key: seq.key, mode: seq.mode, token: String(seq.token), lastToken: state ? String(state.lastToken) : null };
  });
};

async function acquire(ctx: ServeContext, request: FastifyRequest<{ Params: { key: string }; Body: AcquireBody }>, reply: FastifyReply) {
  const caller = callerOf(request);
  const key = checkKey(request.params.key, 'key');
  if (!mayUse(caller, key)) throw forbidden(`key ${JSON.stringify(key)}`);
  const body = request.body;
  const label = body.label === undefined ? caller.name : checkLabel(body.label, 'label');
  const idempotencyKey = request.headers['idempotency-key'];
  if (idempotencyKey !== undefined && (typeof idempotencyKey !== 'string' || !IDEMPOTENCY_KEY.test(idempotencyKey)))
    throw new InvalidArgumentError('Idempotency-Key', 'expected 1–255 visible ASCII characters');
  const minHoldMs = body.minHoldMs ?? 0;
  // The library's reading of mode and limit (a limit alone asks for a permit: shared), and its refusals.
  const { mode, limit } = resolveAcquireOptions({ mode: body.mode, limit: body.limit }, DEFAULTS, 'options');
  let session: { id: string; ttlMs: number } | undefined;
  if (body.session !== undefined) {
    // A min-hold lease outlives its release on its own expiry: it cannot live by a session (as in the library).
    if (minHoldMs > 0) throw new InvalidArgumentError('minHoldMs', 'a lease with a minimum hold cannot live by a session (leave session or minHoldMs out)');
    session = decodeSessionHandle(body.session, caller);
    if (!session || !ctx.backend.sessions) throw notFound(SESSION_GONE, 'session');
  }

  const seed = ownerSeed(typeof idempotencyKey === 'string' ? idempotencyKey : undefined);
  const owner = deriveOwner(caller.name, seed);
  // A poll that runs out keeps its place for the next poll of the same owner, which only a caller
  // with an Idempotency-Key can make (without one, every request is a new owner).
  // Only where places wait for their owner (BackendCapabilities.keepablePlaces: not etcd, whose places
  // become the lock by position; on Redis not a place with a session, which it hands the key to).
  const keeps = ctx.backend.capabilities.keepablePlaces;
  const keepPlaceOnTimeout = typeof idempotencyKey === 'string' && (keeps === 'all' || (keeps === 'without-session' && session === undefined));
  // The client going away ends its wait, and its place in the queue with it (a wait that runs out
  // may keep its place: keepPlaceOnTimeout).
  const gone = new AbortController();
  const onClose = (): void => {
    if (!reply.raw.writableEnded) gone.abort(new ClosedError('HTTP request'));
  };
  reply.raw.on('close', onClose);
  // One owner, one wait at a time in this server: a request with the same Idempotency-Key as one
  // still running (a client's retry after a timeout, its first request not yet seen to be gone)
  // takes the wait over. Run side by side, the two were one owner waiting twice: the first one's
  // end cancelled the place the second had refreshed, and gave back a late grant the second may
  // have been answered with (the same owner is answered with its grant), leaving its client a
  // lease the coordinator had released. The earlier one ends (its place kept where places are),
  // and this one starts when it and every backend call it made are done.
  const calls = new Set<Promise<unknown>>();
  const handOver = new AbortController();
  let waitDone = (): void => {};
  const mine: OwnerWait | undefined =
    typeof idempotencyKey === 'string'
      ? {
          handOver: () => handOver.abort(superseded()),
          done: new Promise<void>((resolve) => {
            waitDone = resolve;
          }).then(() => settledCalls(calls, 2 * ctx.operationTimeoutMs)),
        }
      : undefined;
  // Per key: the same Idempotency-Key on another key is another wait, which this one must not end.
  const waitId = `${key}\n${owner}`;
  const previous = mine ? ctx.ownerWaits.get(waitId) : undefined;
  if (mine) ctx.ownerWaits.set(waitId, mine);
  const grantedAt = ctx.wallNow();
  try {
    if (previous) {
      previous.handOver();
      await previous.done;
      if (gone.signal.aborted) throw gone.signal.reason;
      if (handOver.signal.aborted) throw handOver.signal.reason;
    }
    const result = await acquireAs({
      backend: ctx.backend,
      key,
      owner,
      holder: label,
      options: {
        // A session lease lives by the session: its ttl is the session's.
        ttlMs: session ? session.ttlMs : (body.ttlMs ?? DEFAULTS.ttlMs),
        waitMs: body.waitMs ?? 0,
        mode,
        ...(limit !== undefined && { limit }),
        ...(body.lockDelayMs !== undefined && { lockDelayMs: body.lockDelayMs }),
        signal: gone.signal,
      },
      ...(session && { session: session.id }),
      keepPlaceOnTimeout,
      handOver: handOver.signal,
      calls,
      operationTimeoutMs: ctx.operationTimeoutMs,
      closing: ctx.closing,
      events: ctx.events,
      clock: ctx.clock,
    });
    if (!result.granted) throw notFound(SESSION_GONE, 'session');
    if (gone.signal.aborted) {
      // The client went away while the grant was being made: nobody will hold it, so it is given back
      // now (a session lease would otherwise live as long as the session).
      await bounded(ctx, 'release', ctx.backend.release({ key, owner, token: result.token, mode })).catch(() => {});
      throw gone.signal.reason;
    }
    // Handed over as the grant was made: the next request of the owner is answered with this grant
    // (the coordinator answers an owner that holds with its grant), so it is left held for it.
    const lease = encodeLeaseHandle({
      key,
      token: result.token,
      mode,
      limit,
      lockDelayMs: body.lockDelayMs ?? 0,
      ttlMs: result.ttlMs,
      label,
      session: session?.id,
      minHold: minHoldMs > 0 ? { grantedAt, minHoldMs } : undefined,
      seed,
    });
    return { lease, key, token: String(result.token), sequencer: issuedSequencer(ctx, key, mode, result.token), ttlMs: result.ttlMs, mode };
  } finally {
    reply.raw.off('close', onClose);
    if (mine && ctx.ownerWaits.get(waitId) === mine) ctx.ownerWaits.delete(waitId);
    waitDone();
  }
}

/** Inspect under each prefix, merged by key (prefixes may overlap), in key order. */
async function inspectUnder(ctx: ServeContext, prefixes: readonly string[]): Promise<KeyState[]> {
  if (prefixes.length === 1) return ctx.locks.inspect(prefixes[0]);
  const byKey = new Map<string, KeyState>();
  for (const states of await Promise.all(prefixes.map((p) => ctx.locks.inspect(p)))) for (const st of states) byKey.set(st.key, st);
  return [...byKey.values()].sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
}

/** A key's state as JSON: tokens as decimal strings. */
function lockJson(st: KeyState) {
  return {
    key: st.key,
    lastToken: String(st.lastToken),
    holders: st.holders.map((h) => ({ mode: h.mode, token: String(h.token), holder: h.holder, expiresInMs: Math.max(0, Math.round(h.expiresInMs)) })),
    waiters: st.waiters,
    lockDelayRemainingMs: Math.max(0, Math.round(st.lockDelayRemainingMs)),
    ...(st.limit !== undefined && { limit: st.limit }),
  };
}

import type { Span, Tracer } from '@opentelemetry/api';
import { InvalidArgumentError, StaleTokenError } from '../core/errors.js';
import type { Fence, FenceWriteOptions } from '../core/fence.js';
import type { TokenInput } from '../core/token.js';
import type { Locks } from '../core/locks.js';
import { toToken } from '../core/token.js';
import { checkKnownOptions, checkObject, describe } from '../core/validate.js';
import { createRequire } from 'node:module';
import { requirePeer } from '../core/peer.js';

type OtelApi = typeof import('@opentelemetry/api');

export interface TraceLocksOptions {
  /** @default the global tracer provider's tracer named `leasehold` (a no-op until an SDK is registered) */
  tracer?: Tracer;
}

export interface TraceFenceOptions extends TraceLocksOptions {
  /** The fence's name (`leasehold.fence` attribute). */
  name: string;
}

/**
 * OpenTelemetry spans for a `Locks`, from its events: one `leasehold.acquire` span per acquire,
 * child of the span active where `acquire` was called, from the call to its outcome, with
 * `leasehold.key`, `leasehold.mode`, `leasehold.token`, `leasehold.waited_ms` and
 * `leasehold.outcome` (acquired, busy, timeout, aborted, error); and a `leasehold.lease_lost`
 * event on that caller's span when the lease is later lost, so a request's trace shows that it
 * waited on a lock, which token it got, and that the lease went. Without a registered SDK the
 * tracer is OpenTelemetry's no-op and nothing is recorded. Returns a function that stops tracing.
 */
export function traceLocks(locks: Locks, options?: TraceLocksOptions): () => void {
  const o = checkObject(options, 'options');
  checkKnownOptions(o, ['tracer'], 'options');
  const api = requirePeer<OtelApi>(createRequire(import.meta.url), '@opentelemetry/api', 'leasehold/metrics (tracing)');
  const tracer = checkTracer(o.tracer) ?? api.trace.getTracer('leasehold');
  /** The caller's span of each lease held now, for its loss. */
  const holders = new Map<string, Span>();
  const id = (key: string, token: bigint): string => `${token}\u0000${key}`;

  const record = (key: string, waitedMs: number, outcome: string, extra: Record<string, string | number> = {}, error?: unknown): void => {
    const span = tracer.startSpan(
      'leasehold.acquire',
      {
        kind: api.SpanKind.INTERNAL,
        startTime: Date.now() - waitedMs,
        attributes: { 'leasehold.key': key, 'leasehold.waited_ms': Math.round(waitedMs), 'leasehold.outcome': outcome, ...extra },
      },
      api.context.active(),
    );
    if (outcome === 'error') {
      span.setStatus({ code: api.SpanStatusCode.ERROR, message: error instanceof Error ? error.message : String(error) });
      if (error instanceof Error) span.recordException(error);
    }
    span.end();
  };

  const handlers = {
    acquired: (e: { key: string; token: bigint; mode: string; waitedMs: number }) => {
      record(e.key, e.waitedMs, 'acquired', { 'leasehold.mode': e.mode, 'leasehold.token': e.token.toString() });
      const caller = api.trace.getSpan(api.context.active());
      if (caller?.isRecording()) holders.set(id(e.key, e.token), caller);
    },
    busy: (e: { key: string; waitedMs: number }) => record(e.key, e.waitedMs, 'busy'),
    acquireFailed: (e: { key: string; waitedMs: number; outcome: string; error: unknown }) => record(e.key, e.waitedMs, e.outcome, {}, e.error),
    released: (e: { key: string; token: bigint }) => holders.delete(id(e.key, e.token)),
    lost: (e: { key: string; token: bigint; reason: string }) => {
      const k = id(e.key, e.token);
      const span = holders.get(k);
      holders.delete(k);
      if (span?.isRecording())
        span.addEvent('leasehold.lease_lost', { 'leasehold.key': e.key, 'leasehold.token': e.token.toString(), 'leasehold.reason': e.reason });
    },
  };
  for (const [name, handler] of Object.entries(handlers)) locks.on(name as 'acquired', handler as never);
  return () => {
    for (const [name, handler] of Object.entries(handlers)) locks.off(name as 'acquired', handler as never);
    holders.clear();
  };
}

/**
 * A fence whose writes are `leasehold.fence.write` spans (active while `mutate` runs), with
 * `leasehold.fence`, `leasehold.resource`, `leasehold.token` and `leasehold.outcome` (accepted,
 * refused, error). Otherwise it behaves as `fence`.
 */
export function traceFence<F extends AnyFence>(fence: F, options: TraceFenceOptions): F {
  const o = checkObject(options, 'options');
  checkKnownOptions(o, ['tracer', 'name'], 'options');
  if (typeof o.name !== 'string' || o.name.length === 0) throw new InvalidArgumentError('options.name', `expected the fence's name, got ${describe(o.name)}`);
  if (!fence || typeof (fence as { write?: unknown }).write !== 'function') throw new InvalidArgumentError('fence', `expected a fence, got ${describe(fence)}`);
  const api = requirePeer<OtelApi>(createRequire(import.meta.url), '@opentelemetry/api', 'leasehold/metrics (tracing)');
  const tracer = checkTracer(o.tracer) ?? api.trace.getTracer('leasehold');
  const name = o.name;
  const write = fence.write.bind(fence) as Fence<never>['write'];
  const traced = Object.create(fence) as F;
  Object.defineProperty(traced, 'write', {
    value: (...args: Parameters<Fence<never>['write']>) => {
      const [resource, token] = args;
      let tokenText: string;
      try {
        tokenText = toToken(token).toString();
      } catch {
        tokenText = String(token);
      }
      const attributes = { 'leasehold.fence': name, 'leasehold.resource': String(resource), 'leasehold.token': tokenText };
      return tracer.startActiveSpan('leasehold.fence.write', { kind: api.SpanKind.INTERNAL, attributes }, async (span) => {
        try {
          const result = await write(...args);
          span.setAttribute('leasehold.outcome', 'accepted');
          return result;
        } catch (error) {
          const refused = error instanceof StaleTokenError;
          span.setAttribute('leasehold.outcome', refused ? 'refused' : 'error');
          if (refused) span.setAttribute('leasehold.highest', error.highest.toString());
          else {
            span.setStatus({ code: api.SpanStatusCode.ERROR, message: error instanceof Error ? error.message : String(error) });
            if (error instanceof Error) span.recordException(error);
          }
          throw error;
        } finally {
          span.end();
        }
      });
    },
  });
  return traced;
}

function checkTracer(tracer: unknown): Tracer | undefined {
  if (tracer === undefined) return undefined;
  if (typeof tracer !== 'object' || tracer === null || typeof (tracer as Tracer).startSpan !== 'function') {
    throw new InvalidArgumentError('options.tracer', `expected an OpenTelemetry Tracer, got ${describe(tracer)}`);
  }
  return tracer as Tracer;
}

/** Any fence, whatever its transaction type (the mutate callback is only passed through). */
interface AnyFence {
  write(resource: string, token: TokenInput, mutate: never, options?: FenceWriteOptions): Promise<unknown>;
}

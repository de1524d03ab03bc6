/**
 * OpenTelemetry spans from leasehold/metrics, recorded by the real SDK (sdk-trace-base's in-memory
 * exporter, AsyncLocalStorage context): an acquire span under the caller's span with key, token,
 * waited ms and outcome; a fence write span with resource, token and outcome; a lease's loss as an
 * event on the span that acquired it. SQLite backend and fence (real files).
 */
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { context, trace } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor, type ReadableSpan } from '@opentelemetry/sdk-trace-base';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AcquireTimeoutError, StaleTokenError } from '../../src/core/errors.js';
import { Locks } from '../../src/core/locks.js';
import { traceFence, traceLocks } from '../../src/metrics/index.js';
import { sqliteBackend, sqliteFence } from '../../src/sqlite/index.js';
import { eventually, tempDir } from '../helpers/env.js';

const exporter = new InMemorySpanExporter();
const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
const contextManager = new AsyncLocalStorageContextManager();
const dir = tempDir();
let locks: Locks;
let data: Database.Database;

beforeAll(() => {
  context.setGlobalContextManager(contextManager.enable());
  trace.setGlobalTracerProvider(provider);
  locks = new Locks({ backend: sqliteBackend({ path: join(dir.path, 'locks.db') }), holderName: 'traced' });
  data = new Database(join(dir.path, 'data.db'));
});
afterAll(async () => {
  await locks.close();
  data.close();
  await provider.shutdown();
  contextManager.disable();
  trace.disable();
  context.disable();
  dir.cleanup();
});

const spans = (name: string): ReadableSpan[] => exporter.getFinishedSpans().filter((s) => s.name === name);
const parentOf = (s: ReadableSpan): string | undefined => s.parentSpanContext?.spanId;

describe('traces', () => {
  it('an acquire and a fenced write are spans under the request that made them', async () => {
    const stop = traceLocks(locks); // the global provider's tracer
    const fence = traceFence(sqliteFence(data), { name: 'docs' });
    const tracer = trace.getTracer('app');
    let requestId = '';
    let token = 0n;
    await tracer.startActiveSpan('request', async (request) => {
      requestId = request.spanContext().spanId;
      const lease = await locks.acquire('doc:1', { ttlMs: 5_000 });
      token = lease.token;
      await fence.write('doc:1', lease.token, () => undefined);
      await lease.release();
      request.end();
    });
    const [acquire] = spans('leasehold.acquire');
    expect(acquire).toBeDefined();
    expect(parentOf(acquire!)).toBe(requestId);
    expect(acquire!.attributes).toMatchObject({
      'leasehold.key': 'doc:1',
      'leasehold.mode': 'exclusive',
      'leasehold.token': token.toString(),
      'leasehold.outcome': 'acquired',
    });
    expect(typeof acquire!.attributes['leasehold.waited_ms']).toBe('number');
    const [write] = spans('leasehold.fence.write');
    expect(parentOf(write!)).toBe(requestId);
    expect(write!.attributes).toMatchObject({
      'leasehold.fence': 'docs',
      'leasehold.resource': 'doc:1',
      'leasehold.token': token.toString(),
      'leasehold.outcome': 'accepted',
    });
    stop();
    exporter.reset();
  });

  it('a refused write, a timeout and a busy tryAcquire say so', async () => {
    const stop = traceLocks(locks, { tracer: provider.getTracer('leasehold') });
    const fence = traceFence(sqliteFence(data), { name: 'docs', tracer: provider.getTracer('leasehold') });
    await fence.write('doc:2', 10n, () => undefined);
    await expect(fence.write('doc:2', 9n, () => undefined)).rejects.toBeInstanceOf(StaleTokenError);
    const other = new Locks({ backend: sqliteBackend({ path: join(dir.path, 'locks.db') }) });
    const held = await other.acquire('busy', { ttlMs: 5_000 });
    expect(await locks.tryAcquire('busy')).toBeNull();
    await expect(locks.acquire('busy', { waitMs: 50 })).rejects.toBeInstanceOf(AcquireTimeoutError);
    await held.release();
    await other.close();
    expect(spans('leasehold.fence.write').map((s) => [s.attributes['leasehold.outcome'], s.attributes['leasehold.highest']])).toEqual([
      ['accepted', undefined],
      ['refused', '10'],
    ]);
    expect(spans('leasehold.acquire').map((s) => s.attributes['leasehold.outcome'])).toEqual(['busy', 'timeout']);
    stop();
    exporter.reset();
  });

  it('a lease lost while held is an event on the span that acquired it', async () => {
    const stop = traceLocks(locks);
    const tracer = trace.getTracer('app');
    await tracer.startActiveSpan('job', async (job) => {
      const lease = await locks.acquire('nightly', { ttlMs: 150, autoRenew: false });
      expect(await eventually(() => !lease.held, 3_000)).toBe(true);
      job.end();
    });
    const [job] = spans('job');
    expect(job!.events.map((e) => [e.name, e.attributes?.['leasehold.key'], e.attributes?.['leasehold.reason']])).toEqual([
      ['leasehold.lease_lost', 'nightly', 'expired'],
    ]);
    stop();
    exporter.reset();
  });

  it('records nothing without a registered SDK (the no-op tracer)', async () => {
    trace.disable();
    const stop = traceLocks(locks);
    await (await locks.acquire('quiet', { ttlMs: 5_000 })).release();
    expect(exporter.getFinishedSpans()).toEqual([]);
    stop();
    trace.setGlobalTracerProvider(provider);
  });
});

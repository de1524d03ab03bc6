/**
 * Random requests against the lock service (fast-check, through inject): random methods, paths
 * built from the real routes with random segments (handles, keys, percent-encodings), random
 * headers and bodies. Bad input never gets a 5xx, and a refused request (any 4xx) changes nothing
 * the backend holds.
 */
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { memoryBackend } from '../../src/memory/index.js';
import { createLockServer, type LockServerApp } from '../../src/serve/index.js';
import { AS_A, AUTH, call } from './helpers.js';

let app: LockServerApp;
let lease: string;
let session: string;
let sequencer: string;

beforeAll(async () => {
  app = await createLockServer({ backend: memoryBackend({ sessions: true }), auth: AUTH, rateLimit: 1_000_000 });
  const s = await call(app, 'POST', '/v1/sessions', { ttlMs: 600_000 }, AS_A);
  session = s.body.session as string;
  const got = await call(app, 'POST', '/v1/locks/a%2Fheld/acquire', { ttlMs: 600_000 }, AS_A);
  lease = got.body.lease as string;
  sequencer = got.body.sequencer as string;
});
afterAll(async () => {
  await app.close();
});

/** What the backend holds, as text: a refused request must leave it exactly so. */
const state = async (): Promise<string> =>
  JSON.stringify(
    (await app.leasehold.backend.inspect('')).map((k) => ({ key: k.key, last: String(k.lastToken), holders: k.holders.map((h) => `${h.holder}#${h.token}`) })),
  );

const segment = (): fc.Arbitrary<string> =>
  fc.oneof(
    fc.constant('a%2Fheld'),
    fc.string({ maxLength: 12 }).map(encodeURIComponent),
    fc.constantFrom('%', '%E0%A4%A', '%FF', '%00', '..', 'a%2F..%2F', 'lhl1.', 'lhs1.x.y', `${'x'.repeat(5_000)}`),
    fc.constant(null).map(() => lease),
    fc.constant(null).map(() => `${lease.slice(0, -2)}zz`),
    fc.constant(null).map(() => session),
    fc.constant(null).map(() => session.replace(/.$/, (c) => (c === 'A' ? 'B' : 'A'))),
  );

const path = (): fc.Arbitrary<string> =>
  fc.oneof(
    segment().map((k) => `/v1/locks/${k}/acquire`),
    segment().map((l) => `/v1/leases/${l}/renew`),
    segment().map((l) => `/v1/leases/${l}`),
    segment().map((s) => `/v1/sessions/${s}/keepalive`),
    segment().map((s) => `/v1/sessions/${s}`),
    fc.constantFrom(
      '/v1/sessions',
      '/v1/locks',
      '/v1/locks?prefix=a%2F',
      '/v1/locks?prefix=b',
      '/v1/locks?x=1',
      '/v1/sequencers/check',
      '/v1/health',
      '/',
      '/v1',
    ),
    fc.webPath().map((p) => (p.startsWith('/') ? p : `/${p}`)),
  );

const body = (): fc.Arbitrary<unknown> =>
  fc.oneof(
    fc.constant(undefined),
    fc.json(),
    fc.record(
      {
        ttlMs: fc.oneof(fc.integer({ min: -10, max: 3_000_000_000 }), fc.double(), fc.string(), fc.constant(null)),
        waitMs: fc.oneof(fc.integer({ min: -1, max: 70_000 }), fc.string()),
        mode: fc.oneof(fc.constantFrom('exclusive', 'shared'), fc.string()),
        limit: fc.oneof(fc.integer({ min: -1, max: 20_000 }), fc.boolean()),
        lockDelayMs: fc.integer({ min: -5, max: 10 }),
        minHoldMs: fc.integer({ min: -5, max: 10 }),
        label: fc.string({ maxLength: 300 }),
        session: fc.oneof(
          fc.string(),
          fc.constant(null).map(() => `${session}x`),
        ),
        sequencer: fc.oneof(
          fc.string(),
          fc.constant(null).map(() => sequencer),
        ),
        extra: fc.anything(),
      },
      { requiredKeys: [] },
    ),
  );

describe('random requests', () => {
  it('never get a 5xx, and a refused one changes nothing', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.oneof({ arbitrary: fc.constantFrom('POST', 'DELETE'), weight: 6 }, { arbitrary: fc.constantFrom('GET', 'PUT', 'PATCH'), weight: 2 }) as fc.Arbitrary<
          'GET' | 'POST' | 'DELETE' | 'PUT' | 'PATCH'
        >,
        path(),
        body(),
        fc.record(
          {
            // Mostly a known caller, so that most requests get past authentication to the routes.
            authorization: fc.oneof(
              { arbitrary: fc.constant('Bearer token-a'), weight: 8 },
              { arbitrary: fc.constantFrom('Bearer token-b', 'Bearer nope', 'token-a', ''), weight: 2 },
            ),
            'content-type': fc.oneof(
              { arbitrary: fc.constant('application/json'), weight: 8 },
              { arbitrary: fc.constantFrom('text/plain', 'application/json; charset=utf-8', 'multipart/form-data'), weight: 2 },
            ),
            'idempotency-key': fc.oneof(fc.string({ maxLength: 300 }), fc.constantFrom('retry-1', 'retry-2')),
          },
          { requiredKeys: ['authorization', 'content-type'] },
        ),
        async (method, url, payload, headers) => {
          const before = await state();
          const res = await app.inject({
            method,
            url,
            headers,
            ...(payload !== undefined && { payload: typeof payload === 'string' ? payload : JSON.stringify(payload) }),
          });
          expect(res.statusCode, `${method} ${url.slice(0, 80)} → ${res.body.slice(0, 200)}`).toBeLessThan(500);
          if (res.statusCode >= 400) {
            expect(res.json()).toMatchObject({ code: expect.any(String), message: expect.any(String) });
            expect(await state(), `${method} ${url.slice(0, 80)} changed state with ${res.statusCode}`).toBe(before);
          }
        },
      ),
      { numRuns: 1_000 },
    );
  });
});

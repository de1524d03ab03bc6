/**
 * httpBackend's own behaviour against a scripted server (test/http/stub.ts): what it sends (the
 * owner as Idempotency-Key, the bearer token, the handle on renew and release, the long poll's
 * waitMs), how every kind of answer comes back (leasehold errors only, never Node's or HTTP's), what
 * it does not send (a release or renew that is not the holder's), and close() cutting what is in
 * flight. The protocol against the real server is test/conformance/http.test.ts.
 */
import { randomBytes } from 'node:crypto';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { AcquireRequest, Backend } from '../../src/core/backend.js';
import { BackendUnavailableError, ClosedError, InvalidArgumentError } from '../../src/core/errors.js';
import { Locks } from '../../src/core/locks.js';
import { signSequencer, verifySequencer } from '../../src/core/sequencer-sign.js';
import { formatSequencer } from '../../src/core/token.js';
import { httpBackend } from '../../src/http/index.js';
import { eventually } from '../helpers/env.js';
import { grant, json, type Stub, stubServer } from './stub.js';

const request = (over: Partial<AcquireRequest> = {}): AcquireRequest => ({
  key: 'k',
  owner: 'a1b2c3',
  mode: 'exclusive',
  ttlMs: 5_000,
  lockDelayMs: 0,
  holder: 'test-host:1',
  queue: false,
  queueTtlMs: 2_000,
  ...over,
});

describe('httpBackend options', () => {
  it.each([
    [{ url: 'ftp://x' }, 'options.url'],
    [{ url: 'not a url' }, 'options.url'],
    [{ url: '' }, 'options.url'],
    [{ url: 'http://x?y=1' }, 'options.url'],
    [{ url: 'http://x', token: 'has space' }, 'options.token'],
    [{ url: 'http://t@x', token: 'other' }, 'options.token'],
    [{ url: 'http://x', ca: 'PEM' }, 'options.ca'],
    [{ url: 'https://x', ca: 42 }, 'options.ca'],
    [{ url: 'http://x', timeoutMs: 0 }, 'options.timeoutMs'],
    [{ url: 'http://x', tls: true }, 'options.tls'],
  ])('%j is refused naming %s', (options, argument) => {
    const error = (() => {
      try {
        httpBackend(options as never);
      } catch (e) {
        return e;
      }
    })();
    expect(error).toBeInstanceOf(InvalidArgumentError);
    expect((error as InvalidArgumentError).argument).toBe(argument);
  });

  it('never shows the token of a URL in a message', () => {
    expect(() => httpBackend({ url: 'gopher://secret-token@x' })).toThrow(/\*\*\*@x/);
    expect(() => httpBackend({ url: 'gopher://secret-token@x' })).not.toThrow(/secret-token/);
  });
});

describe('httpBackend against a scripted server', () => {
  let stub: Stub;
  let backends: Backend[];
  const connect = (options: Partial<Parameters<typeof httpBackend>[0]> = {}): Backend => {
    const b = httpBackend({ url: stub.url, ...options });
    backends.push(b);
    return b;
  };
  beforeEach(async () => {
    stub = await stubServer();
    backends = [];
  });
  afterEach(async () => {
    await Promise.all(backends.map((b) => b.close()));
    await stub.close();
  });

  it('acquire sends the owner as Idempotency-Key, the token as Bearer, the key as one path segment; renew and release go through the handle', async () => {
    stub.handle((req, res) => {
      if (req.url.endsWith('/acquire')) return json(res, 200, grant('a/b %c', 7n, 'lhl1.h/7'));
      if (req.url.endsWith('/renew')) return json(res, 200, { ttlMs: 5_000 });
      return json(res, 204);
    });
    const b = connect({ token: 's3cret' });
    const result = await b.acquire(request({ key: 'a/b %c', limit: 3, mode: 'shared' }));
    expect(result).toEqual({ granted: true, token: 7n, ttlMs: 30_000, sequencer: grant('a/b %c', 7n).sequencer });
    const [acq] = stub.requests;
    expect(acq!.method).toBe('POST');
    expect(acq!.url).toBe('/v1/locks/a%2Fb%20%25c/acquire');
    expect(acq!.headers['idempotency-key']).toBe('a1b2c3');
    expect(acq!.headers.authorization).toBe('Bearer s3cret');
    expect(acq!.body).toEqual({ ttlMs: 5_000, mode: 'shared', lockDelayMs: 0, label: 'test-host:1', limit: 3 });
    expect(await b.renew({ key: 'a/b %c', owner: 'a1b2c3', token: 7n, mode: 'shared', ttlMs: 5_000 })).toEqual({ renewed: true, ttlMs: 5_000 });
    await b.release({ key: 'a/b %c', owner: 'a1b2c3', token: 7n, mode: 'shared' });
    expect(stub.requests.slice(1).map((r) => `${r.method} ${r.url}`)).toEqual(['POST /v1/leases/lhl1.h%2F7/renew', 'DELETE /v1/leases/lhl1.h%2F7']);
    expect(stub.requests[1]!.body).toEqual({ ttlMs: 5_000 });
  });

  it('a token in the URL goes as Bearer (never Basic), and a base path prefixes every route', async () => {
    stub.handle((_req, res) => json(res, 200, { locks: [] }));
    const b = connect({ url: `${stub.url.replace('http://', 'http://svc-a:t%2Fk@')}/locks/` });
    expect(await b.inspect('')).toEqual([]);
    expect(stub.requests[0]!.url).toBe('/locks/v1/locks');
    expect(stub.requests[0]!.headers.authorization).toBe('Bearer t/k');
  });

  it("the server's signed sequencer (a service with --sequencer-key) is the lease's", async () => {
    const key = randomBytes(32);
    const signed = signSequencer(formatSequencer('doc', 'exclusive', 12n), key);
    stub.handle((req, res) => (req.url.endsWith('/acquire') ? json(res, 200, { ...grant('doc', 12n), sequencer: signed }) : json(res, 204)));
    const locks = new Locks({ backend: connect() });
    const lease = await locks.acquire('doc', { ttlMs: 5_000, autoRenew: false });
    expect(lease.sequencer).toBe(signed);
    expect(verifySequencer(lease.sequencer, key)).toMatchObject({ key: 'doc', token: 12n });
    await locks.close();
  });

  it("a renew or release that is not the holder's (another owner, another token, already released) sends nothing (I4)", async () => {
    stub.handle((req, res) => (req.url.endsWith('/acquire') ? json(res, 200, grant('k', 3n)) : json(res, 204)));
    const b = connect();
    await b.acquire(request());
    const base = { key: 'k', mode: 'exclusive' as const, ttlMs: 5_000 };
    expect(await b.renew({ ...base, owner: 'someone-else', token: 3n })).toEqual({ renewed: false });
    expect(await b.renew({ ...base, owner: 'a1b2c3', token: 4n })).toEqual({ renewed: false });
    await b.release({ ...base, owner: 'someone-else', token: 3n });
    await b.release({ ...base, owner: 'a1b2c3', token: 4n });
    expect(stub.requests).toHaveLength(1);
    await b.release({ ...base, owner: 'a1b2c3', token: 3n });
    await b.release({ ...base, owner: 'a1b2c3', token: 3n }); // idempotent: the entry is gone, nothing is sent
    expect(stub.requests.map((r) => r.method)).toEqual(['POST', 'DELETE']);
  });

  it('an owner id that is not a valid header value is sent hashed (the same every time)', async () => {
    stub.handle((_req, res) => json(res, 409, { code: 'ACQUIRE_TIMEOUT', message: 'busy' }));
    const b = connect();
    await b.acquire(request({ owner: 'ключ with spaces' }));
    await b.acquire(request({ owner: 'ключ with spaces' }));
    const [first, second] = stub.requests.map((r) => r.headers['idempotency-key']);
    expect(first).toMatch(/^[0-9a-f]{64}$/);
    expect(second).toBe(first);
  });

  it('busy is an answer with the holder; lost (410) is renewed: false and forgets the lease', async () => {
    stub.handle((req, res) => {
      if (req.url.endsWith('/acquire'))
        return req.headers['idempotency-key'] === 'busy'
          ? json(res, 409, { code: 'ACQUIRE_TIMEOUT', message: 'busy', holder: 'worker-a' })
          : json(res, 200, grant('k', 9n));
      return json(res, 410, { code: 'LEASE_LOST', message: 'gone' });
    });
    const b = connect();
    expect(await b.acquire(request({ owner: 'busy' }))).toEqual({ granted: false, holder: 'worker-a' });
    await b.acquire(request());
    expect(await b.renew({ key: 'k', owner: 'a1b2c3', token: 9n, mode: 'exclusive', ttlMs: 5_000 })).toEqual({ renewed: false });
    await b.release({ key: 'k', owner: 'a1b2c3', token: 9n, mode: 'exclusive' });
    expect(stub.requests.map((r) => r.method)).toEqual(['POST', 'POST', 'POST']); // no DELETE after the loss
  });

  it.each([
    [
      400,
      { code: 'INVALID_ARGUMENT', message: 'invalid limit: the key is a semaphore of 3 permits, not 5', field: 'limit' },
      InvalidArgumentError,
      'limit',
      /^invalid limit: the key is a semaphore of 3 permits, not 5$/,
    ],
    [400, { code: 'INVALID_ARGUMENT', message: 'body/foo is not allowed' }, InvalidArgumentError, 'request', /foo/],
    [413, { code: 'PAYLOAD_TOO_LARGE', message: 'too large' }, InvalidArgumentError, 'request', /too large/],
    [401, { code: 'UNAUTHORIZED', message: 'unknown bearer token' }, InvalidArgumentError, 'token', /401/],
    [403, { code: 'FORBIDDEN', message: 'key "x" is outside your prefixes' }, InvalidArgumentError, 'key', /outside/],
    [404, { code: 'NOT_FOUND', message: 'no route' }, InvalidArgumentError, 'url', /lock service/],
    [429, { code: 'RATE_LIMITED', message: 'slow down' }, BackendUnavailableError, undefined, /429 RATE_LIMITED/],
    [503, { code: 'BACKEND_UNAVAILABLE', message: 'postgres: connection refused' }, BackendUnavailableError, undefined, /503/],
  ])('HTTP %i is %o', async (status, body, type, argument, message) => {
    stub.handle((_req, res) => json(res, status, body));
    const error = await connect()
      .acquire(request())
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(type);
    if (argument) expect((error as InvalidArgumentError).argument).toBe(argument);
    else expect((error as BackendUnavailableError).backend).toBe('http');
    expect((error as Error).message).toMatch(message);
  });

  it("a proxy's HTML error page, invalid JSON, a reset and a refused connection are BackendUnavailableError('http')", async () => {
    const b = connect();
    stub.handle((_req, res) => res.writeHead(502, { 'content-type': 'text/html' }).end('<html>Bad Gateway</html>'));
    await expect(b.inspect('')).rejects.toMatchObject({ name: 'BackendUnavailableError', backend: 'http', message: expect.stringMatching(/HTTP 502/) });
    stub.handle((_req, res) => res.writeHead(200, { 'content-type': 'application/json' }).end('{"locks": ['));
    await expect(b.inspect('')).rejects.toMatchObject({ name: 'BackendUnavailableError', message: expect.stringMatching(/not valid JSON/) });
    stub.handle((_req, res) => res.socket?.destroy());
    await expect(b.inspect('')).rejects.toBeInstanceOf(BackendUnavailableError);
    stub.handle((_req, res) => json(res, 200, { locks: [{ key: 'k', lastToken: 7 }] })); // a token as a JSON number is not the API
    await expect(b.inspect('')).rejects.toMatchObject({ name: 'BackendUnavailableError', message: expect.stringMatching(/lock entry/) });
    const closed = httpBackend({ url: 'http://127.0.0.1:1' });
    await expect(closed.inspect('')).rejects.toMatchObject({ name: 'BackendUnavailableError', message: expect.stringMatching(/ECONNREFUSED/) });
    await closed.close();
  });

  it('a server that never answers is a BackendUnavailableError after timeoutMs', async () => {
    stub.handle(() => {}); // holds the request
    const started = performance.now();
    const error = await connect({ timeoutMs: 300 })
      .inspect('')
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(BackendUnavailableError);
    expect((error as Error).message).toMatch(/no answer .* within 300 ms/);
    expect(performance.now() - started).toBeGreaterThanOrEqual(250);
  });

  it('inspect reads tokens from strings into bigints, under the prefix asked for', async () => {
    stub.handle((_req, res) =>
      json(res, 200, {
        locks: [
          {
            key: 'p/a',
            lastToken: '9007199254740993',
            holders: [{ mode: 'shared', token: '9007199254740993', holder: 'h', expiresInMs: 900 }],
            waiters: 2,
            lockDelayRemainingMs: 0,
            limit: 3,
          },
          { key: 'p/b', lastToken: '0', holders: [], waiters: 0, lockDelayRemainingMs: 50 },
        ],
      }),
    );
    const states = await connect().inspect('p/');
    expect(stub.requests[0]!.url).toBe('/v1/locks?prefix=p%2F');
    expect(states).toEqual([
      {
        key: 'p/a',
        lastToken: 9007199254740993n,
        holders: [{ mode: 'shared', token: 9007199254740993n, holder: 'h', expiresInMs: 900 }],
        waiters: 2,
        lockDelayRemainingMs: 0,
        limit: 3,
      },
      { key: 'p/b', lastToken: 0n, holders: [], waiters: 0, lockDelayRemainingMs: 50 },
    ]);
  });

  it('a long poll sends waitMs (at most 60 s), and aborting it cuts the request; the owner then asks once more without waiting and gives back what it gets', async () => {
    let polls = 0;
    stub.handle((req, res) => {
      if (req.url.endsWith('/acquire') && (req.body as { waitMs?: number }).waitMs) {
        polls++;
        return; // held, as the server holds a long poll
      }
      if (req.url.endsWith('/acquire')) return json(res, 200, grant('k', 5n)); // granted at the instant of the abort
      return json(res, 204);
    });
    const b = connect();
    const controller = new AbortController();
    const pending = b.acquire(request({ waitMs: 90_000, signal: controller.signal })).catch((e: unknown) => e);
    await eventually(() => polls === 1, 5_000);
    controller.abort(new Error('gave up'));
    const error = await pending;
    expect(error).toBeInstanceOf(BackendUnavailableError);
    expect(stub.requests[0]!.body).toMatchObject({ waitMs: 60_000 });
    await eventually(() => stub.requests.some((r) => r.method === 'DELETE'), 5_000);
    expect(stub.requests[0]!.closedEarly()).toBe(true); // the server saw the client go
    expect(stub.requests.map((r) => `${r.method} ${r.url}`)).toEqual(['POST /v1/locks/k/acquire', 'POST /v1/locks/k/acquire', 'DELETE /v1/leases/lhl1.test-5']);
    expect(stub.requests[1]!.headers['idempotency-key']).toBe('a1b2c3');
    expect(stub.requests[1]!.body).not.toHaveProperty('waitMs');
  });

  it("one owner's acquires of a key never overlap: a retry is sent once the first request has its answer", async () => {
    const answers: (() => void)[] = [];
    stub.handle((_req, res) => answers.push(() => json(res, 409, { code: 'ACQUIRE_TIMEOUT', message: 'busy' })));
    const b = connect();
    const first = b.acquire(request());
    const retry = b.acquire(request()); // core's retry after its own deadline, same owner
    const other = b.acquire(request({ owner: 'another-owner' })); // another owner goes at once
    await eventually(() => stub.requests.length === 2, 5_000);
    await new Promise((r) => setTimeout(r, 200));
    expect(stub.requests.map((r) => r.headers['idempotency-key'])).toEqual(['a1b2c3', 'another-owner']);
    answers.shift()!(); // the first one's answer
    expect(await first).toEqual({ granted: false });
    await eventually(() => stub.requests.length === 3, 5_000);
    expect(stub.requests[2]!.headers['idempotency-key']).toBe('a1b2c3');
    for (const answer of answers.splice(0)) answer();
    expect(await retry).toEqual({ granted: false });
    expect(await other).toEqual({ granted: false });
  });

  it('close() cuts a request in flight at once and refuses later calls with ClosedError', async () => {
    stub.handle(() => {}); // never answers
    const b = connect();
    const pending = b.inspect('').catch((e: unknown) => e);
    await eventually(() => stub.requests.length === 1, 5_000);
    const started = performance.now();
    await b.close();
    expect(await pending).toBeInstanceOf(ClosedError);
    expect(performance.now() - started).toBeLessThan(1_000);
    await expect(b.inspect('')).rejects.toBeInstanceOf(ClosedError);
  });

  it('sessions: open, keep-alive and close by handle; a keep-alive answered 404 is a lost session', async () => {
    stub.handle((req, res) => {
      if (req.url === '/v1/sessions') return json(res, 201, { session: 'lhs1.s/1', ttlMs: 4_000 });
      if (req.url.endsWith('/keepalive'))
        return req.url.includes('gone') ? json(res, 404, { code: 'NOT_FOUND', message: 'unknown session' }) : json(res, 200, { ttlMs: 4_000 });
      if (req.url.endsWith('/acquire')) return json(res, 404, { code: 'NOT_FOUND', message: 'unknown session' });
      return json(res, 204);
    });
    const b = connect();
    expect(await b.sessions!.open(4_000)).toEqual({ id: 'lhs1.s/1', ttlMs: 4_000 });
    expect(stub.requests[0]!.body).toEqual({ ttlMs: 4_000 });
    expect(await b.sessions!.keepAlive('lhs1.s/1', 4_000)).toBe(true);
    expect(await b.sessions!.keepAlive('gone', 4_000)).toBe(false);
    expect(await b.acquire(request({ session: 'lhs1.s/1' }))).toEqual({ granted: false, sessionLost: true });
    await b.sessions!.close('lhs1.s/1');
    expect(stub.requests.map((r) => `${r.method} ${r.url}`)).toEqual([
      'POST /v1/sessions',
      'POST /v1/sessions/lhs1.s%2F1/keepalive',
      'POST /v1/sessions/gone/keepalive',
      'POST /v1/locks/k/acquire',
      'DELETE /v1/sessions/lhs1.s%2F1',
    ]);
    expect(stub.requests[3]!.body).toMatchObject({ session: 'lhs1.s/1' });
  });

  it('over a server without sessions (501) the client keeps them: a keep-alive renews each lease; one lost loses the session and the others are given back', async () => {
    const lost = new Set<string>();
    stub.handle((req, res) => {
      if (req.url === '/v1/sessions') return json(res, 501, { code: 'NOT_SUPPORTED', message: 'the redlock backend has no sessions' });
      if (req.url.endsWith('/acquire')) {
        const key = decodeURIComponent(req.url.split('/')[3]!);
        return json(res, 200, grant(key, BigInt(key.length), `lhl1.${key}`));
      }
      if (req.url.endsWith('/renew')) return lost.has(req.url) ? json(res, 410, { code: 'LEASE_LOST', message: 'gone' }) : json(res, 200, { ttlMs: 4_000 });
      return json(res, 204);
    });
    const b = connect();
    const { id } = await b.sessions!.open(4_000);
    expect(id).toMatch(/^local:/);
    await b.acquire(request({ key: 'a', owner: 'o1', session: id }));
    await b.acquire(request({ key: 'bb', owner: 'o2', session: id }));
    expect(stub.requests.filter((r) => r.url.endsWith('/acquire')).every((r) => !Object.hasOwn(r.body as object, 'session'))).toBe(true);
    expect(await b.sessions!.keepAlive(id, 4_000)).toBe(true);
    expect(stub.requests.filter((r) => r.url.endsWith('/renew')).map((r) => r.url)).toEqual(['/v1/leases/lhl1.a/renew', '/v1/leases/lhl1.bb/renew']);
    lost.add('/v1/leases/lhl1.a/renew');
    expect(await b.sessions!.keepAlive(id, 4_000)).toBe(false);
    expect(stub.requests.filter((r) => r.method === 'DELETE').map((r) => r.url)).toContain('/v1/leases/lhl1.bb');
    expect(await b.sessions!.keepAlive(id, 4_000)).toBe(false); // lost for good
    // closing one ends it too: its leases are given back and its keep-alive answers false
    const other = await b.sessions!.open(4_000);
    await b.acquire(request({ key: 'ccc', owner: 'o3', session: other.id }));
    await b.sessions!.close(other.id);
    expect(stub.requests.at(-1)).toMatchObject({ method: 'DELETE', url: '/v1/leases/lhl1.ccc' });
    expect(await b.sessions!.keepAlive(other.id, 4_000)).toBe(false);
  });
});

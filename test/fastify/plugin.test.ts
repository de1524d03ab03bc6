/**
 * leasehold/fastify over real HTTP (fastify listening on 127.0.0.1, requests with fetch): the first
 * request runs the route, a repeat replays status, headers and body; a repeat while the first runs
 * is 409, another request under the same key 422, a missing key on a route that requires one 400;
 * a route that throws stores nothing and a retry runs again; a response too large to store says so.
 * On the memory store, and across two servers sharing Redis (the store and the coordinator).
 */
import { Writable } from 'node:stream';
import Fastify, { type FastifyInstance } from 'fastify';
import { Redis } from 'ioredis';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { createIdempotency } from '../../src/core/idempotency.js';
import { Locks } from '../../src/core/locks.js';
import { type FastifyIdempotencyOptions, fastifyIdempotency } from '../../src/fastify/index.js';
import { memoryBackend, memoryIdempotencyStore } from '../../src/memory/index.js';
import { redisBackend, redisIdempotencyStore } from '../../src/redis/index.js';
import { uniqueName } from '../helpers/env.js';
import { deleteKeys, REDIS_URL } from '../redis/servers.js';

const apps: FastifyInstance[] = [];
const locksOpened: Locks[] = [];
afterEach(async () => {
  await Promise.all(apps.splice(0).map((a) => a.close()));
  await Promise.all(locksOpened.splice(0).map((l) => l.close()));
});

/** A gate a route waits on, opened by the test. */
function gate(): { wait: Promise<void>; open: () => void } {
  let open!: () => void;
  const wait = new Promise<void>((r) => (open = r));
  return { wait, open };
}

interface Server {
  url: string;
  app: FastifyInstance;
  runs: Record<string, number>;
  logs: { level: number; msg: string }[];
}

/** A server with a few routes under the plugin; `routes` adds more before it listens. */
async function serve(options: Partial<FastifyIdempotencyOptions> = {}, routes?: (app: FastifyInstance, runs: Record<string, number>) => void): Promise<Server> {
  const logs: { level: number; msg: string }[] = [];
  const stream = new Writable({
    write(chunk: Buffer, _enc, done) {
      for (const line of chunk.toString().split('\n').filter(Boolean)) logs.push(JSON.parse(line) as { level: number; msg: string });
      done();
    },
  });
  const app = Fastify({ logger: { level: 'warn', stream } });
  apps.push(app);
  const runs: Record<string, number> = {};
  const count = (name: string): number => (runs[name] = (runs[name] ?? 0) + 1);
  let idempotency = options.idempotency;
  if (idempotency === undefined) {
    const locks = new Locks({ backend: memoryBackend() });
    locksOpened.push(locks);
    idempotency = { locks, store: memoryIdempotencyStore() };
  }
  await app.register(fastifyIdempotency, { ...options, idempotency });
  app.post('/orders', async (request, reply) => {
    const n = count('orders');
    reply.code(201).header('location', `/orders/${n}`).header('x-run', String(n));
    return { order: n, body: request.body, token: String(request.idempotencyLease?.token) };
  });
  routes?.(app, runs);
  await app.listen({ port: 0, host: '127.0.0.1' });
  const { port } = app.server.address() as { port: number };
  return { url: `http://127.0.0.1:${port}`, app, runs, logs };
}

const post = (url: string, key: string | undefined, body: unknown = { amount: 5 }, method = 'POST') =>
  fetch(url, {
    method,
    headers: { 'content-type': 'application/json', ...(key === undefined ? {} : { 'idempotency-key': key }) },
    body: JSON.stringify(body),
  });

describe('leasehold/fastify', () => {
  it('the first request runs the route; a repeat replays its status, the headers that matter and its body', async () => {
    const s = await serve();
    const first = await post(`${s.url}/orders`, '"order-17"');
    const firstBody = await first.text();
    expect(first.status).toBe(201);
    expect(first.headers.get('location')).toBe('/orders/1');
    expect(first.headers.get('idempotent-replayed')).toBeNull();
    expect(JSON.parse(firstBody)).toMatchObject({ order: 1, body: { amount: 5 } });
    expect(JSON.parse(firstBody).token).toMatch(/^[1-9]\d*$/); // the route saw its claim's lease

    const again = await post(`${s.url}/orders`, 'order-17'); // the same key, sent bare
    expect(again.status).toBe(201);
    expect(await again.text()).toBe(firstBody);
    expect(again.headers.get('location')).toBe('/orders/1');
    expect(again.headers.get('content-type')).toBe(first.headers.get('content-type'));
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(again.headers.get('x-run')).toBeNull(); // not in the headers kept
    expect(s.runs.orders).toBe(1);

    // another key runs again
    expect((await post(`${s.url}/orders`, 'order-18')).status).toBe(201);
    expect(s.runs.orders).toBe(2);
  });

  it('a repeat while the first request runs gets 409; after it, the stored response', async () => {
    const g = gate();
    const s = await serve({}, (app, runs) =>
      app.post('/slow', async () => {
        runs.slow = (runs.slow ?? 0) + 1;
        await g.wait;
        return { done: true };
      }),
    );
    const first = post(`${s.url}/slow`, 'k1');
    while (!s.runs.slow) await new Promise((r) => setTimeout(r, 5));
    const concurrent = await post(`${s.url}/slow`, 'k1');
    expect(concurrent.status).toBe(409);
    expect(await concurrent.json()).toEqual({ code: 'IDEMPOTENCY_IN_PROGRESS', message: expect.any(String) });
    g.open();
    const done = await first;
    expect(done.status).toBe(200);
    expect(await done.json()).toEqual({ done: true });
    const later = await post(`${s.url}/slow`, 'k1');
    expect(later.headers.get('idempotent-replayed')).toBe('true');
    expect(await later.json()).toEqual({ done: true });
    expect(s.runs.slow).toBe(1);
  });

  it('with a waitMs, a concurrent repeat waits for the first response and replays it', async () => {
    const g = gate();
    const locks = new Locks({ backend: memoryBackend() });
    locksOpened.push(locks);
    const s = await serve({ idempotency: createIdempotency({ locks, store: memoryIdempotencyStore(), waitMs: 5_000 }) }, (app, runs) =>
      app.post('/slow', async () => {
        runs.slow = (runs.slow ?? 0) + 1;
        await g.wait;
        return { done: runs.slow };
      }),
    );
    const first = post(`${s.url}/slow`, 'k1');
    while (!s.runs.slow) await new Promise((r) => setTimeout(r, 5));
    const second = post(`${s.url}/slow`, 'k1');
    await new Promise((r) => setTimeout(r, 100));
    g.open();
    const [a, b] = await Promise.all([first, second]);
    expect([a.status, b.status]).toEqual([200, 200]);
    expect(await b.json()).toEqual(await a.json());
    expect(b.headers.get('idempotent-replayed')).toBe('true');
    expect(s.runs.slow).toBe(1);
  });

  it('the same key with another body, URL or method is refused with 422, never replayed', async () => {
    const s = await serve({}, (app) => app.patch('/orders', async () => ({ patched: true })));
    expect((await post(`${s.url}/orders`, 'k1', { amount: 5 })).status).toBe(201);
    for (const res of [
      await post(`${s.url}/orders`, 'k1', { amount: 6 }),
      await post(`${s.url}/orders?x=1`, 'k1'),
      await post(`${s.url}/orders`, 'k1', { amount: 5 }, 'PATCH'),
    ]) {
      expect(res.status).toBe(422);
      expect(await res.json()).toEqual({ code: 'IDEMPOTENCY_MISMATCH', message: expect.any(String) });
    }
    // key order in the JSON body does not make another request
    expect((await post(`${s.url}/orders`, 'k2', { a: 1, b: 2 })).status).toBe(201);
    expect((await post(`${s.url}/orders`, 'k2', { b: 2, a: 1 })).headers.get('idempotent-replayed')).toBe('true');
    expect(s.runs.orders).toBe(2);
  });

  it('a missing key is a 400 where required (option or route config), and runs unguarded where not', async () => {
    const s = await serve({ required: (request) => request.url.startsWith('/orders') }, (app, runs) => {
      app.post('/optional', async () => ({ run: (runs.optional = (runs.optional ?? 0) + 1) }));
      app.post('/must', { config: { idempotency: { required: true } } }, async () => ({ ok: true }));
    });
    for (const path of ['/orders', '/must']) {
      const res = await post(`${s.url}${path}`, undefined);
      expect(res.status).toBe(400);
      expect(await res.json()).toEqual({ code: 'IDEMPOTENCY_KEY_MISSING', message: expect.stringContaining('Idempotency-Key') });
    }
    expect(await (await post(`${s.url}/optional`, undefined)).json()).toEqual({ run: 1 });
    expect(await (await post(`${s.url}/optional`, undefined)).json()).toEqual({ run: 2 });
    const bad = await post(`${s.url}/orders`, 'a key with spaces');
    expect(bad.status).toBe(400);
    expect(await bad.json()).toMatchObject({ code: 'IDEMPOTENCY_KEY_INVALID' });
    expect(s.runs.orders).toBeUndefined();
  });

  it('a route that throws (here a 402): the error is sent, nothing is stored, and a retry runs the route again', async () => {
    let fail = true;
    const s = await serve({}, (app, runs) =>
      app.post('/charge', async () => {
        runs.charge = (runs.charge ?? 0) + 1;
        // a 4xx error thrown is not a result either (a status below 500 alone does not make it one)
        if (fail) throw Object.assign(new Error('card declined'), { statusCode: 402 });
        return { charged: true };
      }),
    );
    const failed = await post(`${s.url}/charge`, 'c1');
    expect(failed.status).toBe(402);
    expect(failed.headers.get('idempotent-replayed')).toBeNull();
    const again = await post(`${s.url}/charge`, 'c1');
    expect(again.status).toBe(402);
    expect(s.runs.charge).toBe(2);
    fail = false;
    const ok = await post(`${s.url}/charge`, 'c1');
    expect(ok.status).toBe(200);
    expect(await ok.json()).toEqual({ charged: true });
    expect((await post(`${s.url}/charge`, 'c1')).headers.get('idempotent-replayed')).toBe('true');
    expect(s.runs.charge).toBe(3);
  });

  it('a 5xx answer is not stored either (a server error is for the client to retry)', async () => {
    const s = await serve({}, (app, runs) =>
      app.post('/busy', async (_request, reply) => {
        runs.busy = (runs.busy ?? 0) + 1;
        return reply.code(503).send({ busy: true });
      }),
    );
    expect((await post(`${s.url}/busy`, 'b1')).status).toBe(503);
    expect((await post(`${s.url}/busy`, 'b1')).status).toBe(503);
    expect(s.runs.busy).toBe(2);
  });

  it('a response larger than maxBodyBytes is sent but not stored, and says so (a header, a warning)', async () => {
    const s = await serve({ maxBodyBytes: 100 }, (app, runs) => {
      app.post('/big', async () => ({ run: (runs.big = (runs.big ?? 0) + 1), pad: 'x'.repeat(200) }));
      app.post('/small', async () => ({ ok: true }));
    });
    const big = await post(`${s.url}/big`, 'g1');
    expect(big.status).toBe(200);
    expect(big.headers.get('idempotency-stored')).toBe('false');
    expect(((await big.json()) as { pad: string }).pad).toHaveLength(200);
    expect(s.logs.some((l) => l.level === 40 && /not stored .*maxBodyBytes \(100\)/.test(l.msg))).toBe(true);
    expect(await (await post(`${s.url}/big`, 'g1')).json()).toMatchObject({ run: 2 });
    const small = await post(`${s.url}/small`, 's1');
    expect(small.headers.get('idempotency-stored')).toBeNull();
    expect((await post(`${s.url}/small`, 's1')).headers.get('idempotent-replayed')).toBe('true');
  });

  it('bytes, empty bodies and per-route opt-in and opt-out', async () => {
    const s = await serve({}, (app, runs) => {
      app.post('/bytes', async (_request, reply) => {
        runs.bytes = (runs.bytes ?? 0) + 1;
        return reply.type('application/octet-stream').send(Buffer.from([0, 1, 2, 255]));
      });
      app.post('/empty', async (_request, reply) => {
        runs.empty = (runs.empty ?? 0) + 1;
        return reply.code(204).send();
      });
      app.post('/out', { config: { idempotency: false } }, async () => ({ out: (runs.out = (runs.out ?? 0) + 1) }));
      app.put('/in', { config: { idempotency: true } }, async () => ({ in: (runs.in = (runs.in ?? 0) + 1) }));
      app.put('/plain', async () => ({ plain: (runs.plain = (runs.plain ?? 0) + 1) }));
    });
    for (let i = 0; i < 2; i++) {
      const bytes = await post(`${s.url}/bytes`, 'b');
      expect(new Uint8Array(await bytes.arrayBuffer())).toEqual(new Uint8Array([0, 1, 2, 255]));
      expect(bytes.headers.get('content-type')).toBe('application/octet-stream');
      const empty = await post(`${s.url}/empty`, 'e');
      expect(empty.status).toBe(204);
      expect(await empty.text()).toBe('');
      await post(`${s.url}/out`, 'o');
      await post(`${s.url}/in`, 'i', {}, 'PUT');
      await post(`${s.url}/plain`, 'p', {}, 'PUT');
    }
    expect(s.runs).toMatchObject({ bytes: 1, empty: 1, out: 2, in: 1, plain: 2 });
  });

  it('scope keeps one client from replaying another client’s response under the same key', async () => {
    const s = await serve({ scope: (request) => String(request.headers['x-client']) }, (app, runs) =>
      app.post('/mine', async (request) => ({ for: request.headers['x-client'], run: (runs.mine = (runs.mine ?? 0) + 1) })),
    );
    const as = (client: string) =>
      fetch(`${s.url}/mine`, { method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': 'same', 'x-client': client }, body: '{}' });
    expect(await (await as('alice')).json()).toEqual({ for: 'alice', run: 1 });
    expect(await (await as('bob')).json()).toEqual({ for: 'bob', run: 2 });
    expect(await (await as('alice')).json()).toEqual({ for: 'alice', run: 1 });
  });

  it('refuses bad options by name when registered', async () => {
    const locks = new Locks({ backend: memoryBackend() });
    locksOpened.push(locks);
    const store = memoryIdempotencyStore();
    for (const [options, name] of [
      [{ idempotency: {} }, 'options.idempotency'],
      [{ idempotency: { locks, store }, required: 'yes' }, 'options.required'],
      [{ idempotency: { locks, store }, methods: 'POST' }, 'options.methods'],
      [{ idempotency: { locks, store }, maxBodyBytes: -1 }, 'options.maxBodyBytes'],
      [{ idempotency: { locks, store }, nope: 1 }, 'options.nope'],
    ] as const) {
      const app = Fastify();
      await expect(app.register(fastifyIdempotency, options as never).ready()).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', argument: name });
      await app.close();
    }
  });
});

describe('leasehold/fastify on Redis: two servers share the store and the coordinator', () => {
  const ns = `${uniqueName('lh_fastify')}:`;
  const io = new Redis(REDIS_URL);
  afterAll(async () => {
    await deleteKeys(REDIS_URL, ns);
    io.disconnect();
  });
  const server = async (routes: (app: FastifyInstance, runs: Record<string, number>) => void) => {
    const locks = new Locks({ backend: redisBackend({ url: REDIS_URL, prefix: `${ns}lock:` }) });
    locksOpened.push(locks);
    return serve({ idempotency: { locks, store: redisIdempotencyStore(io, { prefix: `${ns}idem:` }) } }, routes);
  };

  it('a repeat on the other server replays; a concurrent one there gets 409', async () => {
    const g = gate();
    const routes = (app: FastifyInstance, runs: Record<string, number>) =>
      app.post('/pay', async (request) => {
        runs.pay = (runs.pay ?? 0) + 1;
        if ((request.body as { slow?: boolean }).slow) await g.wait;
        return { paid: true, token: String(request.idempotencyLease?.token) };
      });
    const [a, b] = [await server(routes), await server(routes)];
    const first = await post(`${a.url}/pay`, 'p1');
    const body = await first.text();
    const again = await post(`${b.url}/pay`, 'p1');
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(await again.text()).toBe(body);

    const slow = post(`${a.url}/pay`, 'p2', { slow: true });
    while (!a.runs.pay || a.runs.pay < 2) await new Promise((r) => setTimeout(r, 5));
    expect((await post(`${b.url}/pay`, 'p2', { slow: true })).status).toBe(409);
    expect((await post(`${b.url}/pay`, 'p2', { slow: false })).status).toBe(409); // in flight: 409 before the payload is compared
    g.open();
    expect((await slow).status).toBe(200);
    expect((await post(`${b.url}/pay`, 'p2', { slow: false })).status).toBe(422);
    expect(a.runs.pay).toBe(2);
    expect(b.runs.pay).toBeUndefined();
  });
});

/**
 * GET /v1/openapi.json: an OpenAPI 3 document generated from the route schemas (@fastify/swagger).
 * It has the structure of one (version, info, paths of operations with responses, path parameters
 * declared), lists every /v1 route the server has with its methods (read from fastify's own route
 * table) and no route it lacks, and documents request schemas that refuse unknown fields — checked
 * against the server: each documented body and query refuses an unknown field with a 400 naming
 * it. With --auth it declares the bearer scheme; without @fastify/swagger the route is a 501.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { memoryBackend } from '../../src/memory/index.js';
import { createLockServer, type LockServerApp } from '../../src/serve/index.js';
import { AS_A, AUTH, call } from './helpers.js';
import { askScript, runWithout } from './without-peers.js';

const apps: LockServerApp[] = [];
afterEach(async () => {
  await Promise.allSettled(apps.splice(0).map((a) => a.close()));
});

async function app(options: Partial<Parameters<typeof createLockServer>[0]> = {}): Promise<LockServerApp> {
  const a = await createLockServer({ backend: memoryBackend({ sessions: true }), ...options });
  apps.push(a);
  await a.ready();
  return a;
}

type Operation = {
  parameters?: { in: string; name: string; required?: boolean; schema?: unknown }[];
  requestBody?: { required?: boolean; content: Record<string, { schema: Record<string, unknown> }> };
  responses: Record<string, { description?: string; content?: Record<string, unknown> }>;
};
type Document = {
  openapi: string;
  info: { title: string; version: string };
  paths: Record<string, Record<string, Operation>>;
  components?: { securitySchemes?: Record<string, unknown> };
  security?: unknown[];
};

const METHODS = ['get', 'put', 'post', 'delete', 'options', 'head', 'patch', 'trace'];

/** The routes of fastify's route table (printRoutes' tree, read back into full paths), as `METHOD /path`, HEAD left out. */
function routeTable(a: LockServerApp): string[] {
  const routes: string[] = [];
  const stack: string[] = [];
  for (const line of a.printRoutes({ commonPrefix: false }).split('\n')) {
    const m = /^(.*?)(?:└── |├── )(.+?)(?: \(([^)]*)\))?$/.exec(line);
    if (!m) continue;
    const depth = m[1]!.length / 4;
    stack.length = depth;
    stack.push(m[2]!);
    const path = stack.join('');
    for (const method of (m[3] ?? '').split(', ').filter((x) => x !== '' && x !== 'HEAD')) routes.push(`${method} ${path}`);
  }
  return routes.sort();
}

/** A document path (`/v1/leases/{lease}`) as fastify writes it (`/v1/leases/:lease`). */
const fastifyPath = (path: string): string => path.replace(/\{(\w+)\}/g, ':$1');

describe('GET /v1/openapi.json', () => {
  it('is an OpenAPI 3 document: version, info, operations with described responses, every path parameter declared', async () => {
    const a = await app();
    const res = await call(a, 'GET', '/v1/openapi.json');
    expect(res.status).toBe(200);
    expect(res.raw.headers['content-type']).toBe('application/json; charset=utf-8');
    const doc = res.body as unknown as Document;
    expect(doc.openapi).toMatch(/^3\.\d+\.\d+$/);
    expect(doc.info).toMatchObject({ title: 'leasehold serve', version: '1' });
    expect(Object.keys(doc.paths).length).toBeGreaterThan(10);
    for (const [path, item] of Object.entries(doc.paths)) {
      expect(path.startsWith('/')).toBe(true);
      for (const [method, op] of Object.entries(item)) {
        expect(METHODS).toContain(method);
        expect(Object.keys(op.responses).length).toBeGreaterThan(0);
        for (const [status, response] of Object.entries(op.responses)) {
          expect(status).toMatch(/^(default|[1-5]\d\d)$/);
          expect(typeof response.description).toBe('string');
        }
        const declared = (op.parameters ?? []).filter((p) => p.in === 'path').map((p) => p.name);
        const templated = [...path.matchAll(/\{(\w+)\}/g)].map((m) => m[1]);
        expect(declared.sort()).toEqual(templated.sort());
        for (const p of op.parameters ?? []) {
          expect(['path', 'query', 'header', 'cookie']).toContain(p.in);
          if (p.in === 'path') expect(p.required).toBe(true);
        }
        // OpenAPI 3.0 has no type arrays (nullable instead): the generator rewrote ours.
        expect(JSON.stringify(op)).not.toMatch(/"type":\[/);
      }
    }
    // Tokens are strings; lastToken may be null.
    expect(doc.paths['/v1/sequencers/check']?.post?.responses['200']?.content).toMatchObject({
      'application/json': { schema: { properties: { token: { type: 'string' }, lastToken: { type: 'string', nullable: true } } } },
    });
  });

  it('lists every /v1 route of the server with its methods, and no route the server lacks', async () => {
    const a = await app();
    const doc = (await call(a, 'GET', '/v1/openapi.json')).body as unknown as Document;
    const documented = Object.entries(doc.paths)
      .flatMap(([path, item]) => Object.keys(item).map((m) => `${m.toUpperCase()} ${fastifyPath(path)}`))
      .sort();
    const served = routeTable(a);
    expect(served.filter((r) => r.includes(' /v1/'))).toEqual(documented.filter((r) => r.includes(' /v1/')));
    // The contract's routes (docs/http-api.md), and the service's others.
    expect(documented).toEqual(
      [
        'POST /v1/sessions',
        'POST /v1/sessions/:session/keepalive',
        'DELETE /v1/sessions/:session',
        'POST /v1/locks/:key/acquire',
        'POST /v1/leases/:lease/renew',
        'DELETE /v1/leases/:lease',
        'GET /v1/locks',
        'POST /v1/sequencers/check',
        'GET /v1/events',
        'GET /v1/health',
        'GET /v1/openapi.json',
        'GET /metrics',
        'GET /',
      ].sort(),
    );
    for (const route of documented) {
      const [method, url] = route.split(' ') as [string, string];
      expect(a.hasRoute({ method: method as 'GET', url })).toBe(true);
    }
  });

  it('documents strict request schemas, and the server refuses an unknown body field or query parameter as documented (400 naming it)', async () => {
    const a = await app();
    const doc = (await call(a, 'GET', '/v1/openapi.json')).body as unknown as Document;
    let bodies = 0;
    let queries = 0;
    for (const [path, item] of Object.entries(doc.paths)) {
      for (const [method, op] of Object.entries(item)) {
        const url = path.replace(/\{(\w+)\}/g, 'x');
        if (op.requestBody) {
          const schema = op.requestBody.content['application/json']?.schema;
          expect(schema, `${method} ${path}`).toMatchObject({ type: 'object', additionalProperties: false });
          // Nothing is required of a body: a request without one reads as {}.
          expect(op.requestBody.required).toBe(false);
          // The required fields present (a string where a string is wanted), and one unknown field.
          const required = Object.fromEntries(((schema?.required as string[] | undefined) ?? []).map((name) => [name, 'x']));
          const res = await call(a, method.toUpperCase() as 'POST', url, { ...required, unknownField: 1 });
          expect(res.status, `${method} ${path}`).toBe(400);
          expect(res.body).toMatchObject({ code: 'INVALID_ARGUMENT', field: 'unknownField' });
          bodies++;
        }
        if ((op.parameters ?? []).some((p) => p.in === 'query')) {
          const res = await call(a, method.toUpperCase() as 'GET', `${url}?unknownParam=1`);
          expect(res.status, `${method} ${path}`).toBe(400);
          expect(res.body).toMatchObject({ code: 'INVALID_ARGUMENT', field: 'unknownParam' });
          queries++;
        }
      }
    }
    expect([bodies, queries]).toEqual([7, 2]);
  });

  it('with --auth: declares the bearer scheme, and is a 401 without a token like every route', async () => {
    const a = await app({ auth: AUTH });
    expect((await call(a, 'GET', '/v1/openapi.json')).status).toBe(401);
    const doc = (await call(a, 'GET', '/v1/openapi.json', undefined, AS_A)).body as unknown as Document;
    expect(doc.components?.securitySchemes).toEqual({ bearer: expect.objectContaining({ type: 'http', scheme: 'bearer' }) });
    expect(doc.security).toEqual([{ bearer: [] }]);
    const open = (await call(await app(), 'GET', '/v1/openapi.json')).body as unknown as Document;
    expect(open.security).toBeUndefined();
  });

  it('without @fastify/swagger installed: 501 NOT_SUPPORTED naming the package, and the server works', () => {
    const answers = JSON.parse(runWithout(['@fastify/swagger'], askScript(['/v1/openapi.json', '/metrics']))) as Record<string, [number, unknown]>;
    expect(answers.acquire?.[0]).toBe(200);
    expect(answers['/metrics']?.[0]).toBe(200);
    expect(answers['/v1/openapi.json']?.[0]).toBe(501);
    expect(JSON.parse(answers['/v1/openapi.json']?.[1] as string)).toMatchObject({
      code: 'NOT_SUPPORTED',
      message: expect.stringContaining('npm install @fastify/swagger'),
    });
  });
});

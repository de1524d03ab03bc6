// Shared pieces of the lock service's tests: callers with tokens, JSON requests through `inject`,
// and fetch against a listening server.
import { createHash } from 'node:crypto';
import type { LightMyRequestResponse } from 'fastify';
import { type AuthConfig, type LockServerApp, parseAuthConfig } from '../../src/serve/index.js';

export const sha256 = (text: string): string => createHash('sha256').update(text, 'utf8').digest('hex');

/** Two callers: `svc-a` (token `token-a`, keys under `a/`) and `svc-b` (token `token-b`, keys under `b/` and `shared/`). */
export const AUTH: AuthConfig = parseAuthConfig({
  callers: [
    { name: 'svc-a', tokenSha256: sha256('token-a'), prefixes: ['a/'] },
    { name: 'svc-b', tokenSha256: sha256('token-b'), prefixes: ['b/', 'shared/'] },
  ],
});
export const AS_A = { authorization: 'Bearer token-a' };
export const AS_B = { authorization: 'Bearer token-b' };

export interface Answer {
  status: number;
  body: Record<string, unknown>;
  raw: LightMyRequestResponse;
}

/** One request through fastify's inject; `body` is sent as JSON. */
export async function call(
  app: LockServerApp,
  method: 'GET' | 'POST' | 'DELETE' | 'PUT' | 'PATCH',
  url: string,
  body?: unknown,
  headers: Record<string, string> = {},
): Promise<Answer> {
  const raw = await app.inject({
    method,
    url,
    headers: { ...(body !== undefined && { 'content-type': 'application/json' }), ...headers },
    ...(body !== undefined && { payload: typeof body === 'string' ? body : JSON.stringify(body) }),
  });
  const text = raw.body;
  return { status: raw.statusCode, body: text === '' ? {} : (JSON.parse(text) as Record<string, unknown>), raw };
}

/** The path of a key's acquire route. */
export const acquirePath = (key: string): string => `/v1/locks/${encodeURIComponent(key)}/acquire`;

/** One request to a listening server. */
export async function http(
  base: string,
  method: string,
  path: string,
  body?: unknown,
  headers: Record<string, string> = {},
  signal?: AbortSignal,
): Promise<{ status: number; body: Record<string, unknown> }> {
  const res = await fetch(base + path, {
    method,
    headers: { ...(body !== undefined && { 'content-type': 'application/json' }), ...headers },
    ...(body !== undefined && { body: JSON.stringify(body) }),
    ...(signal && { signal }),
  });
  const text = await res.text();
  return { status: res.status, body: text === '' ? {} : (JSON.parse(text) as Record<string, unknown>) };
}

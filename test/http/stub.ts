/**
 * A scripted HTTP server for the client's own tests: answers what each test tells it to (the
 * answers a real lock service seldom gives — a 503, a proxy's HTML page, invalid JSON, no answer at
 * all) and records every request. The client against a real `leasehold serve` is
 * test/conformance/http.test.ts.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

export interface Recorded {
  readonly method: string;
  /** Path and query, as sent (percent-encoded). */
  readonly url: string;
  readonly headers: IncomingMessage['headers'];
  readonly body: unknown;
  /** Set once the client went away before an answer was written. */
  readonly closedEarly: () => boolean;
}

export type Handler = (req: Recorded, res: ServerResponse) => unknown;

export interface Stub {
  readonly url: string;
  readonly requests: Recorded[];
  /** Replaces the handler. */
  handle(handler: Handler): void;
  close(): Promise<void>;
}

/** JSON answer helper. */
export function json(res: ServerResponse, status: number, body?: unknown): void {
  if (body === undefined) {
    res.writeHead(status).end();
    return;
  }
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json; charset=utf-8', 'content-length': Buffer.byteLength(text) }).end(text);
}

export async function stubServer(initial: Handler = (_req, res) => json(res, 404, { code: 'NOT_FOUND', message: 'no route' })): Promise<Stub> {
  let handler = initial;
  const requests: Recorded[] = [];
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const text = Buffer.concat(chunks).toString('utf8');
      let closed = false;
      res.on('close', () => {
        if (!res.writableEnded) closed = true;
      });
      const recorded: Recorded = {
        method: req.method ?? '',
        url: req.url ?? '',
        headers: req.headers,
        body: text.length > 0 ? JSON.parse(text) : undefined,
        closedEarly: () => closed,
      };
      requests.push(recorded);
      Promise.resolve(handler(recorded, res)).catch((error: unknown) => {
        if (!res.headersSent) json(res, 500, { code: 'INTERNAL', message: String(error) });
      });
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    handle: (h) => {
      handler = h;
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** A grant as the service answers it. */
export function grant(key: string, token: bigint, lease = `lhl1.test-${token}`, ttlMs = 30_000, mode = 'exclusive') {
  return { lease, key, token: String(token), sequencer: `lh1.${mode === 'shared' ? 's' : 'e'}.${token}.x`, ttlMs, mode };
}

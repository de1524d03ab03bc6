/**
 * httpBackend's `watch` over the service's event stream, against a scripted server: it resolves
 * once the stream is open, tells the watcher of changes of its key only (not of a longer key under
 * the same prefix), and opens the stream again after the server drops it (telling the watcher, as a
 * change may have been missed). The same against the real server: test/conformance/http.test.ts.
 */
import type { ServerResponse } from 'node:http';
import { afterEach, beforeEach, expect, it } from 'vitest';
import type { Backend } from '../../src/core/backend.js';
import { httpBackend } from '../../src/http/index.js';
import { readEvents } from '../../src/http/events.js';
import { eventually } from '../helpers/env.js';
import { json, type Stub, stubServer } from './stub.js';
import { Readable } from 'node:stream';
import type { IncomingMessage } from 'node:http';

let stub: Stub;
let backend: Backend;
let streams: ServerResponse[];

beforeEach(async () => {
  streams = [];
  stub = await stubServer((req, res) => {
    if (req.url.startsWith('/v1/events')) {
      res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-store' });
      res.write(': keep-alive\n\n');
      streams.push(res);
      return;
    }
    return json(res, 200, { locks: [{ key: 'job', lastToken: '1', holders: [], waiters: 0, lockDelayRemainingMs: 0 }] });
  });
  backend = httpBackend({ url: stub.url });
});
afterEach(async () => {
  await backend.close();
  await stub.close();
});

const change = (key: string) => `event: change\ndata: ${JSON.stringify({ kind: 'released', key, token: '1' })}\n\n`;

it('tells the watcher of its own key only, and follows the stream after the server drops it', async () => {
  let told = 0;
  const stop = await backend.watch!('job', () => told++);
  expect(streams).toHaveLength(1); // open before watch resolved
  expect(stub.requests.find((r) => r.url.startsWith('/v1/events'))!.url).toBe('/v1/events?prefix=job');
  streams[0]!.write(change('job:other')); // under the prefix, another key
  streams[0]!.write(change('job'));
  await eventually(() => told >= 1, 5_000);
  const before = told;
  streams[0]!.write(change('job:other'));
  await new Promise((r) => setTimeout(r, 100));
  expect(told).toBe(before);
  streams[0]!.destroy(); // the server drops the stream
  await eventually(() => streams.length === 2, 5_000);
  await eventually(() => told > before, 5_000); // told after reconnecting: something may have been missed
  const again = told;
  streams[1]!.write(change('job'));
  await eventually(() => told > again, 5_000);
  stop();
  await eventually(() => streams[1]!.destroyed || streams[1]!.writableEnded || streams[1]!.closed, 5_000);
});

it('reads events split across chunks, multi-line data and CRLF line ends; skips comments', async () => {
  const seen: [string, string][] = [];
  const stream = Readable.from(['ev', 'ent: change\r\ndata: {"a":\r\n', 'data: 1}\r\n', ': ping\r\n\r\n', 'data: x\n\n']) as unknown as IncomingMessage;
  readEvents(stream, (type, data) => seen.push([type, data]));
  await new Promise((r) => stream.on('end', r));
  expect(seen).toEqual([
    ['change', '{"a":\n1}'],
    ['message', 'x'],
  ]);
});

it('close() ends the event streams of the watches still open, and no reconnect follows', async () => {
  await backend.watch!('job', () => {});
  expect(streams).toHaveLength(1);
  await backend.close();
  await eventually(() => streams[0]!.closed, 5_000);
  await new Promise((r) => setTimeout(r, 1_500)); // past the reconnect delay
  expect(streams).toHaveLength(1);
});

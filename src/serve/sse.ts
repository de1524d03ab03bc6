/**
 * Server-Sent Events streams over the shared Watchers (watchers.ts), for `GET /v1/events` and the
 * dashboard's `/events`: subscribe to every prefix first (a failed first read is an ordinary error
 * answer, 503), then hold the stream open with keep-alive comments until the client goes or the
 * server closes; either frees every subscription.
 */
import type { FastifyReply } from 'fastify';
import { ClosedError } from '../core/errors.js';
import type { WatchListener } from '../dashboard/watch.js';
import type { ServeContext } from './context.js';
import type { SharedWatchers, WatchSubscription } from './watchers.js';

/**
 * A `: keep-alive` comment this often: proxies and load balancers close streams silent for 30–60 s,
 * and httpBackend takes 60 s of silence for a dead connection. Well under the server's own 75 s
 * connection timeout.
 */
export const KEEP_ALIVE_MS = 15_000;

/**
 * A client that reads this far behind (bytes the server could not hand to its socket) is cut off
 * rather than buffered without bound; it reconnects and reads the state again.
 */
const MAX_BUFFERED_BYTES = 1024 * 1024;

const KEEP_ALIVE = ': keep-alive\n\n';

/** One SSE message. `data` is JSON on one line (JSON.stringify escapes every line break). */
export function sseMessage(event: string, data: unknown): string {
  return `event: ${event}\ndata: ${JSON.stringify(data)}\n\n`;
}

/**
 * Subscribes `listener` to each prefix. Resolves once every prefix has been read; rejects (and
 * holds nothing) when one could not be.
 */
export async function subscribeAll(watchers: SharedWatchers, prefixes: readonly string[], listener: WatchListener): Promise<WatchSubscription[]> {
  const settled = await Promise.allSettled(prefixes.map((p) => watchers.subscribe(p, listener)));
  const held = settled.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : []));
  const failed = settled.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (failed) {
    for (const subscription of held) subscription.close();
    throw failed.reason;
  }
  return held;
}

/** An open stream: `write` sends (or cuts off a client that does not read). */
export interface EventStream {
  write(text: string): void;
}

/**
 * Answers 200 `text/event-stream` on `reply` (hijacked from fastify) and keeps it open, holding
 * `held` until the client goes or the server closes. Call it right after `subscribeAll`, in the same
 * tick: `gone()` says whether the client went away meanwhile (then it frees `held` and answers
 * nothing). Throws ClosedError (503) when the server started closing meanwhile.
 */
export function openStream(ctx: ServeContext, reply: FastifyReply, held: readonly WatchSubscription[], gone: () => boolean): EventStream | undefined {
  const release = (): void => {
    for (const subscription of held) subscription.close();
  };
  if (ctx.closing.aborted) {
    release();
    throw new ClosedError('lock server');
  }
  reply.hijack();
  const res = reply.raw;
  if (gone()) {
    release();
    return undefined;
  }
  res.writeHead(200, {
    'content-type': 'text/event-stream; charset=utf-8',
    'cache-control': 'no-store',
    connection: 'keep-alive',
    // nginx and its kin buffer responses unless told not to: events would arrive in bursts.
    'x-accel-buffering': 'no',
  });
  const write = (text: string): void => {
    if (res.destroyed || res.writableEnded) return;
    if (res.writableLength > MAX_BUFFERED_BYTES) res.destroy();
    else res.write(text);
  };
  // The first comment sends the head now: the client knows the stream is open, and current.
  write(KEEP_ALIVE);
  const keepAlive = setInterval(() => write(KEEP_ALIVE), KEEP_ALIVE_MS);
  keepAlive.unref();
  // The server closing ends each stream cleanly (the client reconnects, to another server say).
  const onClosing = (): void => {
    res.end();
  };
  ctx.closing.addEventListener('abort', onClosing, { once: true });
  res.once('close', () => {
    clearInterval(keepAlive);
    ctx.closing.removeEventListener('abort', onClosing);
    release();
  });
  return { write };
}

/** Tracks whether the client of `reply` went away (its response closed), from now on. */
export function watchGone(reply: FastifyReply): () => boolean {
  let gone = false;
  reply.raw.once('close', () => {
    gone = true;
  });
  return () => gone || reply.raw.destroyed;
}

/**
 * `GET /v1/events?prefix=P`: Server-Sent Events of grants, releases, expiries and take-overs under
 * `P`, filtered to the caller's prefixes (docs/http-api.md, "Observing"). The changes are the
 * dashboard's (src/dashboard/watch.ts: reads of `inspect` compared, woken by the backend's change
 * notifications), read by the server's shared Watchers (../watchers.ts), so a read sees states, not
 * events: two grants and a release between two reads show as one grant.
 */
import type { FastifyReply, FastifyRequest } from 'fastify';
import { checkPrefix } from '../../core/validate.js';
import type { Change, WatchListener } from '../../dashboard/watch.js';
import { listingPrefixes } from '../auth.js';
import { callerOf, type RouteModule, type ServeContext } from '../context.js';
import { forbidden } from '../errors.js';
import { openStream, sseMessage, subscribeAll, watchGone } from '../sse.js';
import { outermost, type SharedWatchers, sharedWatchers } from '../watchers.js';

const eventsSchema = {
  querystring: { type: 'object', additionalProperties: false, properties: { prefix: { type: 'string' } } },
  response: {
    200: {
      description:
        'Server-Sent Events: `event: change` with `data: { kind, key, token, holder, mode }` for each change under the prefix; `: keep-alive` comments at least every 15 s.',
      content: { 'text/event-stream': { schema: { type: 'string' } } },
    },
  },
};

/** What one change says over the wire: exactly these fields (never an owner id or a handle), the token as a decimal string. */
export function changeData(change: Change): { kind: Change['kind']; key: string; token: string; holder: string; mode: Change['mode'] } {
  return { kind: change.kind, key: change.key, token: change.token, holder: change.holder, mode: change.mode };
}

export const eventRoutes: RouteModule = (app, ctx) => {
  const watchers = sharedWatchers(app, ctx);
  app.get('/v1/events', { schema: eventsSchema }, (request, reply) => stream(ctx, watchers, request, reply));
};

async function stream(ctx: ServeContext, watchers: SharedWatchers, request: FastifyRequest, reply: FastifyReply): Promise<void> {
  const caller = callerOf(request);
  const prefix = checkPrefix((request.query as { prefix?: string }).prefix);
  // As GET /v1/locks: the request's prefix inside the caller's, or the caller's inside the request's.
  const prefixes = outermost(listingPrefixes(caller, prefix));
  if (prefixes.length === 0) throw forbidden(`prefix ${JSON.stringify(prefix)}`);

  const gone = watchGone(reply);
  // Changes read under one prefix while another is still being read first wait for the stream's head.
  const early: string[] = [];
  let write = (text: string): void => void early.push(text);
  const listener: WatchListener = ({ changes }) => {
    for (const change of changes) write(sseMessage('change', changeData(change)));
  };
  // Each prefix is read before the 200: a change the client is told of happened after it connected.
  const held = await subscribeAll(watchers, prefixes, listener);
  const opened = openStream(ctx, reply, held, gone);
  if (!opened) return;
  write = opened.write;
  for (const text of early) opened.write(text);
}

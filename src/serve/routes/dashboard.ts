/**
 * The dashboard (src/dashboard: its page and its Watcher) served by the lock service: `GET /` the
 * page, `GET /events` its Server-Sent Events (`snapshot` on connect with the recent changes, then
 * `update` after each read), `GET /state` the snapshot as JSON — the formats of `leasehold
 * dashboard`, which the page reads (it asks for `events` relative to itself).
 *
 * What a caller sees is what it may list: the keys under its own prefixes (every key without
 * `--auth`). With `--auth` these routes, like every route, want the caller's bearer token (a browser
 * behind a proxy that adds it, or curl): the dashboard never shows a key outside the caller's
 * prefixes, and shows labels and tokens, never owner ids or handles. It reads the coordinator only
 * while someone looks: the server's shared Watchers (../watchers.ts), started by the first viewer.
 */
import type { FastifyReply, FastifyRequest } from 'fastify';
import { dashboardPage } from '../../dashboard/page.js';
import type { Change, KeyView, Snapshot, WatchListener } from '../../dashboard/watch.js';
import { type Caller, listingPrefixes } from '../auth.js';
import { callerOf, type RouteModule, type ServeContext } from '../context.js';
import { openStream, sseMessage, subscribeAll, watchGone } from '../sse.js';
import { outermost, type SharedWatchers, sharedWatchers, type WatchSubscription } from '../watchers.js';

/** Changes sent to a page that connects (the dashboard's own history length). */
const HISTORY = 200;

const pageSchema = { response: { 200: { description: 'The dashboard page (HTML).', content: { 'text/html': { schema: { type: 'string' } } } } } };
/** The page's own data routes: the dashboard's formats, not part of the versioned API (left out of the OpenAPI document). */
const dataSchema = { hide: true };

export const dashboardRoutes: RouteModule = (app, ctx) => {
  const watchers = sharedWatchers(app, ctx);
  const page = dashboardPage('leasehold serve');
  app.get('/', { schema: pageSchema }, async (_request, reply) => reply.type('text/html; charset=utf-8').header('cache-control', 'no-store').send(page));

  app.get('/state', { schema: dataSchema }, async (request) => {
    const held = await subscribeAll(watchers, prefixesOf(callerOf(request)), () => {});
    try {
      return view(held);
    } finally {
      for (const subscription of held) subscription.close();
    }
  });

  app.get('/events', { schema: dataSchema }, (request, reply) => stream(ctx, watchers, request, reply));
};

/** The caller's prefixes, none inside another (a key is shown once). */
function prefixesOf(caller: Caller): string[] {
  return outermost(listingPrefixes(caller, ''));
}

async function stream(ctx: ServeContext, watchers: SharedWatchers, request: FastifyRequest, reply: FastifyReply): Promise<void> {
  const gone = watchGone(reply);
  let held: readonly WatchSubscription[] = [];
  let write: ((text: string) => void) | undefined;
  // Before the stream opens, a read's changes are in its Watcher's history, which the first message carries.
  const listener: WatchListener = (update) => {
    if (!write) return;
    const { snapshot } = view(held);
    write(sseMessage('update', { snapshot, changes: update.changes, ...(update.error !== undefined && { error: update.error }) }));
  };
  held = await subscribeAll(watchers, prefixesOf(callerOf(request)), listener);
  const opened = openStream(ctx, reply, held, gone);
  if (!opened) return;
  opened.write(sseMessage('snapshot', view(held)));
  write = opened.write;
}

/** The snapshot and recent changes of one or more prefixes, as one (keys in order; changes by time). */
function view(held: readonly WatchSubscription[]): { snapshot: Snapshot; history: Change[] } {
  if (held.length === 1) {
    const w = held[0]!.watcher;
    return { snapshot: w.snapshot, history: [...w.history] };
  }
  const keys: KeyView[] = held.flatMap((s) => s.watcher.snapshot.keys).sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
  const history = held
    .flatMap((s) => s.watcher.history)
    .sort((a, b) => a.at - b.at)
    .slice(-HISTORY);
  const at = Math.max(...held.map((s) => s.watcher.snapshot.at));
  return { snapshot: { at, prefix: held.map((s) => s.watcher.snapshot.prefix).join(', '), keys }, history };
}

import type { FastifyInstance } from 'fastify';
import type { Locks } from '../core/locks.js';
import { dashboardPage } from './page.js';
import { Watcher, type WatchListener } from './watch.js';
import { createRequire } from 'node:module';
import { requirePeer } from '../core/peer.js';

export interface DashboardOptions {
  /** The client whose coordinator is shown (`locks.inspect`): any backend. */
  readonly locks: Locks;
  /** Only keys starting with this. @default '' (every key) */
  readonly prefix?: string;
  /** Between reads of the coordinator. @default 250 */
  readonly pollMs?: number;
  /** The page's heading. @default 'leasehold' */
  readonly title?: string;
}

/** SSE comment sent this often, so proxies and browsers keep an idle stream open. */
const HEARTBEAT_MS = 15_000;

/**
 * The dashboard's routes on a fastify instance, under its prefix: `GET /` the page, `GET /events`
 * the Server-Sent Events stream (`snapshot` on connect with the recent history, then `update`
 * after each read: the new snapshot and what changed), `GET /state` the current snapshot as JSON.
 * Nothing secret is shown: `inspect` carries labels and tokens, never owner ids. Returns the
 * watcher (stopped when the fastify instance closes).
 */
export function dashboardRoutes(app: FastifyInstance, options: DashboardOptions & { onViewer?: () => void }): Watcher {
  const locks = options.locks;
  const watcher = new Watcher({
    inspect: (p) => locks.inspect(p),
    watch: (key, onChange) => locks.watch(key, onChange),
    prefix: options.prefix ?? '',
    pollMs: options.pollMs ?? 250,
  });
  const page = dashboardPage(options.title);
  app.addHook('onReady', async () => {
    await watcher.start().catch(() => {});
  });
  app.addHook('onClose', async () => watcher.stop());
  app.get('/', async (_request, reply) => reply.type('text/html; charset=utf-8').header('cache-control', 'no-store').send(page));
  app.get('/state', async () => ({ snapshot: watcher.snapshot, history: watcher.history }));
  app.get('/events', (request, reply) => {
    reply.hijack();
    const res = reply.raw;
    res.writeHead(200, {
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-store',
      connection: 'keep-alive',
      'x-accel-buffering': 'no',
    });
    const send = (event: string, data: unknown): void => {
      res.write(`event: ${event}\ndata: ${JSON.stringify(data)}\n\n`);
    };
    send('snapshot', { snapshot: watcher.snapshot, history: watcher.history });
    options.onViewer?.();
    const listener: WatchListener = (update) => send('update', update);
    const off = watcher.on(listener);
    const heartbeat = setInterval(() => res.write(': keep-alive\n\n'), HEARTBEAT_MS);
    heartbeat.unref();
    request.raw.on('close', () => {
      off();
      clearInterval(heartbeat);
    });
  });
  return watcher;
}

export interface StartDashboardOptions extends DashboardOptions {
  /** @default '127.0.0.1' (loopback: the page shows who holds what) */
  readonly host?: string;
  /** 0 picks a free port. @default 7071 */
  readonly port?: number;
}

/** Serves the dashboard on its own fastify server (`leasehold dashboard`). fastify is an optional peer dependency. */
export interface RunningDashboard {
  /** `http://host:port/` */
  readonly url: string;
  /** Resolves true when a page has connected (now or before), false after `ms` without one. */
  viewer(ms: number): Promise<boolean>;
  close(): Promise<void>;
}

export async function startDashboard(options: StartDashboardOptions): Promise<RunningDashboard> {
  const fastify = requirePeer<typeof import('fastify')>(createRequire(import.meta.url), 'fastify', 'the dashboard');
  // forceCloseConnections: open event streams would otherwise keep close() waiting.
  const app = fastify.default({ logger: false, forceCloseConnections: true });
  let seen = false;
  const waiting = new Set<(seen: boolean) => void>();
  dashboardRoutes(app, {
    ...options,
    onViewer: () => {
      seen = true;
      for (const resolve of waiting) resolve(true);
      waiting.clear();
    },
  });
  const address = await app.listen({ host: options.host ?? '127.0.0.1', port: options.port ?? 7071 });
  return {
    url: `${address}/`,
    viewer: (ms) =>
      seen
        ? Promise.resolve(true)
        : new Promise<boolean>((resolve) => {
            waiting.add(resolve);
            setTimeout(() => {
              waiting.delete(resolve);
              resolve(seen);
            }, ms).unref();
          }),
    close: () => app.close(),
  };
}

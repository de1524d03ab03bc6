// One lock server (`startLockServer`) in a process of its own, for bench/http.mjs: forked with the
// backend's kind and URL, it builds that backend with counters (bench/lib/http-count.mjs), serves it
// on a free loopback port, and answers the bench over IPC:
//   → { type: 'stats' }  ← { type: 'stats', ... } the counts and times since the last 'stats' (then reset)
//   → { type: 'close' }  ← { type: 'closed' } after the server and its backend are closed
// A process of its own, as a deployed server is: the bench's clients and this server do not share an
// event loop (two servers in one process would not be two servers). Not a benchmark itself.
import { postgresBackend } from '../../dist/postgres/index.js';
import { redisBackend } from '../../dist/redis/index.js';
import { startLockServer } from '../../dist/serve/index.js';
import { countingPool, requestKind, timedBackend } from './http-count.mjs';

/** ms since the epoch with µs resolution: comparable between the processes of one machine (hand-offs across servers). */
const wall = () => performance.timeOrigin + performance.now();
/** The highest rate limit the server takes: the bench's one anonymous caller sends far more than the 1,000/s default. */
const RATE_LIMIT = 1_000_000;

const [kind, url] = process.argv.slice(2);
if (kind === 'empty') await emptyServer();
let pool;
let raw;
if (kind === 'postgres') {
  pool = countingPool(url, 10);
  raw = postgresBackend({ pool: pool.pool });
} else if (kind === 'redis') {
  raw = redisBackend({ url });
} else {
  throw new Error(`http-server: unknown backend kind ${kind}`);
}
const timed = timedBackend(raw);
const server = await startLockServer({ backend: timed.backend, host: '127.0.0.1', port: 0, rateLimit: RATE_LIMIT });

const requests = {};
const serverMs = { acquire: [], release: [] };
/** Release requests arriving and grants leaving (200 answers to acquires), on the wall clock, for the hand-off as the servers see it. */
const events = [];
// Before fastify's own listener: the time from the request's arrival to the last byte of its answer handed to the socket.
server.app.server.prependListener('request', (req, res) => {
  const t0 = performance.now();
  const k = requestKind(req.method ?? '', req.url ?? '');
  requests[k] = (requests[k] ?? 0) + 1;
  if (k === 'release') events.push({ t: wall(), kind: 'release-in' });
  res.on('finish', () => {
    serverMs[k]?.push(performance.now() - t0);
    if (k === 'acquire' && res.statusCode === 200) events.push({ t: wall(), kind: 'grant-out' });
  });
});

let cpu = process.cpuUsage();
process.on('message', async (m) => {
  if (m?.type === 'stats') {
    const used = process.cpuUsage(cpu);
    cpu = process.cpuUsage();
    process.send({
      type: 'stats',
      cpuMs: (used.user + used.system) / 1000,
      requests: { ...requests },
      serverMs: { acquire: [...serverMs.acquire], release: [...serverMs.release] },
      backendMs: { acquire: [...timed.times.acquire], release: [...timed.times.release] },
      backendCalls: { ...timed.calls },
      statements: pool?.counter.statements ?? 0,
      listen: pool?.counter.listen ?? 0,
      events: [...events],
    });
    for (const k of Object.keys(requests)) delete requests[k];
    serverMs.acquire.length = 0;
    serverMs.release.length = 0;
    events.length = 0;
    timed.reset();
    if (pool) pool.counter.statements = pool.counter.listen = 0;
  } else if (m?.type === 'close') {
    await server.close();
    await raw.close();
    await pool?.end();
    process.send({ type: 'closed' }, () => process.exit(0));
  }
});
process.on('disconnect', () => process.exit(0));
process.send({ type: 'ready', url: server.url });

/**
 * The floor of any HTTP lock service on this machine: a node:http server that reads each request and
 * answers at once (an acquire-sized JSON body to a POST, 204 to a DELETE), with no framework, no
 * backend and no lock. Same protocol with the bench; never returns.
 */
async function emptyServer() {
  const { createServer } = await import('node:http');
  const GRANT = JSON.stringify({ lease: 'x'.repeat(180), key: 'k', token: '1', sequencer: 'k:exclusive:1', ttlMs: 30_000, mode: 'exclusive' });
  const requests = {};
  let cpu = process.cpuUsage();
  const http = createServer((req, res) => {
    const k = requestKind(req.method ?? '', req.url ?? '');
    requests[k] = (requests[k] ?? 0) + 1;
    req.resume();
    req.on('end', () => {
      if (req.method === 'DELETE') res.writeHead(204).end();
      else res.writeHead(200, { 'content-type': 'application/json; charset=utf-8', 'content-length': Buffer.byteLength(GRANT) }).end(GRANT);
    });
  });
  await new Promise((resolve) => http.listen(0, '127.0.0.1', resolve));
  process.on('message', (m) => {
    if (m?.type === 'stats') {
      const used = process.cpuUsage(cpu);
      cpu = process.cpuUsage();
      const none = { acquire: [], release: [] };
      process.send({
        type: 'stats',
        cpuMs: (used.user + used.system) / 1000,
        requests: { ...requests },
        serverMs: none,
        backendMs: none,
        backendCalls: {},
        statements: 0,
        listen: 0,
        events: [],
      });
      for (const r of Object.keys(requests)) delete requests[r];
    } else if (m?.type === 'close') {
      http.closeAllConnections();
      http.close(() => process.send({ type: 'closed' }, () => process.exit(0)));
    }
  });
  process.on('disconnect', () => process.exit(0));
  process.send({ type: 'ready', url: `http://127.0.0.1:${http.address().port}` });
  await new Promise(() => {});
}

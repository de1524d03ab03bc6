// Counters of the HTTP benchmark (bench/http.mjs), used on both sides of the wire: in the bench's
// process for the direct backends and the HTTP clients, and in each lock server's process
// (bench/lib/http-server.mjs) for the backend the server calls. Counting is a few additions per call,
// so it stays on during the timed runs.
import pg from 'pg';

const now = () => performance.now();

/**
 * A pg Pool whose statements are counted (each is one round trip to PostgreSQL): those through
 * pool.query, and those on clients checked out of it — the backend's LISTEN connection is one — also
 * counted apart in `listen`.
 */
export function countingPool(connectionString, max = 10) {
  const inner = new pg.Pool({ connectionString, max });
  inner.on('error', () => {});
  const counter = { statements: 0, listen: 0 };
  const pool = {
    connect: async () => {
      const client = await inner.connect();
      const { query, release } = client;
      client.query = (...a) => {
        counter.statements++;
        counter.listen++;
        return query.apply(client, a);
      };
      client.release = (...a) => {
        client.query = query;
        client.release = release;
        return release.apply(client, a);
      };
      return client;
    },
    query: (...a) => {
      counter.statements++;
      return inner.query(...a);
    },
  };
  return { pool, counter, end: () => inner.end() };
}

/**
 * A backend whose acquire and release calls are counted and timed: in the bench's process, the time
 * of one backend call (a statement or a script for a direct backend; the whole HTTP request for the
 * HTTP client), and in a lock server, what its backend took of each request. Everything else is
 * passed through as it is.
 */
export function timedBackend(backend) {
  const times = { acquire: [], release: [] };
  const calls = { acquire: 0, release: 0, renew: 0 };
  const timed = (kind, fn) => async (req) => {
    calls[kind]++;
    const t0 = now();
    try {
      return await fn.call(backend, req);
    } finally {
      times[kind]?.push(now() - t0);
    }
  };
  return {
    backend: {
      ...plain(backend),
      acquire: timed('acquire', backend.acquire),
      release: timed('release', backend.release),
      renew: timed('renew', backend.renew),
    },
    times,
    calls,
    reset() {
      times.acquire.length = 0;
      times.release.length = 0;
      calls.acquire = calls.release = calls.renew = 0;
    },
  };
}

/**
 * A backend as a plain object: its own properties and the methods of its prototypes (a backend may be
 * a class instance), bound to it.
 */
function plain(backend) {
  const out = {};
  for (let o = backend; o && o !== Object.prototype; o = Object.getPrototypeOf(o)) {
    for (const name of Object.getOwnPropertyNames(o)) {
      if (name === 'constructor' || name in out) continue;
      const value = backend[name];
      out[name] = typeof value === 'function' ? value.bind(backend) : value;
    }
  }
  return out;
}

/** The kind of a lock-service request, from its method and path (the routes of docs/http-api.md). */
export function requestKind(method, url) {
  const path = url.split('?')[0];
  if (method === 'POST' && /^\/v1\/locks\/[^/]+\/acquire$/.test(path)) return 'acquire';
  if (method === 'DELETE' && path.startsWith('/v1/leases/')) return 'release';
  if (method === 'POST' && /^\/v1\/leases\/[^/]+\/renew$/.test(path)) return 'renew';
  if (path === '/v1/sessions' && method === 'POST') return 'session-open';
  if (/^\/v1\/sessions\/[^/]+\/keepalive$/.test(path)) return 'keepalive';
  if (path.startsWith('/v1/sessions/') && method === 'DELETE') return 'session-close';
  return 'other';
}

import type { Backend } from './core/backend.js';
import { InvalidArgumentError } from './core/errors.js';
import { describe } from './core/validate.js';
import { resolveHttpOptions as resolveHttpUrl } from './http/options.js';
import { redisUrlDatabase } from './redis/url.js';

/** Where `createLocks()` keeps its leases when given neither a backend nor LEASEHOLD_URL. */
export const DEFAULT_URL = 'sqlite:./leasehold.db';

/**
 * Reads a coordinator URL (checked now, synchronously) and returns a loader that imports the
 * backend's module and connects on first use, so `leasehold` never loads drivers you do not use.
 *
 * - `memory:` — this process only: every `memory:` URL in a process names the same in-process
 *   coordinator, so two `createLocks({ url: 'memory:' })` exclude each other like two clients of
 *   one server, and closing one leaves the other working (`memoryBackend()` makes a private one)
 * - `sqlite:PATH` — one machine, many processes (`sqlite:./leasehold.db`, `sqlite:/var/lib/app/locks.db`)
 * - `postgres://…` / `postgresql://…` — PostgreSQL (pg's connection string; `?schema=…&table=…` choose
 *   where the lease tables live, default `public.leasehold_locks`)
 * - `mysql://…` / `mariadb://…` — MySQL or MariaDB (mysql2's URL: `mysql://user:pass@host:3306/db`,
 *   its own options as query parameters); `?table=…` chooses the lease tables' name, default
 *   `leasehold_locks` in the URL's database. `mariadb://` is the same URL under the name MariaDB users
 *   write: both go to mysql2, which speaks to either server
 * - `redis://…` / `rediss://…` — one Redis (the URL is ioredis's); a path `/N` (or `?db=N`) selects
 *   database N, and a database the server does not have is an InvalidArgumentError on first use
 * - `redlock://h1:p1,h2:p2,h3:p3` — Redlock over independent Redis servers
 * - `etcd://h1:p1,h2:p2` — an etcd cluster (its members' client ports, over http)
 * - `http://…` / `https://…` — the lock service (`leasehold serve`) at that address, through
 *   `httpBackend`; a bearer token goes in the user-info (`https://TOKEN@host:7070`)
 *
 * Schemes are case-insensitive (RFC 3986): `MEMORY:` is `memory:`.
 */
export function backendLoader(url: unknown): () => Promise<Backend> {
  if (typeof url !== 'string' || url.length === 0) throw new InvalidArgumentError('url', `expected a URL string, got ${describe(url)}`);
  const scheme = /^([a-z][a-z0-9+.-]*):/i.exec(url)?.[1]?.toLowerCase();
  switch (scheme) {
    case 'memory': {
      if (url.length !== 'memory:'.length) throw new InvalidArgumentError('url', `memory: takes nothing after the colon, got ${JSON.stringify(url)}`);
      return async () => (await import('./memory/backend.js')).sharedMemoryBackend();
    }
    case 'sqlite': {
      const path = url.slice('sqlite:'.length).replace(/^\/\/(?=\/)/, '');
      if (path.length === 0) throw new InvalidArgumentError('url', 'sqlite: needs a file path, e.g. sqlite:./leasehold.db');
      return async () => (await import('./sqlite/index.js')).sqliteBackend({ path });
    }
    case 'postgres':
    case 'postgresql': {
      const { connectionString, schema, table } = postgresUrl(url);
      return async () => (await import('./postgres/index.js')).postgresBackend({ connectionString, schema, table });
    }
    case 'mysql':
    case 'mariadb': {
      const { uri, table } = mysqlUrl(url);
      return async () => (await import('./mysql/index.js')).mysqlBackend({ uri, table });
    }
    case 'redis':
    case 'rediss': {
      // The database in the URL must be a number (checked now); the backend checks on first use that the server has it.
      redisUrlDatabase(url, 'url', (u) => JSON.stringify(redact(u)));
      return async () => (await import('./redis/backend.js')).redisBackendFromUrl(url);
    }
    case 'redlock': {
      const urls = hostList(url, 'redlock').map((h) => `redis://${h}`);
      return async () => (await import('./redis/index.js')).redlockBackend({ urls });
    }
    case 'etcd': {
      // Bare host:port, which etcdBackend reads as http (as etcd3 and etcdctl do).
      const hosts = hostList(url, 'etcd');
      return async () => (await import('./etcd/index.js')).etcdBackend({ hosts });
    }
    case 'http':
    case 'https': {
      // Checked now (a malformed URL or token fails here, not on first use); the message never shows the token.
      const options = { url };
      resolveHttpUrl(options);
      return async () => (await import('./http/index.js')).httpBackend(options);
    }
    default:
      throw new InvalidArgumentError(
        'url',
        `unsupported scheme in ${JSON.stringify(redact(url))}; expected memory:, sqlite:PATH, postgres://, mysql:// (or mariadb://), redis://, redlock://h1:p,h2:p,h3:p, etcd://h1:p,h2:p or http(s)://host:port`,
      );
  }
}

/** Connects to the coordinator named by `url` (see {@link backendLoader} for the schemes). */
export function backendFromUrl(url: string): Promise<Backend> {
  return backendLoader(url)();
}

/** `scheme://h1:p1,h2:p2` → ['h1:p1', 'h2:p2'], each checked to be host:port. */
function hostList(url: string, scheme: string): string[] {
  const rest = url.slice(scheme.length + 3).replace(/\/+$/, '');
  if (!url.toLowerCase().startsWith(`${scheme}://`) || rest.length === 0) {
    throw new InvalidArgumentError('url', `${scheme} URLs list host:port pairs, e.g. ${scheme}://127.0.0.1:2379,127.0.0.1:22379`);
  }
  const hosts = rest.split(',');
  for (const h of hosts) {
    const port = /^(?:\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):([0-9]{1,5})$/.exec(h)?.[1];
    if (port === undefined) throw new InvalidArgumentError('url', `${JSON.stringify(h)} in ${scheme}:// is not host:port`);
    if (Number(port) < 1 || Number(port) > 65_535)
      throw new InvalidArgumentError('url', `${JSON.stringify(h)} in ${scheme}://: the port must be from 1 to 65535, got ${port}`);
  }
  return hosts;
}

/** A URL fit for an error message: credentials masked, length bounded. */
export function redact(url: string): string {
  const masked = url.replace(/^([a-z][a-z0-9+.-]*:\/\/)[^@/]*@/i, '$1***@');
  return masked.length > 80 ? `${masked.slice(0, 80)}…` : masked;
}

/** Takes leasehold's own `schema` and `table` parameters out of a PostgreSQL URL; the rest goes to pg. */
function postgresUrl(url: string): { connectionString: string; schema?: string; table?: string } {
  const q = url.indexOf('?');
  if (q < 0) return { connectionString: url };
  const params = new URLSearchParams(url.slice(q + 1));
  const schema = params.get('schema') ?? undefined;
  const table = params.get('table') ?? undefined;
  params.delete('schema');
  params.delete('table');
  const rest = params.toString();
  return { connectionString: url.slice(0, q) + (rest ? `?${rest}` : ''), schema, table };
}

/**
 * Takes leasehold's own `table` parameter out of a MySQL / MariaDB URL; the rest goes to mysql2 as
 * the pool's `uri` (mysql2 reads every other query parameter as one of its connection options, and
 * warns about any it does not know, `table` included). The URL is parsed now, so a malformed one is
 * an InvalidArgumentError before anything connects; mysql2 ignores the scheme, so `mariadb://` is
 * handed over as written.
 */
export function mysqlUrl(url: string): { uri: string; table?: string } {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new InvalidArgumentError('url', `${JSON.stringify(redact(url))} is not a valid mysql:// URL, e.g. mysql://user:password@127.0.0.1:3306/app`);
  }
  if (!url.slice(parsed.protocol.length).startsWith('//')) {
    throw new InvalidArgumentError('url', `${parsed.protocol} URLs name a server, e.g. mysql://user:password@127.0.0.1:3306/app`);
  }
  // The lease tables live in a database: without one every statement would fail with "no database selected".
  if (parsed.pathname.replace(/^\//, '') === '' && !parsed.searchParams.has('database')) {
    throw new InvalidArgumentError('url', `${JSON.stringify(redact(url))} names no database: give it as the path, e.g. mysql://user@127.0.0.1:3306/app`);
  }
  const q = url.indexOf('?');
  if (q < 0) return { uri: url };
  const params = new URLSearchParams(url.slice(q + 1));
  const table = params.get('table') ?? undefined;
  params.delete('table');
  const rest = params.toString();
  return { uri: url.slice(0, q) + (rest ? `?${rest}` : ''), table };
}

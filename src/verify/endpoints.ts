/**
 * The TCP endpoints behind a coordinator or store URL, and the same URL pointed at other ports
 * (the worker's delaying proxies). A URL whose server is not reached over TCP (SQLite, a Unix
 * socket) has no endpoints: the delay nemesis does not apply to it.
 */

export interface Endpoint {
  host: string;
  port: number;
}

const DEFAULT_PORTS: Readonly<Record<string, number>> = Object.freeze({
  redis: 6379,
  rediss: 6379,
  postgres: 5432,
  postgresql: 5432,
  mysql: 3306,
  mariadb: 3306,
  etcd: 2379,
  redlock: 6379,
});

function scheme(url: string): string {
  return /^([a-z][a-z0-9+.-]*):/i.exec(url)?.[1]?.toLowerCase() ?? '';
}

/** Host lists (`etcd://h1:p1,h2:p2`, `redlock://…`) are comma-separated host:port pairs. */
function hostList(url: string): string[] {
  return url
    .slice(url.indexOf('://') + 3)
    .replace(/\/+$/, '')
    .split(',');
}

function splitHostPort(hostPort: string, fallback: number): Endpoint {
  const m = /^(\[[^\]]+\]|[^:]+)(?::(\d+))?$/.exec(hostPort);
  if (!m) throw new Error(`not host:port: ${hostPort}`);
  return { host: m[1]!.replace(/^\[|\]$/g, ''), port: m[2] ? Number(m[2]) : fallback };
}

/** The servers `url` talks to over TCP, or [] when it uses none (SQLite, a Unix socket). */
export function tcpEndpoints(url: string): Endpoint[] {
  const s = scheme(url);
  if (s === 'etcd' || s === 'redlock') return hostList(url).map((h) => splitHostPort(h, DEFAULT_PORTS[s]!));
  if (s === 'redis' || s === 'rediss' || s === 'postgres' || s === 'postgresql' || s === 'mysql' || s === 'mariadb') {
    let u: URL;
    try {
      u = new URL(url);
    } catch {
      return []; // e.g. postgresql://user@/db?host=/socket/dir: no TCP host the WHATWG parser accepts
    }
    // libpq's host= parameter (a socket directory, or another host) overrides the URL's host, as
    // mysql2's socketPath= and host= do; TLS (rediss, mysql2's ssl=) cannot be held by a plain proxy.
    const other = s === 'mysql' || s === 'mariadb' ? ['socketPath', 'host', 'port', 'ssl'] : ['host'];
    if (other.some((p) => u.searchParams.has(p)) || u.hostname === '' || s === 'rediss') return [];
    return [{ host: u.hostname.replace(/^\[|\]$/g, ''), port: u.port ? Number(u.port) : DEFAULT_PORTS[s]! }];
  }
  return [];
}

/** `url` with its endpoints replaced, in order, by 127.0.0.1:ports[i]. */
export function viaPorts(url: string, ports: readonly number[]): string {
  const s = scheme(url);
  if (s === 'etcd' || s === 'redlock') return `${s}://${ports.map((p) => `127.0.0.1:${p}`).join(',')}`;
  const u = new URL(url);
  u.hostname = '127.0.0.1';
  u.port = String(ports[0]);
  return u.toString();
}

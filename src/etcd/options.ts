/**
 * The options of `etcdBackend`, their defaults and their checks. Everything is checked when the
 * backend is made, so that a configuration error is an InvalidArgumentError at once instead of a
 * retryable BackendUnavailableError on every call.
 */
import { InvalidArgumentError } from '../core/errors.js';
import { checkInteger, checkKnownOptions, checkObject, describe } from '../core/validate.js';
import type { EtcdClient } from './rpc.js';

export interface EtcdBackendOptions {
  /**
   * Every member of the cluster, as client URLs (`http://h1:2379`, `https://…`) or bare `host:port`
   * (read as http, as etcd3 and `etcdctl --endpoints` do): requests fail over between them. Give this or `client`.
   */
  hosts?: string | readonly string[];
  /** An `Etcd3` client you already have (a root client, not a namespace: use `prefix`); never closed by `close()`. */
  client?: EtcdClient;
  /** Every key the backend writes starts with this. @default 'leasehold/' */
  prefix?: string;
  /**
   * Deadline of each etcd request. A request to a member that is down or has lost its leader fails
   * after this long and is retried on another member (the etcd3 client's retry policy). @default 2000
   */
  requestTimeoutMs?: number;
  /**
   * The server's smallest lease ttl: etcd raises shorter ones to 1.5 × its election timeout,
   * rounded up to whole seconds (2 s with the default 1 s election timeout). Tell the backend when
   * your cluster runs with other timings. Ttls are whole seconds either way; the effective ttl is
   * reported in `lease.ttlMs`. @default 2000
   */
  minTtlMs?: number;
  /**
   * How long the watch a client keeps on a lock its waiters follow stays open after the last of
   * them got the key or left. A client that waits on the same lock again within it (a worker in a
   * loop) joins the running watch: no new watch and no read per wait. 0: close it at once. @default 10000
   */
  watchLingerMs?: number;
  /**
   * With several `hosts`: send requests and watches to the member that leads (looked up with
   * `Status` at the start and every 5 s), falling back to every member while it is unknown or
   * unreachable. A write sent to a follower costs one more round, and a follower's watch sees a
   * change later. Ignored with `client`. @default true
   */
  preferLeader?: boolean;
}

/** Defaults, each with its reason. */
export const ETCD_DEFAULTS = Object.freeze({
  /** One directory for everything leasehold writes, easy to find with `etcdctl get --prefix leasehold/`. */
  prefix: 'leasehold/',
  /** 2 s: longer than an etcd leader election with default timings (1 s), well inside core's 5 s operation timeout. */
  requestTimeoutMs: 2_000,
  /** 2 s: etcd's minimum lease with its default 100 ms heartbeat and 1 s election timeout. */
  minTtlMs: 2_000,
  /** 10 s: a worker that takes the same lock again within seconds keeps its watch; an open watch costs etcd little. */
  watchLingerMs: 10_000,
  /** Writes and watches on the leader: a hand-off is one replication round shorter. */
  preferLeader: true,
});

/** The options, checked, with their defaults filled in; the connection is either `hosts` (normalised) or `client`. */
export type EtcdSettings = {
  readonly prefix: string;
  readonly timeoutMs: number;
  readonly minTtlMs: number;
  readonly lingerMs: number;
  readonly preferLeader: boolean;
} & ({ readonly hosts: readonly string[]; readonly client?: undefined } | { readonly client: EtcdClient; readonly hosts?: undefined });

export function checkEtcdOptions(options: EtcdBackendOptions): EtcdSettings {
  const o = checkObject(options, 'options');
  checkKnownOptions(o, ['hosts', 'client', 'prefix', 'requestTimeoutMs', 'minTtlMs', 'watchLingerMs', 'preferLeader'], 'options');
  if ((o.hosts === undefined) === (o.client === undefined)) throw new InvalidArgumentError('options', 'give exactly one of hosts or client');
  const prefix = checkPrefixOption(o.prefix ?? ETCD_DEFAULTS.prefix);
  const timeoutMs = o.requestTimeoutMs === undefined ? ETCD_DEFAULTS.requestTimeoutMs : checkInteger(o.requestTimeoutMs, 'requestTimeoutMs', 1, 600_000);
  const minTtlMs = o.minTtlMs === undefined ? ETCD_DEFAULTS.minTtlMs : checkInteger(o.minTtlMs, 'minTtlMs', 1_000, 3_600_000);
  if (o.minTtlMs !== undefined && minTtlMs % 1000 !== 0) throw new InvalidArgumentError('minTtlMs', `etcd leases are whole seconds; got ${minTtlMs}`);
  const lingerMs = o.watchLingerMs === undefined ? ETCD_DEFAULTS.watchLingerMs : checkInteger(o.watchLingerMs, 'watchLingerMs', 0, 3_600_000);
  if (o.preferLeader !== undefined && typeof o.preferLeader !== 'boolean')
    throw new InvalidArgumentError('preferLeader', `expected a boolean, got ${describe(o.preferLeader)}`);
  const preferLeader = (o.preferLeader as boolean | undefined) ?? ETCD_DEFAULTS.preferLeader;
  if (o.hosts !== undefined) return { hosts: checkHosts(o.hosts), prefix, timeoutMs, minTtlMs, lingerMs, preferLeader };
  const c = o.client as EtcdClient;
  if (
    typeof c !== 'object' ||
    c === null ||
    typeof c.kv?.txn !== 'function' ||
    typeof c.leaseClient?.leaseGrant !== 'function' ||
    typeof c.watch !== 'function'
  ) {
    throw new InvalidArgumentError('client', `expected an Etcd3 client, got ${describe(c)}`);
  }
  return { client: c, prefix, timeoutMs, minTtlMs, lingerMs, preferLeader };
}

function checkPrefixOption(value: unknown): string {
  if (typeof value !== 'string' || value.length === 0 || value.includes('\0') || !value.isWellFormed()) {
    throw new InvalidArgumentError('prefix', `expected a non-empty string, got ${describe(value)}`);
  }
  return value;
}

/**
 * Checks `hosts` and returns each host in the one form etcd3 (grpc) can dial: `http://HOST:PORT` or
 * `https://HOST:PORT`. A bare `HOST:PORT` is http, as etcd3 and `etcdctl --endpoints` read it. A
 * trailing slash is dropped and the scheme and host are lower-cased; a path, query, fragment, user
 * or password, a missing or bad port (grpc would dial 443 for `http://host`), an empty host, and
 * http and https mixed (etcd3 takes one or the other) are refused, naming the element.
 */
function checkHosts(value: unknown): string[] {
  const example = 'like http://127.0.0.1:2379 or 127.0.0.1:2379';
  if (typeof value === 'string') return [checkHost(value, 'hosts')];
  if (!Array.isArray(value)) throw new InvalidArgumentError('hosts', `expected an etcd client URL or an array of them, ${example}, got ${describe(value)}`);
  if (value.length === 0) throw new InvalidArgumentError('hosts', `expected at least one etcd client URL, ${example}, got an empty array`);
  const hosts = (value as unknown[]).map((h, i) => checkHost(h, `hosts[${i}]`));
  const secure = hosts[0]!.startsWith('https:');
  const other = hosts.findIndex((h) => h.startsWith('https:') !== secure);
  if (other > 0) {
    const [a, b] = secure ? ['https', 'http'] : ['http', 'https'];
    const shown = JSON.stringify(value[other]);
    throw new InvalidArgumentError('hosts', `hosts[${other}] = ${shown} is ${b} while hosts[0] is ${a}: the etcd3 client takes all of one or the other`);
  }
  return hosts;
}

function checkHost(h: unknown, where: string): string {
  const bad = (problem: string): InvalidArgumentError => new InvalidArgumentError('hosts', `${where} ${problem}`);
  if (typeof h !== 'string') throw bad(`must be an etcd client URL like http://127.0.0.1:2379, or host:port, as a string; got ${describe(h)}`);
  const shown = JSON.stringify(h.length > 100 ? `${h.slice(0, 100)}…` : h);
  const given = /^([a-z][a-z0-9+.-]*):\/\//i.exec(h)?.[1]?.toLowerCase();
  if (given !== undefined && given !== 'http' && given !== 'https') throw bad(`= ${shown}: the scheme must be http:// or https://, not ${given}://`);
  // Bare host:port: http, checked as the URL it stands for (messages quote what was given).
  const bare = given === undefined;
  const scheme = given ?? 'http';
  const text = bare ? `http://${h}` : h;
  // WHATWG URL forgives what grpc does not (tabs and newlines dropped, "\\" read as "/", extra
  // slashes skipped, a default port dropped), so the text itself is checked first.
  if (/[\s\x00-\x1f\x7f]/.test(h)) throw bad(`= ${shown} contains whitespace or control characters`);
  const authority = text.slice(scheme.length + 3).split(/[/?#\\]/, 1)[0]!;
  const rest = text.slice(scheme.length + 3 + authority.length);
  if (authority === '' || authority.startsWith(':')) throw bad(`= ${shown} has no host`);
  if (rest !== '' && rest !== '/') throw bad(`= ${shown} has a path, query or fragment (${JSON.stringify(rest)}): an etcd client URL is scheme://host:port`);
  const port = /:(\d+)$/.exec(authority)?.[1];
  if (port !== undefined && (Number(port) < 1 || Number(port) > 65_535)) throw bad(`= ${shown}: the port must be from 1 to 65535, got ${port}`);
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    throw bad(`= ${shown} is not a valid URL or host:port (a host, and a port from 1 to 65535)`);
  }
  if (url.username !== '' || url.password !== '' || authority.includes('@')) {
    throw bad(`= ${shown} has a user or password: etcd credentials do not go in the URL (pass a configured Etcd3 as client)`);
  }
  if (port === undefined) {
    const example = bare ? `${url.hostname}:2379` : `${scheme}://${url.hostname}:2379`;
    throw bad(`= ${shown} has no port: etcd listens on 2379 by default, e.g. ${example}`);
  }
  return `${scheme}://${url.hostname}:${Number(port)}`;
}

/**
 * etcdBackend({ hosts }): what etcd3 (grpc) cannot dial is an InvalidArgumentError at once, naming
 * the element — never a retryable BackendUnavailableError on every call — and the forms it can be
 * made to dial (bare host:port as http, trailing slash, upper-case scheme) work against a real etcd
 * member.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BackendUnavailableError, InvalidArgumentError } from '../../src/core/errors.js';
import { Locks } from '../../src/core/locks.js';
import { etcdBackend } from '../../src/etcd/index.js';
import { createLocks } from '../../src/index.js';
import { startCluster, type Cluster } from '../fixtures/etcd-cluster.mjs';
import { uniqueName } from '../helpers/env.js';

/** Runs `fn` and returns what it threw (synchronously). */
function thrown(fn: () => unknown): unknown {
  try {
    fn();
  } catch (error) {
    return error;
  }
  return undefined;
}

describe('etcd hosts that etcd3 cannot dial are refused at once, naming the element', () => {
  const cases: [hosts: unknown, message: RegExp][] = [
    [['http://127.0.0.1:2379/x'], /hosts\[0\] = "http:\/\/127\.0\.0\.1:2379\/x" has a path/],
    [['http://127.0.0.1:2379/./'], /has a path/],
    [['http://127.0.0.1:2379?a=b'], /has a path, query or fragment/],
    [['http://127.0.0.1:2379#x'], /has a path, query or fragment/],
    [['http://user:secret@127.0.0.1:2379'], /has a user or password/],
    [['http://user@127.0.0.1:2379'], /has a user or password/],
    [['http://127.0.0.1:99999'], /the port must be from 1 to 65535, got 99999/],
    [['http://127.0.0.1:0'], /the port must be from 1 to 65535, got 0/],
    [['http://127.0.0.1'], /has no port: etcd listens on 2379 by default, e\.g\. http:\/\/127\.0\.0\.1:2379/],
    [['http://127.0.0.1:'], /has no port/],
    [['http://:2379'], /has no host/],
    [['http://'], /has no host/],
    [['http:///127.0.0.1:2379'], /has no host/],
    [['http://127.0.0.1:23\n79'], /whitespace or control characters/],
    [['http://bad host:2379'], /whitespace or control characters/],
    [['http://exa[mple:2379'], /is not a valid URL/],
    [['grpc://127.0.0.1:2379'], /the scheme must be http:\/\/ or https:\/\/, not grpc:\/\//],
    // Bare host:port is accepted (see below); a bad one is refused by the same rules, naming the element as given.
    [['http://127.0.0.1:2379', '127.0.0.1:99999'], /^invalid hosts: hosts\[1\] = "127\.0\.0\.1:99999": the port must be from 1 to 65535, got 99999/],
    ['localhost', /^invalid hosts: hosts = "localhost" has no port: etcd listens on 2379 by default, e\.g\. localhost:2379/],
    [['127.0.0.1:2379/v3'], /hosts\[0\] = "127\.0\.0\.1:2379\/v3" has a path/],
    [['user@127.0.0.1:2379'], /hosts\[0\] = "user@127\.0\.0\.1:2379" has a user or password/],
    [[':2379'], /hosts\[0\] = ":2379" has no host/],
    [['127.0.0.1:2379', 'exa[mple:2379'], /hosts\[1\] = "exa\[mple:2379" is not a valid URL or host:port/],
    [['127.0.0.1: 2379'], /whitespace or control characters/],
    // etcd3 takes all hosts secure or none (it threw a bare Error from the constructor): named here.
    [['127.0.0.1:2379', 'https://127.0.0.1:22379'], /hosts\[1\] = "https:\/\/127\.0\.0\.1:22379" is https while hosts\[0\] is http/],
    [['http://127.0.0.1:2379', 42], /hosts\[1\] must be an etcd client URL like http:\/\/127\.0\.0\.1:2379, or host:port, as a string; got 42/],
    [[], /at least one etcd client URL/],
    [42, /expected an etcd client URL or an array of them/],
  ];
  for (const [hosts, message] of cases) {
    it(JSON.stringify(hosts), () => {
      const error = thrown(() => etcdBackend({ hosts: hosts as string[] }));
      expect(error).toBeInstanceOf(InvalidArgumentError);
      expect(error).toMatchObject({ code: 'INVALID_ARGUMENT', argument: 'hosts', retryable: false });
      expect((error as Error).message).toMatch(message);
      expect((error as Error).message).not.toMatch(/got an array/);
    });
  }

  it('etcd:// URLs with a port out of range are refused by createLocks itself, before any I/O', () => {
    for (const url of ['etcd://127.0.0.1:99999', 'etcd://127.0.0.1:0', 'redlock://127.0.0.1:70000,127.0.0.1:6379,127.0.0.1:6380']) {
      const error = thrown(() => createLocks({ url }));
      expect(error, url).toBeInstanceOf(InvalidArgumentError);
      expect(error).toMatchObject({ argument: 'url' });
      expect((error as Error).message).toMatch(/port/);
    }
  });
});

describe('etcd hosts in forms etcd3 can be made to dial', () => {
  let cluster: Cluster;
  const prefix = `${uniqueName('lh_hosts')}/`;
  beforeAll(async () => {
    cluster = await startCluster({ members: 1 });
  }, 60_000);
  afterAll(async () => {
    await cluster?.stop();
  });

  const variants: [name: string, hosts: () => string | string[]][] = [
    ['a trailing slash', () => `${cluster.endpoints[0]}/`],
    ['an upper-case scheme and host', () => [cluster.endpoints[0]!.replace('http://', 'HTTP://').replace('127.0.0.1', 'LOCALHOST')]],
    ['a port with a leading zero', () => [cluster.endpoints[0]!.replace(/:(\d+)$/, ':0$1')]],
    // etcd3's own default form ('127.0.0.1:2379') and what `etcdctl --endpoints` takes: http.
    ['bare host:port as a string', () => cluster.endpoints[0]!.replace('http://', '')],
    ['bare host:port in an array', () => [cluster.endpoints[0]!.replace('http://', '')]],
    ['bare localhost:port with a trailing slash', () => [`${cluster.endpoints[0]!.replace('http://127.0.0.1', 'localhost')}/`]],
    ['bare host:port next to a URL (two hosts: the leader route)', () => [cluster.endpoints[0]!.replace('http://', ''), cluster.endpoints[0]!]],
  ];
  for (const [name, hosts] of variants) {
    it(`${name}: acquire and release work (no BackendUnavailableError)`, async () => {
      const locks = new Locks({ backend: etcdBackend({ hosts: hosts(), prefix, requestTimeoutMs: 2_000, minTtlMs: 1_000 }), operationTimeoutMs: 3_000 });
      try {
        const lease = await locks.acquire(`hosts:${name}`, { ttlMs: 2_000, waitMs: 5_000 }).catch((error: unknown) => {
          expect(error).not.toBeInstanceOf(BackendUnavailableError);
          throw error;
        });
        expect(lease.token).toBeGreaterThan(0n);
        await lease.release();
      } finally {
        await locks.close();
      }
    }, 20_000);
  }

  it('etcd://host:port/ (trailing slash) through createLocks works too', async () => {
    const locks = createLocks({ url: `etcd://${cluster.endpoints[0]!.replace('http://', '')}/` });
    try {
      const lease = await locks.acquire('hosts:url', { ttlMs: 2_000, waitMs: 5_000 });
      expect(lease.token).toBeGreaterThan(0n);
      await lease.release();
    } finally {
      await locks.close();
    }
  }, 20_000);
});

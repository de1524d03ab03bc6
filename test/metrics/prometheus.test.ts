/**
 * leasehold/metrics against real backends (SQLite, Redis): each operation moves exactly its series
 * — read from the registry before and after, every other series unchanged — and a real Prometheus
 * (Debian's package, started here on a free port) scrapes a registry and answers a query with the
 * expected counter: the whole path a user sets up.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createServer, type Server } from 'node:http';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { Redis } from 'ioredis';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Backend } from '../../src/core/backend.js';
import { AcquireTimeoutError, StaleTokenError } from '../../src/core/errors.js';
import type { Fence } from '../../src/core/fence.js';
import { Locks } from '../../src/core/locks.js';
import { instrumentFence, instrumentLocks } from '../../src/metrics/index.js';
import { redisBackend, redisFence } from '../../src/redis/index.js';
import { sqliteBackend, sqliteFence } from '../../src/sqlite/index.js';
import { eventually, sleep, tempDir, uniqueName } from '../helpers/env.js';

const REDIS_URL = process.env.LEASEHOLD_TEST_REDIS_URL ?? 'redis://127.0.0.1:6379';
const PROMETHEUS = process.env.LEASEHOLD_TEST_PROMETHEUS ?? 'prometheus';

/** Every sample of the registry as `name{label="v",…}` → value (histograms: their _count and _sum). */
async function samples(registry: Registry): Promise<Map<string, number>> {
  const out = new Map<string, number>();
  for (const metric of await registry.getMetricsAsJSON()) {
    for (const v of metric.values as { value: number; labels: Record<string, string | number>; metricName?: string }[]) {
      const name = v.metricName ?? metric.name;
      if (name.endsWith('_bucket')) continue;
      const labels = Object.entries(v.labels)
        .sort(([a], [b]) => (a < b ? -1 : 1))
        .map(([k, x]) => `${k}="${x}"`)
        .join(',');
      out.set(`${name}{${labels}}`, v.value);
    }
  }
  return out;
}

/** What changed between two readings (gauges included), rounded so durations compare as "moved". */
function moved(before: Map<string, number>, after: Map<string, number>, ignore: RegExp = /_sum\{|longest_held/): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [k, v] of after) {
    if (ignore.test(k)) continue;
    const d = v - (before.get(k) ?? 0);
    if (d !== 0) out[k] = d;
  }
  for (const [k, v] of before) if (!after.has(k) && !ignore.test(k) && v !== 0) out[k] = -v;
  return out;
}

interface Harness {
  name: string;
  backend(): Backend;
  fence(): { fence: Fence<never>; close(): Promise<void> };
  cleanup(): Promise<void>;
}

function sqliteHarness(): Harness {
  const dir = tempDir();
  const data = new Database(join(dir.path, 'data.db'));
  return {
    name: 'sqlite',
    backend: () => sqliteBackend({ path: join(dir.path, 'locks.db') }),
    fence: () => ({ fence: sqliteFence(data) as unknown as Fence<never>, close: async () => {} }),
    cleanup: async () => {
      data.close();
      dir.cleanup();
    },
  };
}

function redisHarness(): Harness {
  const prefix = `${uniqueName('metrics')}:`;
  const client = new Redis(REDIS_URL);
  return {
    name: 'redis',
    backend: () => redisBackend({ url: REDIS_URL, prefix }),
    fence: () => {
      const f = redisFence(client, { prefix: `${prefix}fence:` });
      return { fence: f as unknown as Fence<never>, close: () => f.close() };
    },
    cleanup: async () => {
      const keys = await client.keys(`*${prefix}*`);
      if (keys.length > 0) await client.del(...keys);
      client.disconnect();
    },
  };
}

for (const make of [sqliteHarness, redisHarness]) {
  describe(`metrics on ${make.name.replace('Harness', '')}`, () => {
    let h: Harness;
    const opened: Locks[] = [];
    beforeAll(() => {
      h = make();
    });
    afterAll(async () => {
      await Promise.allSettled(opened.map((l) => l.close()));
      await h.cleanup();
    });
    const client = (registry: Registry, keyLabel?: (key: string) => string | undefined): Locks => {
      const locks = new Locks({ backend: h.backend() });
      opened.push(locks);
      instrumentLocks(locks, keyLabel ? { registry, keyLabel } : { registry });
      return locks;
    };

    it('each operation moves exactly its series; two clients share one registry', async () => {
      const registry = new Registry();
      const a = client(registry);
      const b = client(registry); // a second Locks on the same registry: no "already registered"
      const b_ = h.name; // the backend label
      const key = uniqueName('k');

      let before = await samples(registry);
      const lease = await a.acquire(key, { ttlMs: 10_000 });
      let after = await samples(registry);
      expect(moved(before, after)).toEqual({
        [`leasehold_acquire_total{backend="${b_}",outcome="acquired"}`]: 1,
        [`leasehold_acquire_wait_seconds_count{backend="${b_}"}`]: 1,
        [`leasehold_leases_held{backend="${b_}"}`]: 1,
      });

      before = after;
      expect(await b.tryAcquire(key)).toBeNull();
      after = await samples(registry);
      expect(moved(before, after)).toEqual({ [`leasehold_acquire_total{backend="${b_}",outcome="busy"}`]: 1 });

      before = after;
      await expect(b.acquire(key, { waitMs: 50 })).rejects.toBeInstanceOf(AcquireTimeoutError);
      after = await samples(registry);
      expect(moved(before, after)).toEqual({ [`leasehold_acquire_total{backend="${b_}",outcome="timeout"}`]: 1 });

      before = after;
      await lease.release();
      after = await samples(registry);
      expect(moved(before, after)).toEqual({
        [`leasehold_lease_held_seconds_count{backend="${b_}"}`]: 1,
        [`leasehold_leases_held{backend="${b_}"}`]: -1,
      });

      // A loss by expiry: no renewal, the ttl runs out while held.
      const short = await a.acquire(`${key}:short`, { ttlMs: 150, autoRenew: false });
      before = await samples(registry);
      await eventually(() => !short.held, 3_000);
      after = await samples(registry);
      expect(moved(before, after)).toEqual({
        [`leasehold_leases_lost_total{backend="${b_}",reason="expired"}`]: 1,
        [`leasehold_lease_held_seconds_count{backend="${b_}"}`]: 1,
        [`leasehold_leases_held{backend="${b_}"}`]: -1,
      });
    });

    it('a refused fence write moves refused, an accepted one accepted', async () => {
      const registry = new Registry();
      const { fence, close } = h.fence();
      const counted = instrumentFence(fence, { registry, name: 'docs' });
      const resource = uniqueName('doc');
      let before = await samples(registry);
      await counted.write(resource, 5n, () => undefined as never);
      let after = await samples(registry);
      expect(moved(before, after)).toEqual({ 'leasehold_fence_writes_total{fence="docs",outcome="accepted"}': 1 });
      before = after;
      await expect(counted.write(resource, 3n, () => undefined as never)).rejects.toBeInstanceOf(StaleTokenError);
      after = await samples(registry);
      expect(moved(before, after)).toEqual({ 'leasehold_fence_writes_total{fence="docs",outcome="refused"}': 1 });
      expect(await counted.highest(resource)).toBe(5n); // everything else is the fence's own
      await close();
    });

    it('keyLabel groups keys into a bounded key label; undefined leaves it out', async () => {
      const registry = new Registry();
      const locks = client(registry, (key) => (key.includes(':export') ? 'tenant:*:export' : undefined));
      const tenant = uniqueName('tenant');
      await (await locks.acquire(`${tenant}:42:export`, { ttlMs: 5_000 })).release();
      await (await locks.acquire(`${tenant}:other`, { ttlMs: 5_000 })).release();
      const all = await samples(registry);
      expect(all.get(`leasehold_acquire_total{backend="${h.name}",key="tenant:*:export",outcome="acquired"}`)).toBe(1);
      expect(all.get(`leasehold_acquire_total{backend="${h.name}",outcome="acquired"}`)).toBe(1);
      expect([...all.keys()].some((k) => k.includes(tenant))).toBe(false); // no raw key ever becomes a label
    });

    it('renewals count once per round trip, however many leases a session keeps', async () => {
      const registry = new Registry();
      const locks = client(registry);
      const prefix = uniqueName('renew');
      const leases = await Promise.all(Array.from({ length: 5 }, (_, i) => locks.acquire(`${prefix}:${i}`, { ttlMs: 600 })));
      await sleep(700); // renewals at ttl/3
      const renewals = (await samples(registry)).get(`leasehold_renewals_total{backend="${h.name}",outcome="ok"}`) ?? 0;
      expect(renewals).toBeGreaterThanOrEqual(1);
      // Redis and SQLite keep all five in one session: one keep-alive per interval, not five renewals.
      expect(renewals).toBeLessThanOrEqual(4);
      await Promise.all(leases.map((l) => l.release()));
    });
  });
}

describe('a real Prometheus scraping leasehold/metrics', () => {
  let server: Server | undefined;
  let prometheus: ChildProcess | undefined;
  const dir = tempDir('leasehold-prometheus-');
  afterAll(async () => {
    prometheus?.kill('SIGKILL');
    await new Promise((r) => (server ? server.close(r) : r(undefined)));
    dir.cleanup();
  });

  it('scrapes the registry and a query returns the expected counter', async () => {
    const registry = new Registry();
    const locks = new Locks({ backend: sqliteBackend({ path: join(dir.path, 'locks.db') }) });
    instrumentLocks(locks, { registry });
    for (let i = 0; i < 3; i++) await (await locks.acquire('scraped', { ttlMs: 5_000 })).release();
    await locks.close();
    server = createServer((_, res) => {
      void registry.metrics().then((text) => res.writeHead(200, { 'content-type': registry.contentType }).end(text));
    });
    await new Promise<void>((r) => server!.listen(0, '127.0.0.1', r));
    const target = `127.0.0.1:${(server.address() as { port: number }).port}`;
    const port = await new Promise<number>((resolve) => {
      const probe = createServer().listen(0, '127.0.0.1', () => {
        const p = (probe.address() as { port: number }).port;
        probe.close(() => resolve(p));
      });
    });
    writeFileSync(
      join(dir.path, 'prometheus.yml'),
      `global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: app\n    static_configs:\n      - targets: ['${target}']\n`,
    );
    prometheus = spawn(
      PROMETHEUS,
      [`--config.file=${join(dir.path, 'prometheus.yml')}`, `--storage.tsdb.path=${join(dir.path, 'data')}`, `--web.listen-address=127.0.0.1:${port}`],
      { stdio: 'ignore' },
    );
    const query = `sum(leasehold_acquire_total{job="app",backend="sqlite",outcome="acquired"})`;
    let value: string | undefined;
    const found = await eventually(
      async () => {
        try {
          const res = await fetch(`http://127.0.0.1:${port}/api/v1/query?query=${encodeURIComponent(query)}`);
          const body = (await res.json()) as { data?: { result?: { value: [number, string] }[] } };
          value = body.data?.result?.[0]?.value[1];
          return value !== undefined;
        } catch {
          return false;
        }
      },
      30_000,
      250,
    );
    expect(found).toBe(true);
    expect(value).toBe('3');
  }, 60_000);
});

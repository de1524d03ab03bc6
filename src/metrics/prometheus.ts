import type { Counter, Gauge, Histogram, Registry } from 'prom-client';
import { InvalidArgumentError, StaleTokenError } from '../core/errors.js';
import type { Fence, FenceWriteOptions } from '../core/fence.js';
import type { TokenInput } from '../core/token.js';
import type { Locks } from '../core/locks.js';
import { checkObject, checkKnownOptions, describe } from '../core/validate.js';
import { createRequire } from 'node:module';
import { requirePeer } from '../core/peer.js';

/**
 * Buckets of the duration histograms, in seconds: 1 ms … 10 min. A grant on a free key takes a
 * millisecond or less (the first buckets tell one coordinator round trip from two); a contended
 * wait or a job's hold runs from seconds to minutes (the nightly job, the export); past 10 min
 * everything lands in +Inf, and LeaseholdHeldTooLong (examples/prometheus/alerts.yml) watches
 * `leasehold_lease_longest_held_seconds` for holds that go on and on.
 */
export const DURATION_BUCKETS: readonly number[] = Object.freeze([0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600]);

export interface InstrumentLocksOptions {
  /** The prom-client registry to register on (e.g. prom-client's default `register`). */
  registry: Registry;
  /**
   * Maps a lock key to a bounded group name, added as a `key` label to the acquire, wait, held and
   * lost series (`'tenant:42:export'` → `'tenant:*:export'`); undefined leaves the label out. Keys
   * are not labels by default: their number is unbounded, and each label value is a series.
   * @default no key label
   */
  keyLabel?: (key: string) => string | undefined;
}

export interface InstrumentFenceOptions {
  registry: Registry;
  /** The fence's name, the `fence` label (`orders`, `documents`): a bounded, stable name per fence. */
  name: string;
}

/** The series of one registry, shared by every Locks and fence instrumented on it. */
interface Series {
  acquires: Counter<'backend' | 'outcome' | 'key'>;
  wait: Histogram<'backend' | 'key'>;
  held: Histogram<'backend' | 'key'>;
  leasesHeld: Gauge<'backend'>;
  longestHeld: Gauge<'backend'>;
  lost: Counter<'backend' | 'reason' | 'key'>;
  renewals: Counter<'backend' | 'outcome'>;
  fenceWrites: Counter<'fence' | 'outcome'>;
  /** Every Locks instrumented on this registry, for the gauges (read when scraped). */
  clients: Set<ClientState>;
}

interface ClientState {
  readonly locks: Locks;
  /** When each lease this client holds was granted (performance.now()), by key and token. */
  readonly since: Map<string, number>;
}

const byRegistry = new WeakMap<Registry, Series>();

/**
 * Counts what a `Locks` does, from its events (nothing on the acquire path itself):
 *
 * | metric | type | labels | what |
 * | --- | --- | --- | --- |
 * | `leasehold_acquire_total` | counter | backend, outcome, key? | acquires by outcome: acquired, timeout, busy (tryAcquire null), aborted (signal or close), error |
 * | `leasehold_acquire_wait_seconds` | histogram | backend, key? | from the call to the grant |
 * | `leasehold_lease_held_seconds` | histogram | backend, key? | from the grant to its release or loss |
 * | `leasehold_leases_held` | gauge | backend | leases this client holds now |
 * | `leasehold_lease_longest_held_seconds` | gauge | backend | how long the oldest lease held now has been held |
 * | `leasehold_leases_lost_total` | counter | backend, reason, key? | leases lost while held |
 * | `leasehold_renewals_total` | counter | backend, outcome | renewal round trips: ok, failed (transient; a session keep-alive counts once) |
 *
 * Instrumenting two `Locks` on one registry adds them to the same series (no "already registered").
 * Returns a function that stops counting this client.
 */
export function instrumentLocks(locks: Locks, options: InstrumentLocksOptions): () => void {
  const o = checkObject(options, 'options');
  checkKnownOptions(o, ['registry', 'keyLabel'], 'options');
  const series = seriesOf(o.registry);
  const keyLabel = o.keyLabel;
  if (keyLabel !== undefined && typeof keyLabel !== 'function') {
    throw new InvalidArgumentError('options.keyLabel', `expected a function (key) => label | undefined, got ${describe(keyLabel)}`);
  }
  const group = (key: string): { key?: string } => {
    const label = (keyLabel as InstrumentLocksOptions['keyLabel'])?.(key);
    return typeof label === 'string' ? { key: label } : {};
  };
  const backend = (): string => locks.backendName ?? 'unknown';
  const state: ClientState = { locks, since: new Map() };
  series.clients.add(state);
  const id = (key: string, token: bigint): string => `${token}\u0000${key}`;

  const handlers = {
    acquired: (e: { key: string; token: bigint; waitedMs: number }) => {
      const labels = { backend: backend(), ...group(e.key) };
      series.acquires.inc({ ...labels, outcome: 'acquired' });
      series.wait.observe(labels, e.waitedMs / 1000);
      state.since.set(id(e.key, e.token), performance.now());
    },
    busy: (e: { key: string }) => series.acquires.inc({ backend: backend(), outcome: 'busy', ...group(e.key) }),
    acquireFailed: (e: { key: string; outcome: string }) => series.acquires.inc({ backend: backend(), outcome: e.outcome, ...group(e.key) }),
    released: (e: { key: string; token: bigint; heldMs: number }) => {
      series.held.observe({ backend: backend(), ...group(e.key) }, e.heldMs / 1000);
      state.since.delete(id(e.key, e.token));
    },
    lost: (e: { key: string; token: bigint; reason: string; heldMs: number }) => {
      const labels = { backend: backend(), ...group(e.key) };
      series.held.observe(labels, e.heldMs / 1000);
      series.lost.inc({ ...labels, reason: e.reason });
      state.since.delete(id(e.key, e.token));
    },
    renewed: () => series.renewals.inc({ backend: backend(), outcome: 'ok' }),
    renewFailed: () => series.renewals.inc({ backend: backend(), outcome: 'failed' }),
  };
  for (const [name, handler] of Object.entries(handlers)) locks.on(name as 'acquired', handler as never);
  return () => {
    for (const [name, handler] of Object.entries(handlers)) locks.off(name as 'acquired', handler as never);
    series.clients.delete(state);
  };
}

/**
 * Counts a fence's writes: `leasehold_fence_writes_total{fence, outcome}`, outcome `accepted`,
 * `refused` (StaleTokenError: a zombie was stopped) or `error` (anything else: the store failed,
 * `mutate` threw, a bad token). Returns a fence that counts and otherwise behaves as `fence`.
 */
export function instrumentFence<F extends AnyFence>(fence: F, options: InstrumentFenceOptions): F {
  const o = checkObject(options, 'options');
  checkKnownOptions(o, ['registry', 'name'], 'options');
  if (typeof o.name !== 'string' || o.name.length === 0 || o.name.length > 100) {
    throw new InvalidArgumentError('options.name', `expected the fence's name (1-100 characters), got ${describe(o.name)}`);
  }
  if (!fence || typeof (fence as { write?: unknown }).write !== 'function') throw new InvalidArgumentError('fence', `expected a fence, got ${describe(fence)}`);
  const series = seriesOf(o.registry);
  const name = o.name;
  const counted = Object.create(fence) as F;
  const write = fence.write.bind(fence) as Fence<never>['write'];
  Object.defineProperty(counted, 'write', {
    value: async (...args: Parameters<Fence<never>['write']>) => {
      try {
        const result = await write(...args);
        series.fenceWrites.inc({ fence: name, outcome: 'accepted' });
        return result;
      } catch (error) {
        series.fenceWrites.inc({ fence: name, outcome: error instanceof StaleTokenError ? 'refused' : 'error' });
        throw error;
      }
    },
  });
  return counted;
}

function seriesOf(registry: unknown): Series {
  if (typeof registry !== 'object' || registry === null || typeof (registry as Registry).getSingleMetric !== 'function') {
    throw new InvalidArgumentError('options.registry', `expected a prom-client Registry, got ${describe(registry)}`);
  }
  const reg = registry as Registry;
  const existing = byRegistry.get(reg);
  if (existing) return existing;
  const prom = requirePeer<typeof import('prom-client')>(createRequire(import.meta.url), 'prom-client', 'leasehold/metrics');
  const clients = new Set<ClientState>();
  /** The metric of that name on the registry (made by another copy of leasehold, say), else a new one. */
  const get = <M>(name: string, make: () => M): M => (reg.getSingleMetric(name) as M | undefined) ?? make();
  const registers = [reg];
  const series: Series = {
    clients,
    acquires: get(
      'leasehold_acquire_total',
      () =>
        new prom.Counter({
          name: 'leasehold_acquire_total',
          help: 'Acquires by outcome: acquired, timeout, busy (tryAcquire found the key held), aborted (signal or close), error.',
          labelNames: ['backend', 'outcome', 'key'],
          registers,
        }),
    ),
    wait: get(
      'leasehold_acquire_wait_seconds',
      () =>
        new prom.Histogram({
          name: 'leasehold_acquire_wait_seconds',
          help: 'Time from the acquire call to the grant.',
          labelNames: ['backend', 'key'],
          buckets: [...DURATION_BUCKETS],
          registers,
        }),
    ),
    held: get(
      'leasehold_lease_held_seconds',
      () =>
        new prom.Histogram({
          name: 'leasehold_lease_held_seconds',
          help: 'Time from the grant to the release or loss of a lease.',
          labelNames: ['backend', 'key'],
          buckets: [...DURATION_BUCKETS],
          registers,
        }),
    ),
    leasesHeld: get(
      'leasehold_leases_held',
      () =>
        new prom.Gauge({
          name: 'leasehold_leases_held',
          help: 'Leases this process holds now.',
          labelNames: ['backend'],
          registers,
          collect() {
            this.reset();
            for (const c of clients) this.inc({ backend: c.locks.backendName ?? 'unknown' }, c.locks.leases().length);
          },
        }),
    ),
    longestHeld: get(
      'leasehold_lease_longest_held_seconds',
      () =>
        new prom.Gauge({
          name: 'leasehold_lease_longest_held_seconds',
          help: 'How long the oldest lease this process holds now has been held.',
          labelNames: ['backend'],
          registers,
          collect() {
            this.reset();
            const now = performance.now();
            const oldest = new Map<string, number>();
            for (const c of clients) {
              const backend = c.locks.backendName ?? 'unknown';
              for (const since of c.since.values()) oldest.set(backend, Math.max(oldest.get(backend) ?? 0, (now - since) / 1000));
            }
            for (const [backend, seconds] of oldest) this.set({ backend }, seconds);
          },
        }),
    ),
    lost: get(
      'leasehold_leases_lost_total',
      () =>
        new prom.Counter({
          name: 'leasehold_leases_lost_total',
          help: 'Leases lost while held, by reason (expired, not-held, session-lost).',
          labelNames: ['backend', 'reason', 'key'],
          registers,
        }),
    ),
    renewals: get(
      'leasehold_renewals_total',
      () =>
        new prom.Counter({
          name: 'leasehold_renewals_total',
          help: 'Renewal round trips by outcome (ok, failed); a session keep-alive counts once however many leases it keeps.',
          labelNames: ['backend', 'outcome'],
          registers,
        }),
    ),
    fenceWrites: get(
      'leasehold_fence_writes_total',
      () =>
        new prom.Counter({
          name: 'leasehold_fence_writes_total',
          help: 'Fenced writes by outcome: accepted, refused (a stale token: a zombie was stopped), error.',
          labelNames: ['fence', 'outcome'],
          registers,
        }),
    ),
  };
  byRegistry.set(reg, series);
  return series;
}

/** Any fence, whatever its transaction type (the mutate callback is only passed through). */
interface AnyFence {
  write(resource: string, token: TokenInput, mutate: never, options?: FenceWriteOptions): Promise<unknown>;
}

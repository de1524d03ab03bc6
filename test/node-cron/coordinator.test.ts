/**
 * leasehold/node-cron's coordinator against the memory coordinator: instances asking for one slot
 * (only one runs it), the minimum hold that makes a late instance skip after the run ended (and the
 * control without it, which runs the slot twice), the coordinator failing (skip, report, never
 * throw), and real node-cron tasks in this process that find their lease from their context.
 */
import cron, { type RunCoordinator, type TaskContext } from 'node-cron';
import { afterEach, describe, expect, it } from 'vitest';
import { advance as advanceBy } from '../helpers/clock.js';
import type { Backend } from '../../src/core/backend.js';
import { manualClock, type ManualClock } from '../../src/core/clock.js';
import { BackendUnavailableError, InvalidArgumentError } from '../../src/core/errors.js';
import type { Lease } from '../../src/core/lease.js';
import { Locks } from '../../src/core/locks.js';
import { memoryBackend } from '../../src/memory/index.js';
import { cronCoordinator } from '../../src/node-cron/index.js';

const advance = (clock: ManualClock, ms: number, step = 100): Promise<void> => advanceBy(clock, ms, step);

/** `count` clients (instances) of one memory coordinator on one injected clock. */
function instances(count: number, clock?: ManualClock): Locks[] {
  const shared = memoryBackend(clock ? { clock } : {});
  // Each instance closes only its own view: the coordinator outlives them.
  return Array.from({ length: count }, () => new Locks({ backend: Object.create(shared, { close: { value: async () => {} } }) as Backend, clock }));
}

const SLOT = 'nightly:2030-01-01T03:00:00.000Z';
const opened: Locks[] = [];
afterEach(async () => {
  await Promise.all(opened.splice(0).map((l) => l.close()));
});

describe('cronCoordinator', () => {
  it("is node-cron's RunCoordinator (a type check) and validates its options, naming each", () => {
    const [locks] = instances(1);
    opened.push(locks!);
    const coordinator: RunCoordinator = cronCoordinator(locks!);
    expect(typeof coordinator.shouldRun).toBe('function');
    for (const [options, argument] of [
      [{ minHoldMs: -1 }, 'options.minHoldMs'],
      [{ ttlMs: 1 }, 'options.ttlMs'],
      [{ label: '' }, 'options.label'],
      [{ keyPrefix: 7 }, 'options.keyPrefix'],
      [{ onError: 'log' }, 'options.onError'],
      [{ minHold: 5_000 }, 'options.minHold'],
      ['fast', 'options'],
    ] as const) {
      expect(() => cronCoordinator(locks!, options as never)).toThrow(expect.objectContaining({ name: 'InvalidArgumentError', argument }));
    }
    expect(() => cronCoordinator({} as Locks)).toThrow(InvalidArgumentError);
  });

  it('three instances asking for one slot at once: exactly one runs it, holding a lease of that slot', async () => {
    const all = instances(3);
    opened.push(...all);
    const coordinators = all.map((locks, i) => cronCoordinator(locks, { label: `web-${i}` }));
    const answers = await Promise.all(coordinators.map((c) => c.shouldRun(SLOT, 30_000)));
    expect(answers.filter(Boolean)).toHaveLength(1);
    const winner = coordinators[answers.indexOf(true)]!;
    const lease = winner.lease(SLOT)!;
    expect(lease.key).toBe(`cron:${SLOT}`);
    expect(lease.held).toBe(true);
    expect(lease.token).toBeGreaterThan(0n);
    for (const c of coordinators) if (c !== winner) expect(c.lease(SLOT)).toBeUndefined();
    const [state] = await all[0]!.inspect(`cron:${SLOT}`);
    expect(state?.holders.map((h) => h.holder)).toEqual([`web-${answers.indexOf(true)}`]);
    await winner.onComplete(SLOT);
    expect(lease.held).toBe(false);
    expect(winner.lease(SLOT)).toBeUndefined();
  });

  it('after the run, the slot stays taken until grant + minHoldMs: an instance a few seconds late skips, one later than that runs it', async () => {
    const clock = manualClock(1_000);
    const [early, late, later] = instances(3, clock).map((locks) => (opened.push(locks), cronCoordinator(locks, { minHoldMs: 5_000 })));
    expect(await early!.shouldRun(SLOT, 30_000)).toBe(true);
    await advance(clock, 200); // the job takes 200 ms
    await early!.onComplete(SLOT);
    await advance(clock, 2_800); // a clock 3 s late fires the same slot: taken
    expect(await late!.shouldRun(SLOT, 30_000)).toBe(false);
    await advance(clock, 2_100); // 5.1 s after the grant: the hold is over, the key expired
    expect(await later!.shouldRun(SLOT, 30_000)).toBe(true); // the documented limit: later than minHoldMs runs again
  });

  it('minHoldMs defaults to the ttl node-cron passes (distributedLease), or to options.ttlMs', async () => {
    const clock = manualClock(1_000);
    const [a, b, c, d] = instances(4, clock).map((locks) => (opened.push(locks), locks));
    const first = cronCoordinator(a!);
    expect(await first.shouldRun(SLOT, 8_000)).toBe(true);
    await first.onComplete(SLOT);
    await advance(clock, 7_500);
    expect(await cronCoordinator(b!).shouldRun(SLOT, 8_000)).toBe(false);
    await advance(clock, 600);
    const second = cronCoordinator(b!, { ttlMs: 4_000 });
    expect(await second.shouldRun(SLOT, 8_000)).toBe(true);
    expect(second.lease(SLOT)!.ttlMs).toBe(4_000);
    await second.onComplete(SLOT);
    await advance(clock, 3_900);
    expect(await cronCoordinator(c!).shouldRun(SLOT, 8_000)).toBe(false);
    await advance(clock, 200);
    expect(await cronCoordinator(d!).shouldRun(SLOT, 8_000)).toBe(true);
  });

  it('control: with minHoldMs 0 the release frees the slot at once, and an instance 1 s late runs it a second time', async () => {
    const clock = manualClock(1_000);
    const [early, late] = instances(2, clock).map((locks) => (opened.push(locks), cronCoordinator(locks, { minHoldMs: 0 })));
    expect(await early!.shouldRun(SLOT, 30_000)).toBe(true);
    await advance(clock, 200);
    await early!.onComplete(SLOT);
    await advance(clock, 800);
    expect(await late!.shouldRun(SLOT, 30_000)).toBe(true);
  });

  it('a run longer than the ttl keeps its slot (renewed while it runs)', async () => {
    const clock = manualClock(1_000);
    const [a, b] = instances(2, clock).map((locks) => (opened.push(locks), cronCoordinator(locks, { minHoldMs: 0 })));
    expect(await a!.shouldRun(SLOT, 3_000)).toBe(true);
    await advance(clock, 10_000);
    expect(a!.lease(SLOT)!.held).toBe(true);
    expect(await b!.shouldRun(SLOT, 3_000)).toBe(false);
    await a!.onComplete(SLOT);
    expect(await b!.shouldRun(SLOT, 3_000)).toBe(true);
  });

  it('the coordinator failing: shouldRun answers false (never runs without the lease) and reports to onError, never rejecting', async () => {
    const down = new BackendUnavailableError('memory', 'acquire', { cause: new Error('connection refused') });
    const failing = { ...memoryBackend(), acquire: () => Promise.reject(down) } as Backend;
    const locks = new Locks({ backend: failing });
    opened.push(locks);
    const reported: [unknown, string][] = [];
    const coordinator = cronCoordinator(locks, { onError: (error, key) => reported.push([error, key]) });
    expect(await coordinator.shouldRun(SLOT, 30_000)).toBe(false);
    expect(reported).toHaveLength(1);
    expect(reported[0]![1]).toBe(SLOT);
    expect(reported[0]![0]).toBeInstanceOf(BackendUnavailableError);
    await coordinator.onComplete(SLOT); // nothing held: nothing to do
    expect(reported).toHaveLength(1);

    // A closed Locks, and an onError that itself throws: still false, reported as a process warning.
    const [closed] = instances(1);
    await closed!.close();
    const warnings: Error[] = [];
    const onWarning = (w: Error): void => void warnings.push(w);
    process.on('warning', onWarning);
    try {
      const thrown = cronCoordinator(closed!, {
        onError: () => {
          throw new Error('a broken handler');
        },
      });
      expect(await thrown.shouldRun(SLOT, 30_000)).toBe(false);
      await new Promise((r) => setImmediate(r)); // warnings are emitted on the next tick
      expect(warnings.map((w) => (w as Error & { code?: string }).code)).toEqual(['LEASEHOLD_CRON']);
      expect(warnings[0]!.message).toContain(SLOT);
    } finally {
      process.off('warning', onWarning);
    }
  });

  it('without onError, a failure is a process warning (code LEASEHOLD_CRON) naming the slot and the error', async () => {
    const [closed] = instances(1);
    await closed!.close();
    const warnings: Error[] = [];
    const onWarning = (w: Error): void => void warnings.push(w);
    process.on('warning', onWarning);
    try {
      expect(await cronCoordinator(closed!).shouldRun(SLOT, 30_000)).toBe(false);
      await new Promise((r) => setImmediate(r));
      expect(warnings).toHaveLength(1);
      expect(warnings[0]).toMatchObject({ code: 'LEASEHOLD_CRON' });
      expect(warnings[0]!.message).toContain(SLOT);
      expect(warnings[0]!.message).toMatch(/was closed$/); // the ClosedError's message
    } finally {
      process.off('warning', onWarning);
    }
  });
});

describe('with node-cron', () => {
  it('two instances of a distributed task in one process: each fire time runs once, and the task finds its lease from its context', async () => {
    const all = instances(2);
    opened.push(...all);
    const runs: { slot: string; token: bigint; held: boolean }[] = [];
    const skipped: string[] = [];
    const tasks = all.map((locks) => {
      const coordinator = cronCoordinator(locks, { minHoldMs: 3_000 });
      const task = cron.schedule(
        '* * * * * *',
        (context: TaskContext) => {
          const lease: Lease | undefined = coordinator.lease(context);
          runs.push({ slot: context.date.toISOString(), token: lease?.token ?? -1n, held: lease?.held ?? false });
        },
        { name: 'unit-slots', distributed: true, runCoordinator: coordinator },
      );
      task.on('execution:skipped', (context) => void skipped.push(`${context.date.toISOString()} ${context.reason}`));
      return task;
    });
    await new Promise((r) => setTimeout(r, 3_300));
    await Promise.all(tasks.map((t) => t.destroy()));
    expect(runs.length).toBeGreaterThanOrEqual(2);
    const slots = runs.map((r) => r.slot);
    expect(new Set(slots).size).toBe(slots.length); // no slot twice
    for (const r of runs) {
      expect(r.held).toBe(true);
      expect(r.token).toBeGreaterThan(0n);
    }
    // The other instance saw the same fire times and was refused each (not-elected, not an error).
    for (const s of skipped) expect(s).toMatch(/ not-elected$/);
    expect(skipped.length).toBeGreaterThanOrEqual(runs.length - 1);
  });
});

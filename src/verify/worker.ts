/**
 * A worker process of `leasehold verify` (started by the harness with `fork`, never by hand). It
 * loops — acquire → work → write → release — on one key and one resource, and reports every step
 * as a history event over IPC, stamped with the run's monotonic time (see protocol.ts).
 *
 * The write deliberately does not look at `lease.signal` first: every late write reaches the
 * resource, which is the worst case for the fence and the case the control run must lose.
 *
 * - fenced: `store.fencedIncrement` — the fence checks the token, and the counter is read,
 *   incremented and appended to the log inside the fence's transaction.
 * - control (`--no-fence`): the counter is read right after acquiring; after the work the worker
 *   stores value + 1 and appends its row, trusting its lock.
 *
 * With `limit` the lease is a permit of a semaphore of that many; with `countThenAcquire` (the
 * control of `--limit`) it is a plain shared lock taken after counting the holders with inspect.
 *
 * Besides the loop it runs a 10 ms event-loop monitor. When `lease.signal` aborts, the `lost`
 * event says whether the loop ran a timer due after the lease's validity deadline before the
 * signal: if not, the process was not running (frozen or stalled) from the deadline until the
 * signal, and a late signal is the expected "learns it as soon as it runs again" (I6).
 */
import { backendLoader } from '../connect.js';
import type { Backend } from '../core/backend.js';
import { StaleTokenError } from '../core/errors.js';
import { onLoss, type Lease } from '../core/lease.js';
import { Locks } from '../core/locks.js';
import { adjustableClock } from './clock.js';
import { MUTANT_ENV, runTime, type WorkerCommand, type WorkerConfig, type WorkerEvent } from './protocol.js';
import { openWorkerStore } from './open-store.js';
import { sleep } from '../util/sleep.js';

/** Period of the event-loop monitor. */
const MONITOR_MS = 10;
/** Monitor ticks kept, in ms of history (a freeze longer than this still reads as "not running"). */
const MONITOR_WINDOW_MS = 60_000;
/** A tick counts as "due after the deadline" only beyond this margin (timer granularity). */
const DUE_MARGIN_MS = 3;

type Omitted<E> = E extends unknown ? Omit<E, 't' | 'w'> : never;

function describeError(error: unknown): string {
  if (error instanceof Error) return `${error.name}: ${error.message}`.replace(/\s+/g, ' ').slice(0, 300);
  return String(error).slice(0, 300);
}

/**
 * The `overstated-ttl` mutant (test-only, see MUTANT_ENV): the backend as it is, except that grants
 * and renewals report twice the ttl the coordinator applied, and without sessions (a session's
 * keep-alive would pass the doubled ttl back to the coordinator and heal the lie).
 */
function overstatingTtl(backend: Backend): Backend {
  return {
    name: backend.name,
    capabilities: backend.capabilities,
    acquire: async (request) => {
      const r = await backend.acquire(request);
      return r.granted ? { ...r, ttlMs: 2 * r.ttlMs } : r;
    },
    renew: async (request) => {
      const r = await backend.renew(request);
      return r.renewed ? { ...r, ttlMs: 2 * r.ttlMs } : r;
    },
    release: (request) => backend.release(request),
    inspect: (prefix) => backend.inspect(prefix),
    close: () => backend.close(),
    ...(backend.subscribe ? { subscribe: backend.subscribe.bind(backend) } : {}),
    ...(backend.cancelWait ? { cancelWait: backend.cancelWait.bind(backend) } : {}),
  };
}

async function main(): Promise<void> {
  const config = JSON.parse(process.argv[2] ?? '') as WorkerConfig;
  /** Time 0 of the history, given by the harness with `start`; events before it are stamped 0. */
  let origin: bigint | undefined;
  const w = config.index;
  const now = (): number => (origin === undefined ? 0 : runTime(origin));
  const emit = (e: Omitted<WorkerEvent>): void => {
    if (process.connected) process.send!({ ...e, t: now(), w });
  };
  const flush = (): Promise<void> =>
    new Promise((resolve) => {
      if (!process.connected) return resolve();
      process.send!({ type: 'finished', t: now(), w } satisfies WorkerEvent, undefined, undefined, () => resolve());
    });
  // The harness is gone: so are we.
  process.on('disconnect', () => process.exit(1));

  const fail = (error: unknown): void => {
    emit({ type: 'failed', error: describeError(error) });
    setTimeout(() => process.exit(1), 100);
  };

  // The event-loop monitor: when each tick was due, and when it ran.
  const ticks: { due: number; ran: number }[] = [];
  let lastRan = now();
  const monitor = setInterval(() => {
    const ran = now();
    ticks.push({ due: lastRan + MONITOR_MS, ran });
    lastRan = ran;
    while (ticks.length > 0 && ticks[0]!.ran < ran - MONITOR_WINDOW_MS) ticks.shift();
  }, MONITOR_MS);
  monitor.unref();
  const ranAfter = (deadline: number, until: number): boolean => ticks.some((k) => k.due > deadline + DUE_MARGIN_MS && k.ran <= until);

  const clock = adjustableClock(config.clock);
  const load = backendLoader(config.leaseUrl);
  const backend = process.env[MUTANT_ENV] === 'overstated-ttl' ? async () => overstatingTtl(await load()) : load;
  const locks = new Locks({ backend, clock, holderName: `verify w${w} (pid ${process.pid})`, driftFactor: config.driftFactor });
  const store = await openWorkerStore(config.store);
  const stop = new AbortController();
  let current: { lease: Lease; due: number | null } | undefined;

  /**
   * When the lease's local validity runs out, in run time, at the clock's current rate. The time
   * is read before the remaining validity: a freeze between the two reads can only make the
   * result earlier than the truth, never later (the checker then judges more leniently, never
   * raises a false alarm).
   */
  const deadline = (lease: Lease): number => {
    const t = now();
    return Math.round((t + lease.remainingMs() / clock.rate) * 100) / 100;
  };
  /** Reports the current lease's deadline after a renewal or a rate change. */
  const reportValidity = (): void => {
    if (!current?.lease.held) return;
    const until = deadline(current.lease);
    current.due = until;
    emit({ type: 'validity', token: current.lease.token.toString(), until });
  };
  // One event per renewal round trip (a session's names its oldest lease): whichever it names, the
  // current lease's validity may have moved, and reportValidity reads it from the lease itself.
  locks.on('renewed', () => reportValidity());

  /** The lock, a permit of the semaphore (`limit`), or the control's broken semaphore (count, then a plain shared lock). */
  const acquire = async (): Promise<Lease> => {
    const base = { ttlMs: config.ttlMs, waitMs: config.waitMs, signal: stop.signal };
    if (config.limit === undefined) return locks.acquire(config.key, base);
    if (!config.countThenAcquire) return locks.acquire(config.key, { ...base, limit: config.limit });
    const giveUp = performance.now() + config.waitMs;
    for (;;) {
      const state = (await locks.inspect(config.key)).find((s) => s.key === config.key);
      // The race this control exists to lose: others count the same free place before anyone takes it.
      if ((state?.holders.length ?? 0) < config.limit) return locks.acquire(config.key, { ...base, mode: 'shared' });
      if (stop.signal.aborted) throw stop.signal.reason;
      if (performance.now() > giveUp) throw new Error(`count-then-acquire: all ${config.limit} places taken for ${config.waitMs} ms`);
      await sleep(1 + Math.random() * 4, { signal: stop.signal });
    }
  };

  const loop = async (): Promise<void> => {
    for (let n = 1; !stop.signal.aborted; n++) {
      const op = `w${w}.${n}`;
      emit({ type: 'acquire', op });
      let lease: Lease;
      try {
        lease = await acquire();
      } catch (error) {
        if (stop.signal.aborted) break;
        emit({ type: 'acquire-failed', op, error: describeError(error) });
        await sleep(Math.min(100, config.ttlMs / 4));
        continue;
      }
      const token = lease.token.toString();
      // The deadline first: the harness reacts to `granted` at once (a pause may land right after it).
      const entry = { lease, due: deadline(lease) as number | null };
      current = entry;
      emit({ type: 'granted', op, token, ttlMs: lease.ttlMs });
      emit({ type: 'validity', token, until: entry.due! });
      // A freeze can land anywhere, even here (the harness pauses a worker the moment it reports a
      // grant): onLoss looks at the signal once, so a loss that look makes official still reaches us.
      onLoss(lease, (error) => {
        const at = now();
        emit({ type: 'lost', token, reason: error.reason, due: entry.due, running: entry.due === null ? true : ranAfter(entry.due, at) });
      });

      let read = 0;
      let readOk = true;
      if (!config.fenced) {
        try {
          read = await store.read(config.resource);
          emit({ type: 'read', op, value: read });
        } catch (error) {
          emit({ type: 'read-failed', op, error: describeError(error) });
          readOk = false;
        }
      }
      if (readOk) {
        await sleep(config.workMs); // the work; a pause or a delay lands here
        emit({ type: 'write', op, token });
        try {
          if (config.fenced) {
            const value = await store.fencedIncrement(config.resource, lease.token, { w, op });
            emit({ type: 'accepted', op, token, ...(value === undefined ? {} : { value }) });
          } else {
            await store.plainWrite(config.resource, read + 1, { w, op, token: lease.token });
            emit({ type: 'accepted', op, token, value: read + 1 });
          }
        } catch (error) {
          if (error instanceof StaleTokenError) emit({ type: 'refused', op, token, highest: error.highest.toString() });
          else emit({ type: 'write-failed', op, token, error: describeError(error) });
        }
      }
      // A lease whose validity ran out during a pause is lost as soon as it is looked at (core makes
      // the loss official before the overdue timer runs), so release() never hides a loss.
      emit({ type: 'release', op, token });
      try {
        await lease.release();
        emit({ type: 'released', op, token });
      } catch (error) {
        emit({ type: 'released', op, token, error: describeError(error) });
      }
      current = undefined;
    }
  };

  let running: Promise<void> | undefined;
  let finishing = false;
  const finish = async (): Promise<void> => {
    stop.abort();
    await running?.catch(fail);
    await locks.close().catch(() => {});
    await store.close().catch(() => {});
    clearInterval(monitor);
    await flush();
    process.exit(0);
  };

  process.on('message', (command: WorkerCommand) => {
    switch (command.cmd) {
      case 'start':
        if (running) return;
        origin = BigInt(command.originNs);
        lastRan = now();
        emit({ type: 'clock', rate: clock.rate, offsetMs: clock.offsetMs });
        running = loop();
        running.catch(fail);
        return;
      case 'clock':
        clock.setRate(command.rate);
        emit({ type: 'clock', rate: command.rate, offsetMs: clock.offsetMs });
        reportValidity();
        return;
      case 'stop':
        if (finishing) return;
        finishing = true;
        finish().catch(fail);
        return;
    }
  });
  emit({ type: 'ready', pid: process.pid });
}

main().catch((error: unknown) => {
  // Before the loop started (a bad config, a store that cannot be opened): t is 0, w unknown.
  if (process.connected) process.send!({ type: 'failed', t: 0, w: 0, error: describeError(error) } satisfies WorkerEvent);
  setTimeout(() => process.exit(1), 100);
});

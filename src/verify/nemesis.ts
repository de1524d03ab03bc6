/**
 * Runs the planned fault schedule against the live run:
 *
 * - pause: at the next grant after the planned time, SIGSTOP that worker — it holds the lease and
 *   has just started its work — for the planned time (longer than the ttl), then SIGCONT.
 * - delay: at the next grant, the worker's proxies hold every byte it sends, to the coordinator
 *   and to the resource's store, for the planned time (longer than the ttl), then deliver them in
 *   order: its renewals and its write are sent in time and arrive after its lease is gone.
 * - crash: kill the coordinator verify started (SIGKILL; PostgreSQL: immediate stop; Redlock: one
 *   of its nodes), leave it down for the planned time, start it again on the same port.
 * - clock: run the planned worker's clock at the planned rate for the planned time, then at 1.
 *
 * Faults of one kind run one at a time (a fault that is still running delays the next of its
 * kind); faults of different kinds overlap freely. `stop()` heals at once whatever is running
 * (SIGCONT, deliver, restart, rate 1) and cancels the rest.
 */
import { formatDuration } from '../util/duration.js';
import { waitUntilStopped, type ChildWorker } from '../util/process.js';
import { sleep } from '../util/sleep.js';
import type { LocalServer } from './local.js';
import type { HarnessEvent, Unstamped, WorkerCommand } from './protocol.js';
import type { DelayProxy } from './proxy.js';
import type { NemesisKind, PlannedFault } from './schedule.js';

/** What the nemesis needs from a worker: its number and its process. */
export interface Target {
  readonly index: number;
  readonly process: Pick<ChildWorker<WorkerCommand, unknown>, 'pid' | 'name' | 'running' | 'signal' | 'send'>;
}

export interface NemesisContext {
  /** Run time, ms. */
  now(): number;
  record(event: Unstamped<HarnessEvent>): void;
  /** A line for the terminal. */
  say(line: string): void;
  workers: readonly Target[];
  /** Each worker's proxies (empty when delay does not apply). */
  proxies: ReadonlyMap<number, readonly DelayProxy[]>;
  /** The coordinator verify started, when crash applies. */
  coordinator: LocalServer | undefined;
  /** Resolves with the next worker granted the lease (excluding `busy` ones), or undefined after `timeoutMs` or on abort. */
  nextGrant(timeoutMs: number, exclude: ReadonlySet<number>, signal: AbortSignal): Promise<number | undefined>;
  ttlMs: number;
}

export class Nemesis {
  readonly #ctx: NemesisContext;
  readonly #faults: readonly PlannedFault[];
  readonly #abort = new AbortController();
  readonly #timers = new Set<ReturnType<typeof setTimeout>>();
  readonly #running = new Set<Promise<void>>();
  readonly #chains = new Map<NemesisKind, Promise<void>>();
  /** Workers frozen or delayed right now: not picked again until healed. */
  readonly #busy = new Set<number>();

  constructor(ctx: NemesisContext, faults: readonly PlannedFault[]) {
    this.#ctx = ctx;
    this.#faults = faults;
  }

  /** Arms a timer for every planned fault, relative to now (the run's start). */
  start(): void {
    const t0 = this.#ctx.now();
    for (const fault of this.#faults) {
      const timer = setTimeout(
        () => {
          this.#timers.delete(timer);
          const previous = this.#chains.get(fault.kind) ?? Promise.resolve();
          const run = previous.then(() => (this.#abort.signal.aborted ? undefined : this.#run(fault)));
          const tracked = run.catch((error: unknown) => {
            this.#ctx.record({ type: 'skipped', kind: fault.kind, why: `failed: ${error instanceof Error ? error.message : String(error)}` });
          });
          this.#chains.set(fault.kind, tracked);
          this.#running.add(tracked);
          void tracked.finally(() => this.#running.delete(tracked));
        },
        Math.max(0, t0 + fault.at - this.#ctx.now()),
      );
      this.#timers.add(timer);
    }
  }

  /** Cancels what has not started and heals what is running; resolves when everything is healed. */
  async stop(): Promise<void> {
    for (const timer of this.#timers) clearTimeout(timer);
    this.#timers.clear();
    this.#abort.abort();
    while (this.#running.size > 0) await Promise.allSettled([...this.#running]);
  }

  async #run(fault: PlannedFault): Promise<void> {
    switch (fault.kind) {
      case 'pause':
        return this.#pause(fault);
      case 'delay':
        return this.#delay(fault);
      case 'crash':
        return this.#crash(fault);
      case 'clock':
        return this.#clock(fault);
    }
  }

  /** The next holder to hit: waits up to 3 ttl for a grant. */
  async #holder(kind: NemesisKind): Promise<Target | undefined> {
    const w = await this.#ctx.nextGrant(3 * this.#ctx.ttlMs, this.#busy, this.#abort.signal);
    const target = w === undefined ? undefined : this.#ctx.workers.find((x) => x.index === w && x.process.running);
    if (!target && !this.#abort.signal.aborted)
      this.#ctx.record({ type: 'skipped', kind, why: `no worker was granted the lease within ${formatDuration(3 * this.#ctx.ttlMs)}` });
    return this.#abort.signal.aborted ? undefined : target;
  }

  async #pause(fault: PlannedFault): Promise<void> {
    const target = await this.#holder('pause');
    const pid = target?.process.pid;
    if (!target || pid === undefined) return;
    this.#busy.add(target.index);
    try {
      target.process.signal('SIGSTOP');
      this.#ctx.record({ type: 'pause', w: target.index, pid, plannedMs: fault.durationMs });
      this.#ctx.say(
        `pause   w${target.index} (pid ${pid}) SIGSTOP for ${formatDuration(fault.durationMs)}, holding the lease (ttl ${formatDuration(this.#ctx.ttlMs)})`,
      );
      await waitUntilStopped(target.process).catch(() => {});
      await this.#sleep(fault.durationMs);
    } finally {
      target.process.signal('SIGCONT');
      this.#ctx.record({ type: 'resume', w: target.index, pid });
      this.#busy.delete(target.index);
    }
  }

  async #delay(fault: PlannedFault): Promise<void> {
    const target = await this.#holder('delay');
    if (!target) return;
    const proxies = this.#ctx.proxies.get(target.index) ?? [];
    this.#busy.add(target.index);
    for (const p of proxies) p.hold();
    this.#ctx.record({ type: 'delay', w: target.index, plannedMs: fault.durationMs });
    this.#ctx.say(`delay   w${target.index}: its requests are held for ${formatDuration(fault.durationMs)}, then delivered in order`);
    try {
      await this.#sleep(fault.durationMs);
    } finally {
      let held = 0;
      for (const p of proxies) held += p.deliver();
      this.#ctx.record({ type: 'delay-end', w: target.index, heldBytes: held });
      this.#busy.delete(target.index);
    }
  }

  async #crash(fault: PlannedFault): Promise<void> {
    const server = this.#ctx.coordinator;
    if (!server?.crashable) return;
    const what = server.crashTarget;
    this.#ctx.record({ type: 'crash', what });
    await server.crash();
    this.#ctx.say(`crash   ${what} killed; restarting in ${formatDuration(fault.durationMs)}`);
    try {
      await this.#sleep(fault.durationMs);
    } finally {
      await this.restart(server, what);
    }
  }

  /** Starts the coordinator again, retrying a few times; records the outcome. */
  async restart(server: LocalServer, what: string): Promise<void> {
    let error: unknown;
    for (let attempt = 0; attempt < 3; attempt++) {
      try {
        await server.restart();
        this.#ctx.record({ type: 'restart', what });
        this.#ctx.say(`restart ${what} is back`);
        return;
      } catch (e) {
        error = e;
      }
    }
    const message = error instanceof Error ? error.message : String(error);
    this.#ctx.record({ type: 'restart', what, error: message });
    throw new Error(`could not restart ${what}: ${message}`);
  }

  async #clock(fault: PlannedFault): Promise<void> {
    const target = this.#ctx.workers.find((w) => w.index === fault.worker! + 1);
    if (!target?.process.running) return;
    target.process.send({ cmd: 'clock', rate: fault.rate! });
    this.#ctx.record({ type: 'clock-set', w: target.index, rate: fault.rate! });
    this.#ctx.say(`clock   w${target.index} runs at ×${fault.rate} for ${formatDuration(fault.durationMs)}`);
    try {
      await this.#sleep(fault.durationMs);
    } finally {
      target.process.send({ cmd: 'clock', rate: 1 });
      this.#ctx.record({ type: 'clock-set', w: target.index, rate: 1, restore: true });
    }
  }

  /** Sleeps, but returns at once when the nemesis is stopped (the caller then heals). */
  #sleep(ms: number): Promise<void> {
    return sleep(ms, { signal: this.#abort.signal });
  }
}

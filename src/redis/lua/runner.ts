import type { Conn } from '../conn/types.js';
import type { Deadlines, Watched } from '../deadline.js';
import { mapRedisError } from '../errors.js';
import { LibraryCaller } from './caller.js';
import { BATCH, type LuaLibrary, type LuaOp } from './library.js';

/**
 * Calls go out one by one while fewer than this many are in flight; beyond that they are batched,
 * and a batch is sent as soon as it has this many operations. Measured on a 2-core machine with
 * 4, 8, 16 and 64 concurrent acquire+release loops, thresholds of 1, 4, 8 and 16: 4 was the best
 * or close to it everywhere (4 loops: +40 % over batching from the first call in flight; 64 loops:
 * 63–69k pairs/s, about 1.6× end-of-tick batches). It also bounds how long one batch, which runs
 * atomically, holds the server.
 */
export const BATCH_SIZE = 4;

/** One call of an operation: its keys and arguments, typed by the operation, and what to do with its reply. */
export interface OpCall<Keys extends readonly string[], Args extends readonly string[], Reply, R> {
  readonly keys: Keys;
  readonly args: Args;
  /** A reply that arrives after the deadline (nobody waits for it any more), e.g. to give back a grant. */
  readonly onLate?: (reply: Reply) => void;
  /** Turns the reply into the caller's result, inside the settling (no further promise); may throw. */
  readonly map?: (reply: Reply) => R;
}

/** One call in flight: its request, its caller's promise and its deadline. */
interface Pending extends Watched {
  readonly name: string;
  readonly keys: readonly string[];
  readonly args: readonly string[];
  readonly resolve: (value: unknown) => void;
  readonly onLate: ((value: unknown) => void) | undefined;
  readonly map: ((value: unknown) => unknown) | undefined;
}

/**
 * Runs a {@link LuaLibrary}'s operations on one connection ({@link LibraryCaller}: FCALL, or
 * scripts), each bounded by the backend's {@link Deadlines} (without a second promise per call).
 *
 * Batching, only when the connection is busy: a call goes out on its own while fewer than
 * {@link BATCH_SIZE} are in flight (a sequential caller, or a few concurrent ones, never wait for
 * anything). Beyond that, calls are queued and sent together as one `batch` call — one command, one
 * write and one reply for all of them, executed in the order they were made — as soon as
 * {@link BATCH_SIZE} are queued, the rest at the end of the current tick. Small batches sent early
 * keep Redis working on one while the next is being made; waiting for the end of the tick instead
 * turned 64 concurrent callers into lockstep waves (one batch of 64 in flight, Node and Redis taking
 * turns, about 40 % slower), and batching from the first call in flight made 4 concurrent callers a
 * third slower than no batching at all. Off on a Cluster (the keys of a batch would span slots).
 */
export class LuaRunner {
  readonly #caller: LibraryCaller;
  readonly #deadlines: Deadlines;
  readonly #backend: string;
  readonly #batching: boolean;
  #inFlight = 0;
  #queue: Pending[] = [];
  #scheduled = false;

  constructor(conn: Conn, lib: LuaLibrary, options: { readonly deadlines: Deadlines; readonly backend: string; readonly batching: boolean }) {
    this.#caller = new LibraryCaller(conn, lib);
    this.#deadlines = options.deadlines;
    this.#backend = options.backend;
    this.#batching = options.batching && !conn.isCluster;
  }

  /** True while operations go through FCALL (false after falling back to scripts). */
  get usesFunctions(): boolean {
    return this.#caller.usesFunctions;
  }

  /**
   * Runs one operation. Resolves with `map(reply)` (the reply itself without `map`); rejects with a
   * LeaseholdError (`mapRedisError`; also what `map` throws), or BackendUnavailableError after the
   * deadline; a reply after that goes to `onLate`.
   */
  run<Keys extends readonly string[], Args extends readonly string[], Reply, R = Reply>(
    op: LuaOp<Keys, Args, Reply>,
    call: OpCall<Keys, Args, Reply, R>,
  ): Promise<R> {
    return new Promise<R>((resolve, reject) => {
      const pending: Pending = {
        at: 0,
        what: op.what,
        reject,
        live: true,
        prev: undefined,
        next: undefined,
        name: op.name,
        keys: call.keys,
        args: call.args,
        resolve: resolve as (value: unknown) => void,
        onLate: call.onLate as ((value: unknown) => void) | undefined,
        map: call.map as ((value: unknown) => unknown) | undefined,
      };
      this.#deadlines.watch(pending);
      if (!this.#batching || (this.#inFlight < BATCH_SIZE && this.#queue.length === 0)) {
        this.#one(pending);
        return;
      }
      const queue = this.#queue;
      queue.push(pending);
      if (queue.length >= BATCH_SIZE) {
        this.#queue = [];
        this.#batch(queue);
      } else if (!this.#scheduled) {
        this.#scheduled = true;
        process.nextTick(this.#flush);
      }
    });
  }

  readonly #flush = (): void => {
    this.#scheduled = false;
    const queue = this.#queue;
    if (queue.length === 0) return;
    this.#queue = [];
    this.#batch(queue);
  };

  #one(p: Pending): void {
    this.#inFlight++;
    this.#caller.send(p.name, p.keys, p.args).then(
      (value) => {
        this.#inFlight--;
        this.#settle(p, value);
      },
      (error: unknown) => {
        this.#inFlight--;
        this.#caller.recover(error, p.name, p.keys, p.args).then(
          (value) => this.#settle(p, value),
          (e: unknown) => this.#fail(p, e),
        );
      },
    );
  }

  #batch(ps: Pending[]): void {
    if (ps.length === 1) return this.#one(ps[0]!);
    const keys: string[] = [];
    const args: string[] = [String(ps.length)];
    for (const p of ps) {
      args.push(p.name, String(p.keys.length), String(p.args.length));
      for (const k of p.keys) keys.push(k);
      for (const a of p.args) args.push(a);
    }
    const answer = (replies: unknown): void => {
      const all = Array.isArray(replies) ? replies : [];
      for (let i = 0; i < ps.length; i++) {
        const r: unknown = all[i];
        if (r instanceof Error) this.#fail(ps[i]!, r);
        else if (i < all.length) this.#settle(ps[i]!, r);
        else this.#fail(ps[i]!, new Error(`batch: ${all.length} replies for ${ps.length} operations`));
      }
    };
    const failAll = (error: unknown): void => {
      for (const p of ps) this.#fail(p, error);
    };
    this.#inFlight++;
    this.#caller.send(BATCH, keys, args).then(
      (replies) => {
        this.#inFlight--;
        answer(replies);
      },
      (error: unknown) => {
        this.#inFlight--;
        this.#caller.recover(error, BATCH, keys, args).then(answer, failAll);
      },
    );
  }

  #settle(p: Pending, value: unknown): void {
    if (!p.live) p.onLate?.(value);
    else {
      this.#deadlines.unwatch(p);
      if (p.map === undefined) p.resolve(value);
      else {
        let result: unknown;
        try {
          result = p.map(value);
        } catch (error) {
          p.reject(mapRedisError(this.#backend, p.what, error));
          return;
        }
        p.resolve(result);
      }
    }
  }

  #fail(p: Pending, error: unknown): void {
    if (p.live) {
      this.#deadlines.unwatch(p);
      p.reject(mapRedisError(this.#backend, p.what, error));
    }
  }
}

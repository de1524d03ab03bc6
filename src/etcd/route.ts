/**
 * Requests to the leader. etcd serves a write sent to a follower by forwarding it to the leader and
 * answering once the follower has applied it, which is one more round after the leader's commit; a
 * watch on a follower likewise sees a change only after that member applies it. So a backend built
 * from several hosts keeps a client per member and sends its requests and watches to the member
 * that leads (the one a majority of members name in `Maintenance.Status`, looked up at the start,
 * every few seconds, and soon after a request to it fails). A request that fails for a reason
 * another member may not have (unreachable, deadline, no leader) goes to the next member, up to
 * three; a member that let a request run into its deadline (frozen, cut off) is tried last until
 * it answers a `Status` again, so one frozen member costs one deadline, not one per request.
 * Streams (watches, keep-alives) go to the leader, or to etcd3's client of every member while the
 * leader is unknown: it moves a broken stream to another member by itself.
 * Measured with eight contending workers on three members: about +8 % sections/s (bench/README.md).
 */
import { Etcd3, GRPCDeadlineExceededError, castGrpcError, isRecoverableError, type IOptions } from './driver.js';
import { isA, type EtcdClient } from './rpc.js';

/** How often the leader is looked up again: a new leader after an election is found within this. */
const REFRESH_MS = 5_000;
/** After a failed request to the leader, or a look-up that found none, the next look-up waits this long (an election takes ~1 s with default timings). */
const RETRY_AFTER_FAILURE_MS = 200;
/** Members one request tries at most, as the all-members client does (rpc.ts). */
const ATTEMPTS = 3;

export class LeaderRoute {
  /** One client per member, each of that member alone. */
  readonly #members: Etcd3[];
  #leader: Etcd3 | undefined;
  /** Members whose last request ran into its deadline (frozen, cut off): tried last until a `Status` gets through. */
  readonly #unresponsive = new Set<Etcd3>();
  #refreshing: Promise<void> | undefined;
  #retry: ReturnType<typeof setTimeout> | undefined;
  readonly #interval: ReturnType<typeof setInterval>;
  #closed = false;
  /** What the backend calls. */
  readonly client: EtcdClient;

  constructor(
    /** The client of every member (etcd3's pool, which reconnects a broken stream to another member): streams go there while the leader is unknown. */
    private readonly pool: Etcd3,
    hosts: readonly string[],
    memberOptions: (host: string) => IOptions,
    private readonly timeoutMs: number,
  ) {
    this.#members = hosts.map((h) => new Etcd3(memberOptions(h)));
    this.#interval = setInterval(() => void this.refresh(), REFRESH_MS);
    this.#interval.unref();
    void this.refresh();
    const route =
      <A extends unknown[], R>(call: (c: EtcdClient, ...args: A) => Promise<R>) =>
      (...args: A): Promise<R> =>
        this.#call(call, args);
    this.client = {
      kv: {
        txn: route((c, req: Parameters<EtcdClient['kv']['txn']>[0], opts?: Parameters<EtcdClient['kv']['txn']>[1]) => c.kv.txn(req, opts)),
        range: route((c, req: Parameters<EtcdClient['kv']['range']>[0], opts?: Parameters<EtcdClient['kv']['range']>[1]) => c.kv.range(req, opts)),
      },
      leaseClient: {
        leaseGrant: route((c, req: Parameters<EtcdClient['leaseClient']['leaseGrant']>[0], opts?: Parameters<EtcdClient['leaseClient']['leaseGrant']>[1]) =>
          c.leaseClient.leaseGrant(req, opts),
        ),
        leaseRevoke: route((c, req: Parameters<EtcdClient['leaseClient']['leaseRevoke']>[0], opts?: Parameters<EtcdClient['leaseClient']['leaseRevoke']>[1]) =>
          c.leaseClient.leaseRevoke(req, opts),
        ),
        leaseTimeToLive: route(
          (c, req: Parameters<EtcdClient['leaseClient']['leaseTimeToLive']>[0], opts?: Parameters<EtcdClient['leaseClient']['leaseTimeToLive']>[1]) =>
            c.leaseClient.leaseTimeToLive(req, opts),
        ),
        // One stream (keepAliveOnce tries again when it fails).
        leaseKeepAlive: (opts?: Parameters<EtcdClient['leaseClient']['leaseKeepAlive']>[0]) => {
          const c = this.#streams();
          return c.leaseClient.leaseKeepAlive(opts).then(
            (stream) => {
              stream.on('error', (error: Error) => this.#failed(c, castGrpcError(error)));
              return stream;
            },
            (error: unknown) => {
              this.#failed(c, error);
              throw error;
            },
          );
        },
      },
      watch: () => this.#streams().watch(),
    };
  }

  /** Looks the leader up again (one `Status` per member, in parallel). */
  refresh(): Promise<void> {
    if (this.#closed) return Promise.resolve();
    this.#refreshing ??= (async () => {
      try {
        const answers = await Promise.all(
          this.#members.map((m) => m.maintenance.status({ deadline: Date.now() + Math.min(this.timeoutMs, 1_000) }).catch(() => undefined)),
        );
        if (this.#closed) return;
        answers.forEach((a, i) => {
          if (a) this.#unresponsive.delete(this.#members[i]!);
        });
        const i = agreedLeader(answers);
        this.#leader = i === undefined ? undefined : this.#members[i];
        // No leader yet (an election, a member frozen): look again soon rather than at the next round.
        if (this.#leader === undefined) this.#lookSoon();
      } finally {
        this.#refreshing = undefined;
      }
    })();
    return this.#refreshing;
  }

  close(): void {
    this.#closed = true;
    clearInterval(this.#interval);
    if (this.#retry) clearTimeout(this.#retry);
    this.#leader = undefined;
    for (const m of this.#members) m.close();
  }

  /** Where a stream goes: the leader, or the pool (which moves a broken stream to another member) while it is unknown or did not answer in time. */
  #streams(): EtcdClient {
    return this.#leader && !this.#unresponsive.has(this.#leader) ? this.#leader : this.pool;
  }

  /** Where a request goes, in order: the leader, the other members (in a random order), then those that did not answer in time. */
  #order(): Etcd3[] {
    const rest = this.#members.filter((m) => m !== this.#leader);
    for (let i = rest.length - 1; i > 0; i--) {
      const j = Math.floor(Math.random() * (i + 1));
      [rest[i], rest[j]] = [rest[j]!, rest[i]!];
    }
    const order = this.#leader ? [this.#leader, ...rest] : rest;
    return [...order.filter((m) => !this.#unresponsive.has(m)), ...order.filter((m) => this.#unresponsive.has(m))];
  }

  /**
   * Tries up to three members in `#order`, each with its own deadline. A request whose answer was
   * lost may have been applied; every request the backend makes can be repeated (see backend.ts).
   */
  async #call<A extends unknown[], R>(call: (c: EtcdClient, ...args: A) => Promise<R>, args: A): Promise<R> {
    const order = this.#order().slice(0, ATTEMPTS);
    let last: unknown;
    for (const m of order) {
      try {
        return await call(m, ...args);
      } catch (error) {
        if (!(error instanceof Error && isRecoverableError(error))) throw error;
        last = error;
        this.#failed(m, error);
      }
    }
    throw last;
  }

  /** After a failure another member may not have: a leader is looked up again, a member past its deadline goes to the back. */
  #failed(m: EtcdClient, error: unknown): void {
    if (!(error instanceof Error && isRecoverableError(error))) return;
    if (m === this.pool) return;
    if (isA(error, GRPCDeadlineExceededError)) this.#unresponsive.add(m as Etcd3);
    if (m !== this.#leader) return;
    this.#leader = undefined;
    this.#lookSoon();
  }

  #lookSoon(): void {
    if (this.#retry || this.#closed) return;
    this.#retry = setTimeout(() => {
      this.#retry = undefined;
      void this.refresh();
    }, RETRY_AFTER_FAILURE_MS);
    this.#retry.unref();
  }
}

/**
 * Which member leads, from every member's `Status` (undefined: it did not answer): the one a
 * majority of all members name, if it answered too. A member cut off from the others may still
 * think it leads; the others have a new leader by then. Undefined when no leader has a majority.
 */
export function agreedLeader(answers: readonly ({ leader: string; header: { member_id: string } } | undefined)[]): number | undefined {
  const votes = new Map<string, number>();
  for (const a of answers) if (a && a.leader !== '0') votes.set(a.leader, (votes.get(a.leader) ?? 0) + 1);
  const agreed = [...votes].find(([, n]) => n > answers.length / 2)?.[0];
  const i = agreed === undefined ? -1 : answers.findIndex((a) => a?.header.member_id === agreed);
  return i >= 0 ? i : undefined;
}

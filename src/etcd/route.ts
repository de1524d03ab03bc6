/**
 * Requests to the leader. etcd serves a write sent to a follower by forwarding it to the leader and
 * answering once the follower has applied it, which is one more round after the leader's commit; a
 * watch on a follower likewise sees a change only after that member applies it. So a backend built
 * from several hosts sends its requests and watches to the member that leads (found with
 * `Maintenance.Status` on every member, at the start and every few seconds), and falls back to its
 * client of every member (which fails over between them) while the leader is unknown or when a
 * request to it fails for a reason that another member may not have (unreachable, deadline, no
 * leader). Measured with eight contending workers on a three-member cluster: hand-off p50 3.7–4.0 →
 * 2.7–3.1 ms, sections/s +30–50 % (bench/README.md).
 */
import { Etcd3, castGrpcError, isRecoverableError, type IOptions } from 'etcd3';
import type { EtcdClient } from './rpc.js';

/** How often the leader is looked up again: a new leader after an election is found within this. */
const REFRESH_MS = 5_000;
/** After a failed request to the leader, the first look-up waits this long (an election takes ~1 s with default timings). */
const RETRY_AFTER_FAILURE_MS = 200;

export class LeaderRoute {
  /** One client per member, each of that member alone: for `Status`, and the leader's for everything. */
  readonly #members: Etcd3[];
  #leader: Etcd3 | undefined;
  #refreshing: Promise<void> | undefined;
  #retry: ReturnType<typeof setTimeout> | undefined;
  readonly #interval: ReturnType<typeof setInterval>;
  #closed = false;
  /** What the backend calls: requests go to the leader's client when it is known, else to `pool`. */
  readonly client: EtcdClient;

  constructor(
    private readonly pool: Etcd3,
    hosts: readonly string[],
    memberOptions: (host: string) => IOptions,
    private readonly timeoutMs: number,
  ) {
    this.#members = hosts.map((h) => new Etcd3(memberOptions(h)));
    this.#interval = setInterval(() => void this.refresh(), REFRESH_MS);
    this.#interval.unref();
    void this.refresh();
    const route = <A extends unknown[], R>(call: (c: EtcdClient, ...args: A) => Promise<R>) => (...args: A): Promise<R> => this.#call(call, args);
    this.client = {
      kv: {
        txn: route((c, req: Parameters<EtcdClient['kv']['txn']>[0], opts?: Parameters<EtcdClient['kv']['txn']>[1]) => c.kv.txn(req, opts)),
        range: route((c, req: Parameters<EtcdClient['kv']['range']>[0], opts?: Parameters<EtcdClient['kv']['range']>[1]) => c.kv.range(req, opts)),
      },
      leaseClient: {
        leaseGrant: route((c, req: Parameters<EtcdClient['leaseClient']['leaseGrant']>[0], opts?: Parameters<EtcdClient['leaseClient']['leaseGrant']>[1]) => c.leaseClient.leaseGrant(req, opts)),
        leaseRevoke: route((c, req: Parameters<EtcdClient['leaseClient']['leaseRevoke']>[0], opts?: Parameters<EtcdClient['leaseClient']['leaseRevoke']>[1]) => c.leaseClient.leaseRevoke(req, opts)),
        leaseTimeToLive: route((c, req: Parameters<EtcdClient['leaseClient']['leaseTimeToLive']>[0], opts?: Parameters<EtcdClient['leaseClient']['leaseTimeToLive']>[1]) => c.leaseClient.leaseTimeToLive(req, opts)),
        leaseKeepAlive: (opts?: Parameters<EtcdClient['leaseClient']['leaseKeepAlive']>[0]) => {
          const c = this.current;
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
      watch: () => this.current.watch(),
    };
  }

  /** The client requests go to now. */
  get current(): EtcdClient {
    return this.#leader ?? this.pool;
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
        const i = agreedLeader(answers);
        this.#leader = i === undefined ? undefined : this.#members[i];
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

  async #call<A extends unknown[], R>(call: (c: EtcdClient, ...args: A) => Promise<R>, args: A): Promise<R> {
    const c = this.current;
    if (c === this.pool) return call(c, ...args);
    try {
      return await call(c, ...args);
    } catch (error) {
      if (!this.#failed(c, error)) throw error;
      // Another member may answer: the pool tries up to three. A write whose answer was lost may
      // have been applied; every request the backend makes can be repeated (see backend.ts).
      return call(this.pool, ...args);
    }
  }

  /** Stops using the leader's client after a failure another member may not have; true when that was the case. */
  #failed(c: EtcdClient, error: unknown): boolean {
    if (c !== this.#leader || !(error instanceof Error && isRecoverableError(error))) return false;
    this.#leader = undefined;
    if (!this.#retry && !this.#closed) {
      this.#retry = setTimeout(() => {
        this.#retry = undefined;
        void this.refresh();
      }, RETRY_AFTER_FAILURE_MS);
      this.#retry.unref();
    }
    return true;
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

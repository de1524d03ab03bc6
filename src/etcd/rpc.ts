/**
 * The few etcd calls the backend makes, each with a deadline, and the mapping of etcd3's errors to
 * leasehold's (by error class and gRPC status code, never by message text).
 */
import {
  ClientClosedError,
  EtcdLeaseInvalidError,
  GRPCInvalidArgumentError,
  GRPCOutOfRangeError,
  castGrpcError,
  isRecoverableError,
  type Etcd3,
  type ICompare,
  type IKeyValue,
  type IOptions,
  type IRequestOp,
  type ITxnResponse,
} from './driver.js';
import { BackendUnavailableError, ClosedError, InvalidArgumentError, LeaseholdError } from '../core/errors.js';

/** What the backend uses of an `Etcd3` client (a root client, not a namespace: use the `prefix` option instead). */
export interface EtcdClient {
  readonly kv: Pick<Etcd3['kv'], 'txn' | 'range'>;
  readonly leaseClient: Pick<Etcd3['leaseClient'], 'leaseGrant' | 'leaseRevoke' | 'leaseTimeToLive' | 'leaseKeepAlive'>;
  watch(): ReturnType<Etcd3['watch']>;
}

/**
 * Call options with a deadline `ms` after each attempt starts. etcd3 retries a failed call on
 * another member with the same options object; a getter gives every attempt its own deadline
 * (a fixed one would already have passed). gRPC takes wall-clock deadlines: the only Date.now here.
 */
export function deadline(ms: number): { readonly deadline: number } {
  return {
    get deadline() {
      return Date.now() + ms;
    },
  };
}

/** What a fault-handling policy hands the call it runs (see `ownClientOptions`). */
const POLICY_CONTEXT: { readonly signal: AbortSignal } = Object.freeze({ signal: new AbortController().signal });

/** Attempts of one call, each on the next member (in a random order per call). */
const ATTEMPTS = 3;
type FaultHandling = NonNullable<IOptions['faultHandling']>;
type Policy = NonNullable<FaultHandling['global']>;
type Backoff = NonNullable<FaultHandling['watchBackoff']>;

/**
 * Options of the client the backend builds from `hosts`. Fault handling differs from etcd3's
 * defaults on purpose: etcd3 opens a member's circuit breaker for 5 s after three failures in a
 * row, and during a leader election every member fails a few requests (deadline, no leader), so
 * all breakers open together and every request is refused for 5 s after the election is over
 * (seen in the failover test). Here a call simply tries up to three members, each attempt with its
 * own deadline; a dead member refuses connections at once, so trying it costs nothing. Watch
 * streams reconnect after 50 ms, doubling up to 1 s (etcd3: up to 30 s), since core's wake-ups
 * ride on them. (etcd3 calls only `execute` on policies and `duration`/`next` on backoffs.)
 */
export function ownClientOptions(hosts: readonly string[], attempts = ATTEMPTS): IOptions {
  // etcd3 never reads the policy's signal: one that never aborts serves every call (an
  // AbortController per call and policy, and a microtask before each, were measurable per request).
  const run = <T>(fn: (context: { signal: AbortSignal }) => PromiseLike<T> | T): Promise<T> => {
    try {
      return Promise.resolve(fn(POLICY_CONTEXT));
    } catch (error) {
      return Promise.reject(error);
    }
  };
  const passThrough = { execute: run } as unknown as Policy;
  const retry = {
    async execute<T>(fn: (context: { signal: AbortSignal }) => PromiseLike<T> | T): Promise<T> {
      for (let attempt = 1; ; attempt++) {
        try {
          return await run(fn);
        } catch (error) {
          if (attempt >= attempts || !(typeof error === 'object' && error !== null && isRecoverableError(error as Error))) throw error;
        }
      }
    },
  } as unknown as Policy;
  const backoff = (ms: number): Backoff => ({ duration: ms, next: () => backoff(Math.min(ms * 2, 1_000)) }) as unknown as Backoff;
  return { hosts: [...hosts], faultHandling: { host: () => passThrough, global: retry, watchBackoff: backoff(50) } };
}

const b = (s: string): Buffer => Buffer.from(s);

/** Request ops of a transaction, named after what they do. */
export const op = {
  put: (key: string, value: string, lease: string): IRequestOp => ({ request_put: { key: b(key), value: b(value), lease } }),
  get: (key: string): IRequestOp => ({ request_range: { key: b(key) } }),
  getRange: (key: string, end: Buffer): IRequestOp => ({ request_range: { key: b(key), range_end: end } }),
  del: (key: string): IRequestOp => ({ request_delete_range: { key: b(key), prev_kv: true } }),
  /** A nested transaction (etcd ≥ 3.3). */
  txn: (compare: ICompare[], success: IRequestOp[], failure: IRequestOp[] = []): IRequestOp => ({ request_txn: { compare, success, failure } }),
};

/** Comparisons, each over one key or (with `end`) every key of a range (an empty range compares as revision 0). */
export const cmp = {
  /** The key (or every key of the range) was created at `rev`; 0 means absent / range empty. */
  createdAt: (key: string, rev: bigint, end?: Buffer): ICompare => ({
    key: b(key),
    range_end: end,
    target: 'Create',
    result: 'Equal',
    create_revision: rev.toString(),
  }),
  /** Every key of the range was created after `rev` (false for an empty range). */
  createdAfter: (key: string, rev: bigint, end?: Buffer): ICompare => ({
    key: b(key),
    range_end: end,
    target: 'Create',
    result: 'Greater',
    create_revision: rev.toString(),
  }),
  /** Every key of the range was created at or before `rev` (true for an empty range). */
  createdBy: (key: string, rev: bigint, end?: Buffer): ICompare => ({
    key: b(key),
    range_end: end,
    target: 'Create',
    result: 'Less',
    create_revision: (rev + 1n).toString(),
  }),
  /** Every key of the range was last modified at or before `rev` (true for an empty range). */
  modifiedBy: (key: string, rev: bigint, end?: Buffer): ICompare => ({
    key: b(key),
    range_end: end,
    target: 'Mod',
    result: 'Less',
    mod_revision: (rev + 1n).toString(),
  }),
};

/** Every key-value read by the transaction's range ops, in op order. */
export function readKvs(response: ITxnResponse): IKeyValue[] {
  const out: IKeyValue[] = [];
  for (const r of response.responses) if (r.response_range) out.push(...r.response_range.kvs);
  return out;
}

/** Keys deleted by the transaction's delete ops (their previous values), in op order. */
export function deletedKvs(response: ITxnResponse): IKeyValue[] {
  const out: IKeyValue[] = [];
  for (const r of response.responses) if (r.response_delete_range) out.push(...r.response_delete_range.prev_kvs);
  return out;
}

/**
 * One LeaseKeepAlive round for `ids`, in order, on one stream: the server handles a stream's
 * requests one after the other, so a later id is refreshed no earlier than an earlier one.
 * Resolves with each id's new TTL in seconds (0: the lease is gone).
 */
export async function keepAliveOnce(client: EtcdClient, ids: readonly string[], timeoutMs: number): Promise<Map<string, number>> {
  // Each attempt opens its stream on a member picked at random: a dead member fails at once, and
  // the next attempt goes elsewhere (a keep-alive is idempotent).
  for (let attempt = 1; ; attempt++) {
    try {
      return await keepAliveStream(client, ids, timeoutMs);
    } catch (error) {
      if (attempt >= ATTEMPTS || !(error instanceof Error && isRecoverableError(error))) throw error;
    }
  }
}

async function keepAliveStream(client: EtcdClient, ids: readonly string[], timeoutMs: number): Promise<Map<string, number>> {
  const stream = await client.leaseClient.leaseKeepAlive({ deadline: Date.now() + timeoutMs });
  return new Promise<Map<string, number>>((resolve, reject) => {
    const ttls = new Map<string, number>();
    let settled = false;
    const finish = (error?: unknown): void => {
      if (settled) return;
      settled = true;
      if (error === undefined) resolve(ttls);
      else reject(error);
      try {
        stream.end();
      } catch {
        // already closed
      }
    };
    stream.on('data', (res) => {
      ttls.set(String(res.ID), Number(res.TTL));
      if (ttls.size >= ids.length) finish();
    });
    stream.on('error', (error: Error) => finish(castGrpcError(error)));
    stream.on('end', () => finish(new BackendUnavailableError('etcd', 'keep-alive stream ended before every answer arrived')));
    for (const id of ids) stream.write({ ID: id });
  });
}

/** A lease that is gone (expired or revoked) or never existed. */
export function isLeaseNotFound(error: unknown): boolean {
  return isA(error, EtcdLeaseInvalidError);
}

/** Revokes a lease, ignoring "not found" (already expired or revoked). */
export async function revoke(client: EtcdClient, id: string, timeoutMs: number): Promise<void> {
  try {
    await client.leaseClient.leaseRevoke({ ID: id }, deadline(timeoutMs));
  } catch (error) {
    if (!isLeaseNotFound(error)) throw error;
  }
}

/**
 * etcd3's errors as leasehold errors: input etcd refuses (gRPC INVALID_ARGUMENT, OUT_OF_RANGE: a
 * request too large, too many operations) is an InvalidArgumentError; a closed client is a
 * ClosedError, like any use after close; everything else (unreachable, deadline, no leader,
 * overloaded) is a retryable BackendUnavailableError.
 */
export function mapError(what: string, error: unknown): LeaseholdError {
  if (error instanceof LeaseholdError) return error;
  const detail = error instanceof Error ? error.message : String(error);
  if (isA(error, ClientClosedError)) return new ClosedError('etcd client', { cause: error });
  if (isA(error, GRPCInvalidArgumentError) || isA(error, GRPCOutOfRangeError)) {
    return new InvalidArgumentError('request', `etcd refused ${what}: ${detail}`, { cause: error });
  }
  return new BackendUnavailableError('etcd', `${what} failed: ${detail}`, { cause: error });
}

/**
 * `instanceof`, also across two copies of the etcd3 package (a client the user built with their
 * own copy): then the class is recognised by its constructor's name.
 */
export function isA(error: unknown, cls: new (...args: never[]) => Error): boolean {
  if (error instanceof cls) return true;
  return typeof error === 'object' && error !== null && (error as { constructor?: { name?: string } }).constructor?.name === cls.name;
}

/**
 * The few etcd calls the backend makes, each with a deadline, and the mapping of etcd3's errors to
 * leasehold's (by error class and gRPC status code, never by message text).
 */
import {
  ClientClosedError, EtcdLeaseInvalidError, GRPCInvalidArgumentError, GRPCOutOfRangeError, castGrpcError,
  type Etcd3, type ICompare, type IKeyValue, type IRequestOp, type ITxnResponse,
} from 'etcd3';
import { BackendUnavailableError, InvalidArgumentError, LeaseholdError } from '../core/errors.js';

/** What the backend uses of an `Etcd3` client (a root client, not a namespace: use the `prefix` option instead). */
export type EtcdClient = Pick<Etcd3, 'kv' | 'leaseClient' | 'watch'>;

/** A gRPC deadline `ms` from now (gRPC takes wall-clock deadlines; this is the only use of Date.now here). */
export function deadline(ms: number): { deadline: number } {
  return { deadline: Date.now() + ms };
}

const b = (s: string): Buffer => Buffer.from(s);

/** Request ops of a transaction, named after what they do. */
export const op = {
  put: (key: string, value: string, lease: string): IRequestOp => ({ request_put: { key: b(key), value: b(value), lease } }),
  get: (key: string): IRequestOp => ({ request_range: { key: b(key) } }),
  getRange: (key: string, end: Buffer): IRequestOp => ({ request_range: { key: b(key), range_end: end } }),
  del: (key: string): IRequestOp => ({ request_delete_range: { key: b(key), prev_kv: true } }),
};

/** Comparisons, each over one key or (with `end`) every key of a range (an empty range compares as revision 0). */
export const cmp = {
  /** The key (or every key of the range) was created at `rev`; 0 means absent / range empty. */
  createdAt: (key: string, rev: bigint, end?: Buffer): ICompare => ({
    key: b(key), range_end: end, target: 'Create', result: 'Equal', create_revision: rev.toString(),
  }),
  /** Every key of the range was created after `rev` (false for an empty range). */
  createdAfter: (key: string, rev: bigint, end?: Buffer): ICompare => ({
    key: b(key), range_end: end, target: 'Create', result: 'Greater', create_revision: rev.toString(),
  }),
  /** Every key of the range was last modified at or before `rev` (true for an empty range). */
  modifiedBy: (key: string, rev: bigint, end?: Buffer): ICompare => ({
    key: b(key), range_end: end, target: 'Mod', result: 'Less', mod_revision: (rev + 1n).toString(),
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
  const stream = await client.leaseClient.leaseKeepAlive(deadline(timeoutMs));
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
 * request too large, too many operations) is an InvalidArgumentError; a closed client is an
 * InvalidArgumentError like any use after close; everything else (unreachable, deadline, no
 * leader, overloaded) is a retryable BackendUnavailableError.
 */
export function mapError(what: string, error: unknown): LeaseholdError {
  if (error instanceof LeaseholdError) return error;
  const detail = error instanceof Error ? error.message : String(error);
  if (isA(error, ClientClosedError)) return new InvalidArgumentError('backend', `the etcd client was closed (${what})`, { cause: error });
  if (isA(error, GRPCInvalidArgumentError) || isA(error, GRPCOutOfRangeError)) {
    return new InvalidArgumentError('request', `etcd refused ${what}: ${detail}`, { cause: error });
  }
  return new BackendUnavailableError('etcd', `${what} failed: ${detail}`, { cause: error });
}

/**
 * `instanceof`, also across two copies of the etcd3 package (a client the user built with their
 * own copy): then the class is recognised by its constructor's name.
 */
function isA(error: unknown, cls: new (...args: never[]) => Error): boolean {
  if (error instanceof cls) return true;
  return typeof error === 'object' && error !== null && (error as { constructor?: { name?: string } }).constructor?.name === cls.name;
}

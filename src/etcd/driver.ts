/**
 * etcd3, the etcd driver (and gRPC under it): an optional peer dependency, loaded here and nowhere
 * else in src/etcd (import its values from './driver.js' instead of 'etcd3'; type-only imports from
 * 'etcd3' are fine, they are erased). Without it, importing `leasehold/etcd` throws an
 * InvalidArgumentError that says to `npm install etcd3`.
 */
import { createRequire } from 'node:module';
import type * as Etcd3Module from 'etcd3';
import { requirePeer } from '../core/peer.js';

const driver = requirePeer<typeof Etcd3Module>(createRequire(import.meta.url), 'etcd3', 'leasehold/etcd');

export const {
  Etcd3,
  ClientClosedError,
  EtcdLeaseInvalidError,
  GRPCDeadlineExceededError,
  GRPCInvalidArgumentError,
  GRPCOutOfRangeError,
  castGrpcError,
  isRecoverableError,
} = driver;
export type Etcd3 = Etcd3Module.Etcd3;
export type ClientClosedError = Etcd3Module.ClientClosedError;
export type EtcdLeaseInvalidError = Etcd3Module.EtcdLeaseInvalidError;
export type GRPCDeadlineExceededError = Etcd3Module.GRPCDeadlineExceededError;
export type GRPCInvalidArgumentError = Etcd3Module.GRPCInvalidArgumentError;
export type GRPCOutOfRangeError = Etcd3Module.GRPCOutOfRangeError;
export type { ICompare, IEvent, IKeyValue, IOptions, IRequestOp, ITxnResponse, IWatchResponse, Watcher } from 'etcd3';

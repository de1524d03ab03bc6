export { etcdBackend } from './backend.js';
export { ETCD_DEFAULTS, type EtcdBackendOptions } from './options.js';
export type { EtcdClient } from './rpc.js';

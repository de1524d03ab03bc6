export { etcdBackend, ETCD_DEFAULTS, type EtcdBackendOptions } from './backend.js';
export type { EtcdClient } from './rpc.js';

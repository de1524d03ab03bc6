/**
 * leasehold/metrics: Prometheus metrics (prom-client) and OpenTelemetry spans (@opentelemetry/api)
 * over a `Locks`' events and a fence's writes. Both packages are optional peer dependencies, loaded
 * when a function that needs one is first called.
 */
export { instrumentLocks, instrumentFence, DURATION_BUCKETS, type InstrumentLocksOptions, type InstrumentFenceOptions } from './prometheus.js';
export { traceLocks, traceFence, type TraceLocksOptions, type TraceFenceOptions } from './tracing.js';

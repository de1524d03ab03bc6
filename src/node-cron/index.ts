/**
 * leasehold/node-cron: a node-cron 4 `RunCoordinator` that runs each fire time of a distributed task
 * once across all instances, each run holding a lease whose token fences its writes. node-cron is an
 * optional peer dependency; this entry point uses only its interface, never its code.
 */
export { cronCoordinator, type CronCoordinator, type CronCoordinatorOptions, type CronTaskContext, type RunCoordinator } from './coordinator.js';

/**
 * `leasehold/testing`: the conformance suites every leasehold backend and fence passes, for
 * vitest. A backend of your own (an object implementing `Backend` from 'leasehold') or a fence
 * (implementing `Fence`) registers the same suite the built-in ones run, in one of its test files:
 *
 * ```ts
 * import { backendConformance, fenceConformance } from 'leasehold/testing';
 *
 * backendConformance('my store', async () => {
 *   const server = await startMyServer();
 *   return {
 *     connect: async () => myBackend({ url: server.url }), // each call: a new client, as another process would be
 *     prefix: `conf-${process.pid}`,                       // keys of this run only
 *     ttlMs: 400,                                          // the base ttl of the timing tests (at least your minimum)
 *     restart: () => server.restart(),                     // optional: keeps its data; I1 across the restart
 *     cleanup: () => server.stop(),
 *   };
 * });
 * ```
 *
 * Each suite is one `describe` block whose harness is made in `beforeAll` and cleaned up in
 * `afterAll`. What a backend does not promise is reported as skipped, with the reason, never as
 * passed: the fair-queue test unless `capabilities.fair`, the kept-places test unless
 * `capabilities.keepablePlaces`, the sessions test unless the backend has
 * `sessions`, the coordinator restart unless the harness has `restart`, and for fences the undo
 * test unless `transactional`, the `requireSequencer` test unless the harness has `fenceWith`.
 *
 * vitest (3 or later) is an optional peer dependency of leasehold: only this entry point imports
 * it, so install it where you run the suites; the other entry points never load it.
 */
export { backendConformance, type BackendHarness } from './backend.js';
export { fenceConformance, type FenceHarness } from './fence.js';

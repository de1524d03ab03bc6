/**
 * The lock service (`leasehold serve`): the app factory, the listening server, the auth file.
 * Used by the command line (src/cli/serve.ts); later route modules (events, metrics, the dashboard)
 * take the same {@link ServeContext}.
 */
export { createLockServer, SERVE_DEFAULTS, type LockServerApp, type LockServerOptions } from './app.js';
export { ANONYMOUS, loadAuthFile, parseAuthConfig, type AuthConfig, type Caller } from './auth.js';
export { bounded, callerOf, type RouteModule, type ServeContext } from './context.js';
export { probeBackend } from './routes/health.js';
export { isLoopback, startLockServer, type RunningLockServer, type StartLockServerOptions } from './start.js';

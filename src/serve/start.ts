import { isIP } from 'node:net';
import { InvalidArgumentError } from '../core/errors.js';
import { createLockServer, type LockServerApp, type LockServerOptions } from './app.js';

export interface StartLockServerOptions extends LockServerOptions {
  /** @default '127.0.0.1' */
  readonly host?: string;
  /** 0 picks a free port. @default 7070 */
  readonly port?: number;
}

/** A listening lock server. */
export interface RunningLockServer {
  /** `http://host:port` (or `https://`), without a trailing slash. */
  readonly url: string;
  readonly app: LockServerApp;
  /** Ends long polls (503 CLOSED), stops listening, then closes the backend if the server opened it. */
  close(): Promise<void>;
}

/**
 * Builds the app and listens. Without `auth` every request is the same anonymous caller, so the
 * server refuses any address but loopback (`InvalidArgumentError` naming `host`): anyone who can
 * reach it could release anyone's lease.
 */
export async function startLockServer(options: StartLockServerOptions): Promise<RunningLockServer> {
  const { host = '127.0.0.1', port = 7070, ...rest } = options;
  if (!rest.auth && !isLoopback(host))
    throw new InvalidArgumentError('host', `without --auth the lock service listens on loopback only (127.0.0.1, ::1, localhost), not ${JSON.stringify(host)}`);
  if (!Number.isInteger(port) || port < 0 || port > 65_535) throw new InvalidArgumentError('port', `expected an integer from 0 to 65535, got ${String(port)}`);
  const app = await createLockServer(rest);
  try {
    await app.listen({ host, port });
  } catch (error) {
    await app.close().catch(() => {});
    throw error;
  }
  const address = app.server.address();
  const bound = typeof address === 'object' && address ? address.port : port;
  const shownHost = host.includes(':') && !host.startsWith('[') ? `[${host}]` : host;
  return { url: `${rest.https ? 'https' : 'http'}://${shownHost}:${bound}`, app, close: () => app.close() };
}

/** 127.0.0.0/8, ::1 (also as [::1] or IPv4-mapped), localhost. */
export function isLoopback(host: string): boolean {
  const h = host.replace(/^\[(.*)\]$/, '$1').toLowerCase();
  if (h === 'localhost') return true;
  if (isIP(h) === 4) return h.startsWith('127.');
  if (isIP(h) === 6) return h === '::1' || /^(0{0,4}:){0,5}:?(0{0,4}:)?ffff:127\./.test(h) || h === '0:0:0:0:0:0:0:1';
  return false;
}

/**
 * `leasehold serve`: the lock service (docs/http-api.md) on fastify, until SIGINT/SIGTERM. Argument
 * parsing and exit codes only; the server is src/serve.
 */
import { readFileSync } from 'node:fs';
import { type Command, InvalidArgumentError as CommanderArgumentError, Option } from 'commander';
import { DEFAULT_URL } from '../connect.js';
import { InvalidArgumentError } from '../core/errors.js';
import { loadAuthFile, probeBackend, SERVE_DEFAULTS, startLockServer, type RunningLockServer } from '../serve/index.js';
import { onStopSignals, signalExitCode } from '../util/process.js';
import { loadSequencerKey } from '../util/sequencer-key.js';
import { CliExit, EXIT, usageError } from './exit.js';

export const SERVE_USAGE =
  'leasehold serve [--url URL] [--host 127.0.0.1] [--port 7070] [--auth FILE] [--rate-limit N] [--tls-cert FILE --tls-key FILE] [--sequencer-key FILE]';

export interface ServeCommandOptions {
  /** Coordinator URL; undefined means LEASEHOLD_URL, else the embedded SQLite store. */
  url: string | undefined;
  host: string;
  port: number;
  auth: string | undefined;
  rateLimit: number;
  tlsCert: string | undefined;
  tlsKey: string | undefined;
  /** Key file the issued sequencers are signed with (src/util/sequencer-key.ts); undefined: unsigned (`lh1.`). */
  sequencerKey: string | undefined;
}

/**
 * Serves until SIGINT or SIGTERM (exit 0; another stop signal exits 128+n), then closes the server
 * (waiting long polls answer 503) and the backend. Exits 64 for bad arguments (a non-loopback --host
 * without --auth among them), 69 when the coordinator cannot be reached or the port cannot be used.
 */
export async function runServeCommand(o: ServeCommandOptions, write: (line: string) => void): Promise<number> {
  if ((o.tlsCert === undefined) !== (o.tlsKey === undefined)) throw usageError('--tls-cert and --tls-key go together', SERVE_USAGE);
  const auth = o.auth === undefined ? undefined : loadAuthFile(o.auth);
  const https =
    o.tlsCert !== undefined && o.tlsKey !== undefined ? { cert: readOption(o.tlsCert, '--tls-cert'), key: readOption(o.tlsKey, '--tls-key') } : undefined;
  // Read now: a missing or malformed key file stops the server before it listens (64), naming the option, never the key.
  const sequencerKey = o.sequencerKey === undefined ? undefined : loadSequencerKey(o.sequencerKey);
  let server: RunningLockServer;
  try {
    server = await startLockServer({
      url: o.url ?? (process.env.LEASEHOLD_URL || DEFAULT_URL),
      host: o.host,
      port: o.port,
      rateLimit: o.rateLimit,
      ...(auth && { auth }),
      ...(https && { https }),
      ...(sequencerKey && { sequencerKey }),
    });
  } catch (error) {
    const code = (error as { code?: string }).code;
    if (code === 'EADDRINUSE' || code === 'EACCES' || code === 'EADDRNOTAVAIL')
      throw new CliExit(EXIT.UNAVAILABLE, `cannot listen on ${o.host}:${o.port}: ${(error as Error).message}`);
    throw error;
  }
  try {
    // A coordinator that cannot be reached now is a typo or an outage: say so at once (exit 69) rather than serve 503s.
    await probeBackend(server.app.leasehold);
    const stopped = new Promise<NodeJS.Signals>((resolve) => {
      const off = onStopSignals((signal) => {
        off();
        resolve(signal);
      });
    });
    write(
      `leasehold serve: listening on ${server.url} (backend ${server.app.leasehold.backend.name}${auth ? `, ${auth.callers.length} callers` : ', no --auth: loopback only'}${sequencerKey ? ', signed sequencers' : ''})`,
    );
    const signal = await stopped;
    return signal === 'SIGINT' || signal === 'SIGTERM' ? EXIT.OK : signalExitCode(signal);
  } finally {
    await server.close().catch(() => {});
  }
}

function readOption(path: string, flag: string): Buffer {
  try {
    return readFileSync(path);
  } catch (cause) {
    throw new InvalidArgumentError(flag, `cannot read ${JSON.stringify(path)}: ${(cause as Error).message}`, { cause });
  }
}

/** A commander option parser for an integer in [min, max]. */
function integerOption(min: number, max: number): (value: string) => number {
  return (value) => {
    if (!/^\d+$/.test(value) || Number(value) < min || Number(value) > max)
      throw new CommanderArgumentError(`expected an integer from ${min} to ${max}, got ${JSON.stringify(value)}`);
    return Number(value);
  };
}

/**
 * Adds `serve` to the program (main.ts), with main's `guard` (one-line errors, usage on exit) and
 * `action` (errors to exits) wrappers.
 */
export function addServeCommand(
  program: Command,
  guard: (cmd: Command, usage: string) => Command,
  action: (usage: string, fn: (opts: ServeFlags) => Promise<number>) => (opts: ServeFlags) => Promise<void>,
): void {
  guard(program.command('serve'), SERVE_USAGE)
    .summary('run the lock service: an HTTP/JSON API for leases, tokens and fences, any language')
    .description(
      'Serves the /v1 HTTP API (docs/http-api.md) in front of the coordinator at --url: acquire (a long poll), renew, release, ' +
        'sessions, listings and sequencer checks, with tokens as decimal strings. Stateless: several servers may run over one ' +
        'PostgreSQL, MySQL, Redis or etcd, and a restart loses nothing (clients hold the lease handles).\n\n' +
        'Without --auth every request is the same anonymous caller, so the server listens on loopback only. --auth FILE lists the callers: ' +
        '{ "callers": [ { "name": "svc-a", "tokenSha256": "<hex>", "prefixes": ["tenant-a/"] } ] }, the hash computed with ' +
        'printf %s "$TOKEN" | sha256sum; each caller may use keys under its prefixes only.\n\n' +
        '--sequencer-key FILE signs the sequencers it issues (lh1s.…), so a resource can check offline that they came from this service ' +
        "(verifySequencer, or a fence's sequencerKey option): one key per line, hex or base64 of 32 or more random bytes (openssl rand -hex 32), " +
        'or an Ed25519 private key in PEM (its public key verifies); # comments; the first key signs, every key verifies.\n\n' +
        'Runs until SIGINT or SIGTERM (exit 0); exits 69 when the coordinator cannot be reached or the port cannot be used, 64 for bad arguments.',
    )
    .addOption(
      new Option('--url <url>', 'coordinator URL: sqlite:PATH, memory:, postgres://…, redis://… (default: $LEASEHOLD_URL, else sqlite:./leasehold.db)'),
    )
    .addOption(new Option('--host <host>', 'the address to listen on (anything but loopback needs --auth)').default('127.0.0.1'))
    .addOption(new Option('--port <port>', 'the port, 0 for any free one').default(7070).argParser(integerOption(0, 65_535)))
    .addOption(new Option('--auth <file>', 'JSON file of callers: bearer-token hashes and key prefixes'))
    .addOption(
      new Option('--rate-limit <n>', 'requests per second per caller, beyond which 429')
        .default(SERVE_DEFAULTS.rateLimit, String(SERVE_DEFAULTS.rateLimit))
        .argParser(integerOption(1, 1_000_000)),
    )
    .addOption(new Option('--tls-cert <file>', 'PEM certificate: serve https (with --tls-key)'))
    .addOption(new Option('--tls-key <file>', 'PEM private key of --tls-cert'))
    .addOption(new Option('--sequencer-key <file>', 'sign issued sequencers with the key(s) in FILE (HMAC secret or Ed25519 private key)'))
    .action(
      action(SERVE_USAGE, async (opts: ServeFlags) =>
        runServeCommand(
          {
            url: opts.url,
            host: opts.host,
            port: opts.port,
            auth: opts.auth,
            rateLimit: opts.rateLimit,
            tlsCert: opts.tlsCert,
            tlsKey: opts.tlsKey,
            sequencerKey: opts.sequencerKey,
          },
          (line) => process.stdout.write(`${line}\n`),
        ),
      ),
    );
}

/** The flags as commander hands them over. */
export interface ServeFlags {
  url?: string;
  host: string;
  port: number;
  auth?: string;
  rateLimit: number;
  tlsCert?: string;
  tlsKey?: string;
  sequencerKey?: string;
}

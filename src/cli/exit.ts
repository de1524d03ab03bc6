import { AcquireTimeoutError, BackendUnavailableError, InvalidArgumentError, LeaseholdError } from '../core/errors.js';
import { SIGNAL_EXIT_BASE } from '../util/process.js';

/**
 * Exit codes of the `leasehold` command. The 64–78 range follows BSD sysexits.h, which cron
 * wrappers and supervisors already understand; 126/127/128+n follow the shell.
 */
export const EXIT = Object.freeze({
  OK: 0,
  /** Something went wrong that is not one of the cases below (the demo's verdict failed, a bug). */
  FAILURE: 1,
  /** EX_USAGE: bad arguments (unknown option, missing KEY or COMMAND, bad duration or URL). */
  USAGE: 64,
  /** EX_UNAVAILABLE: the coordinator could not be reached or opened. */
  UNAVAILABLE: 69,
  /** EX_SOFTWARE: an unexpected internal error. */
  SOFTWARE: 70,
  /** EX_TEMPFAIL: the key is busy (try again later: the next cron tick will). */
  TEMPFAIL: 75,
  /** COMMAND exists but could not be executed (permission denied, not an executable). */
  CANNOT_EXECUTE: 126,
  /** COMMAND was not found. */
  NOT_FOUND: 127,
  /** A child killed by signal n makes the command exit with 128 + n, as in the shell. */
  SIGNAL_BASE: SIGNAL_EXIT_BASE,
});

/**
 * An expected way for the command to end: one line for stderr (without the `leasehold:` prefix)
 * and an exit code. With `usage`, a `usage:` line follows the message.
 */
export class CliExit extends Error {
  override readonly name = 'CliExit';

  constructor(
    readonly exitCode: number,
    message: string,
    /** The `usage:` text for the command at fault (bad arguments only). */
    readonly usage?: string,
  ) {
    super(message);
  }
}

/** A bad-arguments exit (64) with the command's usage line. */
export function usageError(message: string, usage: string): CliExit {
  return new CliExit(EXIT.USAGE, message, usage);
}

/**
 * Maps an error that escaped a subcommand to its exit: library errors by class (never by message
 * text), anything else as an internal error. `usage` is shown for invalid arguments.
 */
export function toCliExit(error: unknown, usage: string): CliExit {
  if (error instanceof CliExit) return error;
  if (error instanceof InvalidArgumentError) return new CliExit(EXIT.USAGE, error.message, usage);
  if (error instanceof BackendUnavailableError) return new CliExit(EXIT.UNAVAILABLE, `coordinator unavailable: ${error.message}`);
  if (error instanceof AcquireTimeoutError) return new CliExit(EXIT.TEMPFAIL, error.message);
  if (error instanceof LeaseholdError) return new CliExit(EXIT.FAILURE, error.message);
  const text = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
  return new CliExit(EXIT.SOFTWARE, `internal error: ${oneLine(text)}`);
}

/** Collapses a message onto one line, so every diagnostic is exactly one line of stderr. */
export function oneLine(text: string): string {
  return text.replace(/\s*[\r\n]+\s*/g, ' ').trim();
}

/** A key (or command) as shown in a one-line message: as is when plain, JSON-quoted when it has spaces or control characters. */
export function shown(text: string): string {
  return /^[\x21-\x7e]+$/.test(text) ? text : JSON.stringify(text);
}

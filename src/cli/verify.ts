import type { Writable } from 'node:stream';
import { runVerify, VerifyError, type VerifyOptions } from '../verify/index.js';
import { CliExit, EXIT, usageError } from './exit.js';

/**
 * `leasehold verify`: runs the check (src/verify) and turns its verdict into the exit code: 0 when
 * every check passed, 1 when one failed. Why there was no verdict becomes a one-line exit: 64 for
 * bad options (with `usage`), 69 when the coordinator or the resource's store is unavailable, 1 when
 * the run could not be carried out, 70 for a broken installation.
 */
export async function verifyCommand(o: VerifyOptions, out: Writable, usage: string): Promise<number> {
  try {
    const result = await runVerify(o, out);
    return result.passed ? EXIT.OK : EXIT.FAILURE;
  } catch (error) {
    if (!(error instanceof VerifyError)) throw error;
    switch (error.kind) {
      case 'usage':
        throw usageError(error.message, usage);
      case 'unavailable':
        throw new CliExit(EXIT.UNAVAILABLE, error.message);
      case 'failed':
        throw new CliExit(EXIT.FAILURE, error.message);
      case 'internal':
        throw new CliExit(EXIT.SOFTWARE, error.message);
    }
  }
}

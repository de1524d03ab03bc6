/**
 * Why a verify run could not give a verdict. The command (src/cli) maps each kind to its exit
 * code; verify itself knows no exit codes.
 */
export type VerifyErrorKind =
  /** The options are wrong (a bad --url, --ttl, --report DIR…): nothing was started. */
  | 'usage'
  /** The coordinator or the resource's store could not be reached or started. */
  | 'unavailable'
  /** The run could not be carried out (its workers did not start). */
  | 'failed'
  /** The installation is broken (the worker script is missing: not built). */
  | 'internal';

export class VerifyError extends Error {
  override readonly name = 'VerifyError';

  constructor(
    readonly kind: VerifyErrorKind,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

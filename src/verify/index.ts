/**
 * The public entry of `leasehold verify`, the one file of src/verify that the command line
 * (src/cli) imports: run a check, read its verdict. Exit codes are the command's business.
 */
export { runVerify, type VerifyResult } from './harness.js';
export { defaultWorkers, VERIFY_LIMITS, type VerifyOptions } from './plan.js';
export { VerifyError, type VerifyErrorKind } from './errors.js';
export type { CheckResult, Stats } from './checker.js';
export { MAX_SEED } from './random.js';
export { NEMESES, type NemesisKind } from './schedule.js';
export { STORE_KINDS, type StoreKind } from './store.js';

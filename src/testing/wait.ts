/**
 * The two waiting helpers the conformance suites use (the repository's own tests import them too,
 * through test/helpers/env.ts). Not exported from `leasehold/testing`: they are the suites' tools,
 * not part of the contract a backend is checked against.
 */
import { setTimeout as delay } from 'node:timers/promises';

/** Resolves after `ms` milliseconds (real time: the suites run against real servers). */
export const sleep = (ms: number): Promise<void> => delay(ms);

/** Polls `check` every `stepMs` until it returns true or `timeoutMs` passes; resolves with whether it did. */
export async function eventually(check: () => boolean | Promise<boolean>, timeoutMs = 5_000, stepMs = 10): Promise<boolean> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    if (await check()) return true;
    if (Date.now() > end) return false;
    await sleep(stepMs);
  }
}

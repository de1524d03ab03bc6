import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';

/** PostgreSQL the tests use (scripts/test-services.mjs finds or starts it and records the URL). */
export const PG_URL = process.env.LEASEHOLD_TEST_PG_URL ?? 'postgres://postgres@127.0.0.1:5432/test';

/** A name unique to this test run, safe as a SQL identifier or key prefix. */
export function uniqueName(prefix: string): string {
  return `${prefix}_${process.pid}_${randomBytes(4).toString('hex')}`;
}

/** A temporary directory removed by the returned cleanup. */
export function tempDir(prefix = 'leasehold-test-'): { path: string; cleanup: () => void } {
  const path = mkdtempSync(join(tmpdir(), prefix));
  return { path, cleanup: () => rmSync(path, { recursive: true, force: true }) };
}

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Polls `check` until it returns true or `timeoutMs` passes; returns the last result. */
export async function eventually(check: () => boolean | Promise<boolean>, timeoutMs = 5_000, stepMs = 10): Promise<boolean> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    if (await check()) return true;
    if (Date.now() > end) return false;
    await sleep(stepMs);
  }
}

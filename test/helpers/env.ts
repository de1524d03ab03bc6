import type { AcquireRequest } from '../../src/core/backend.js';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';

/** PostgreSQL the tests use (scripts/test-services.mjs finds or starts it and records the URL). */
export const PG_URL = process.env.LEASEHOLD_TEST_PG_URL ?? 'postgres://postgres@127.0.0.1:5432/test';

/** MariaDB / MySQL the tests use (scripts/test-services.mjs finds or starts it and records the URL). */
export const MYSQL_URL = process.env.LEASEHOLD_TEST_MYSQL_URL ?? 'mysql://root@127.0.0.1:3306/test';

/** A name unique to this test run, safe as a SQL identifier or key prefix. */
export function uniqueName(prefix: string): string {
  return `${prefix}_${process.pid}_${randomBytes(4).toString('hex')}`;
}

/** A temporary directory removed by the returned cleanup. */
export function tempDir(prefix = 'leasehold-test-'): { path: string; cleanup: () => void } {
  const path = mkdtempSync(join(tmpdir(), prefix));
  return { path, cleanup: () => rmSync(path, { recursive: true, force: true }) };
}

// The conformance suites' waiting helpers (src/testing/wait.ts), one definition for every test.
export { eventually, sleep } from '../../src/testing/wait.js';

/** A backend acquire request with the tests' usual defaults (exclusive, 10 s ttl, not queued); `extra` overrides. */
export const acquireRequest = (key: string, owner: string, extra: Partial<AcquireRequest> = {}): AcquireRequest => ({
  key,
  owner,
  mode: 'exclusive',
  ttlMs: 10_000,
  lockDelayMs: 0,
  holder: owner,
  queue: false,
  queueTtlMs: 2_000,
  ...extra,
});

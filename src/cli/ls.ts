import type { KeyState } from '../core/backend.js';
import { createLocks } from '../index.js';
import { formatDuration } from '../util/duration.js';
import { shown } from './exit.js';

export interface LsOptions {
  /** Only keys starting with this; all keys when undefined or empty. */
  prefix: string | undefined;
  /** Coordinator URL; undefined means LEASEHOLD_URL, else the embedded SQLite store. */
  url: string | undefined;
  /** Print JSON (tokens as decimal strings) instead of a table. */
  json: boolean;
}

/** Column headings of the table, in order. */
export const LS_COLUMNS = Object.freeze(['KEY', 'MODE', 'LIMIT', 'TOKEN', 'HOLDER', 'EXPIRES IN', 'WAITERS', 'LOCK-DELAY']);

/**
 * `leasehold ls`: the coordinator's view of keys under `prefix` (`locks.inspect`): one table row
 * per holder (LIMIT is a semaphore's limit, `-` for a plain lock; HOLDER is the grant's public
 * label), plus one for each key that has waiters or a running lock-delay but no holder;
 * `(no leases)` when there is nothing. Expiry is the coordinator's own estimate (I7), not a
 * promise: a holder that stopped renewing is listed until the coordinator notices.
 *
 * Rejects with the library's errors (`BackendUnavailableError`, `InvalidArgumentError`).
 */
export async function listLeases(o: LsOptions, write: (text: string) => void): Promise<number> {
  const locks = createLocks({ url: o.url });
  let states: KeyState[];
  try {
    states = await locks.inspect(o.prefix);
  } finally {
    await locks.close().catch(() => {});
  }
  write(o.json ? `${toJson(states)}\n` : renderTable(states));
  return 0;
}

/**
 * JSON for scripts: the KeyState objects with every bigint (token) written as a decimal string, and
 * `limit` always present (the semaphore's limit, null for a plain lock).
 */
export function toJson(states: readonly KeyState[]): string {
  const withLimit = states.map((s) => ({ ...s, limit: s.limit ?? null }));
  return JSON.stringify(withLimit, (_name, value: unknown) => (typeof value === 'bigint' ? value.toString() : value), 2);
}

/** The readable table, one line per holder (in token order); `(no leases)` when empty. */
export function renderTable(states: readonly KeyState[]): string {
  if (states.length === 0) return '(no leases)\n';
  const rows: string[][] = [];
  for (const s of states) {
    const delay = s.lockDelayRemainingMs > 0 ? formatDuration(s.lockDelayRemainingMs) : '-';
    const limit = s.limit === undefined ? '-' : String(s.limit);
    if (s.holders.length === 0) {
      rows.push([shown(s.key), '-', limit, '-', '(none)', '-', String(s.waiters), delay]);
      continue;
    }
    // In grant order: the store keeps holders in no particular order.
    for (const h of [...s.holders].sort((x, y) => (x.token < y.token ? -1 : x.token > y.token ? 1 : 0))) {
      rows.push([shown(s.key), h.mode, limit, h.token.toString(), h.holder, formatDuration(h.expiresInMs), String(s.waiters), delay]);
    }
  }
  const table = [[...LS_COLUMNS], ...rows];
  const widths = LS_COLUMNS.map((_, i) => Math.max(...table.map((r) => (r[i] ?? '').length)));
  const lines = table.map((r) =>
    r
      .map((cell, i) => (i === r.length - 1 ? cell : cell.padEnd(widths[i] ?? 0)))
      .join('  ')
      .trimEnd(),
  );
  return `${lines.join('\n')}\n`;
}

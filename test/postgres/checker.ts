/**
 * The checker of the counter runs (test/postgres/failover.test.ts): what the database committed,
 * what the workers were told, and the grants they received, judged against the invariants.
 */

/** One increment as committed, in commit order (`seq` is drawn inside the transaction, after the fence serialised it). */
export interface Committed {
  readonly seq: number;
  readonly id: string;
  readonly token: bigint;
}

export interface Grant {
  readonly worker: number;
  readonly token: bigint;
  /** Wall-clock ms (one machine: every worker reads the same clock) when acquire was called and when it resolved. */
  readonly requestedAt: number;
  readonly grantedAt: number;
}

export interface History {
  /** Rows of the increments table. */
  readonly committed: readonly Committed[];
  /** The counter's final value. */
  readonly counter: number;
  /** Increments whose commit a worker saw acknowledged (id, token). */
  readonly acknowledged: readonly { id: string; token: bigint }[];
  readonly grants: readonly Grant[];
  /** Windows in which the coordinator was restarting (wall-clock ms). */
  readonly restarts: readonly { startedAt: number; endedAt: number }[];
}

/** Every violation found, one line each; empty when the history is correct. */
export function check(h: History): string[] {
  const violations: string[] = [];
  const ordered = [...h.committed].sort((a, b) => a.seq - b.seq);

  // I3: the fence accepted tokens in non-decreasing order
  for (let i = 1; i < ordered.length; i++) {
    const prev = ordered[i - 1]!;
    const cur = ordered[i]!;
    if (cur.token < prev.token) violations.push(`token decreased: increment ${cur.id} (token ${cur.token}) committed after ${prev.id} (token ${prev.token})`);
  }

  // no lost increment: the counter equals the number of committed increments
  if (h.counter !== ordered.length) violations.push(`counter is ${h.counter} but ${ordered.length} increments were committed (lost or phantom increments)`);

  // no double increment and no acknowledged write missing
  const ids = new Map<string, number>();
  for (const c of ordered) ids.set(c.id, (ids.get(c.id) ?? 0) + 1);
  for (const [id, count] of ids) if (count > 1) violations.push(`increment ${id} committed ${count} times`);
  for (const a of h.acknowledged) {
    if (!ids.has(a.id)) violations.push(`increment ${a.id} (token ${a.token}) was acknowledged but is not in the database`);
  }

  // I2: two grants never share a token
  const tokens = new Map<bigint, number>();
  for (const g of h.grants) tokens.set(g.token, (tokens.get(g.token) ?? 0) + 1);
  for (const [token, count] of tokens) if (count > 1) violations.push(`token ${token} was granted ${count} times`);

  // I1 across restarts: a grant requested after a restart exceeds every grant completed before it
  for (const r of h.restarts) {
    const before = h.grants.filter((g) => g.grantedAt < r.startedAt);
    const after = h.grants.filter((g) => g.requestedAt > r.endedAt);
    if (before.length === 0) continue;
    const highest = before.reduce((m, g) => (g.token > m ? g.token : m), 0n);
    for (const g of after) {
      if (g.token <= highest) violations.push(`token regression across a restart: worker ${g.worker} got ${g.token} after ${highest} was granted before it`);
    }
  }
  return violations;
}

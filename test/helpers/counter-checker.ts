/**
 * The checker of the failover counter runs (PostgreSQL restart, etcd leader kill): what the
 * database committed through the fence, what the workers were told, and the grants they got,
 * judged against I1–I3 and "no lost increment". Each check can fail: see the checker tests.
 */

/** One increment as committed; `seq` is drawn inside the fence's transaction, after its row lock serialised it: commit order. */
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

export interface CounterHistory {
  /** Rows of the increments table. */
  readonly committed: readonly Committed[];
  /** The counter's final value. */
  readonly counter: number;
  /** Increments whose commit a worker saw acknowledged. */
  readonly acknowledged: readonly { id: string; token: bigint }[];
  /** Every token granted to any worker. */
  readonly granted: readonly bigint[];
  /** Grants with their timing, for I1 across coordinator restarts. */
  readonly grants?: readonly Grant[];
  /** Windows in which the coordinator was restarting (wall-clock ms). */
  readonly restarts?: readonly { startedAt: number; endedAt: number }[];
  /** The workers write once per grant, so a token accepted twice is a bug. */
  readonly oneWritePerGrant?: boolean;
}

/** Every violation found, one line each; empty when the history is correct. */
export function checkCounterHistory(h: CounterHistory): string[] {
  const violations: string[] = [];
  const ordered = [...h.committed].sort((a, b) => a.seq - b.seq);
  // I3 at the resource: accepted tokens never decrease in commit order
  for (let i = 1; i < ordered.length; i++) {
    const prev = ordered[i - 1]!;
    const cur = ordered[i]!;
    if (cur.token < prev.token) violations.push(`token decreased: increment ${cur.id} (token ${cur.token}) committed after ${prev.id} (token ${prev.token})`);
  }
  // no lost or phantom increment: each committed increment raised the counter by exactly one
  if (h.counter !== ordered.length) violations.push(`counter is ${h.counter} but ${ordered.length} increments were committed (lost or phantom increments)`);
  const ids = new Map<string, number>();
  for (const c of ordered) ids.set(c.id, (ids.get(c.id) ?? 0) + 1);
  for (const [id, count] of ids) if (count > 1) violations.push(`increment ${id} committed ${count} times`);
  // an acknowledged write is in the database
  for (const a of h.acknowledged) if (!ids.has(a.id)) violations.push(`increment ${a.id} (token ${a.token}) was acknowledged but is not in the database`);
  // I2: two grants never share a token; every committed token was granted
  const granted = new Map<bigint, number>();
  for (const t of h.granted) granted.set(t, (granted.get(t) ?? 0) + 1);
  for (const [t, count] of granted) if (count > 1) violations.push(`token ${t} was granted ${count} times`);
  for (const c of ordered) if (!granted.has(c.token)) violations.push(`increment ${c.id} committed with token ${c.token}, which was never granted`);
  // one grant, one write: a token is accepted for at most one increment
  if (h.oneWritePerGrant) {
    const perToken = new Map<bigint, number>();
    for (const c of ordered) perToken.set(c.token, (perToken.get(c.token) ?? 0) + 1);
    for (const [t, count] of perToken) if (count > 1) violations.push(`token ${t} was accepted for ${count} increments`);
  }
  // I1 across restarts: a grant requested after a restart exceeds every grant completed before it
  for (const r of h.restarts ?? []) {
    const before = (h.grants ?? []).filter((g) => g.grantedAt < r.startedAt);
    const after = (h.grants ?? []).filter((g) => g.requestedAt > r.endedAt);
    if (before.length === 0) continue;
    const highest = before.reduce((m, g) => (g.token > m ? g.token : m), 0n);
    for (const g of after) {
      if (g.token <= highest) violations.push(`token regression across a restart: worker ${g.worker} got ${g.token} after ${highest} was granted before it`);
    }
  }
  return violations;
}

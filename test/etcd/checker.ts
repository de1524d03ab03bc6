/**
 * The checker of the etcd failover run: what PostgreSQL committed through the fence, what the
 * workers were told, and the grants they got, judged against I1–I3 and "no lost increment".
 */

export interface Committed {
  /** Drawn inside the fence's transaction, after the fence's row lock serialised it: commit order. */
  readonly seq: number;
  readonly id: string;
  readonly token: bigint;
}

export interface History {
  /** Rows of the increments table. */
  readonly committed: readonly Committed[];
  /** The counter's final value. */
  readonly counter: number;
  /** Increments whose commit a worker saw acknowledged. */
  readonly acknowledged: readonly { id: string; token: bigint }[];
  /** Every token granted to any worker. */
  readonly granted: readonly bigint[];
}

/** Every violation found, one line each; empty when the history is correct. */
export function check(h: History): string[] {
  const violations: string[] = [];
  const ordered = [...h.committed].sort((a, b) => a.seq - b.seq);
  // I3 at the resource: accepted tokens never decrease in commit order
  for (let i = 1; i < ordered.length; i++) {
    const prev = ordered[i - 1]!;
    const cur = ordered[i]!;
    if (cur.token < prev.token) violations.push(`token decreased: ${cur.id} (token ${cur.token}) committed after ${prev.id} (token ${prev.token})`);
  }
  // no lost or phantom increment: each committed increment raised the counter by exactly one
  if (h.counter !== ordered.length) violations.push(`counter is ${h.counter} but ${ordered.length} increments were committed`);
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
  const perToken = new Map<bigint, number>();
  for (const c of ordered) perToken.set(c.token, (perToken.get(c.token) ?? 0) + 1);
  for (const [t, count] of perToken) if (count > 1) violations.push(`token ${t} was accepted for ${count} increments`);
  return violations;
}

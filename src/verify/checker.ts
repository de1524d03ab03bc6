/**
 * The checker of `leasehold verify`: reads the recorded history (every worker and nemesis event,
 * on one monotonic timeline) and the resource's final state (counter, log in commit order, fence
 * mark), and decides four checks. Each is sound — it reports a violation only when the history
 * proves one — and names every violation it finds.
 *
 * 1. grants (I1, I2): no two grants of the key share a token, and a grant requested after another
 *    completed has a larger token.
 * 2. tokens (I3, the fence): in commit order, the tokens of the writes the resource accepted never
 *    decrease; the fence's mark is the highest of them.
 * 3. lost-update: counter = log length; each row's value is the previous row's + 1 (every
 *    read-modify-write saw the one before it); every write a worker saw accepted is in the log
 *    exactly once, no refused write is; a write that failed (indeterminate: it may or may not have
 *    committed) is in the log at most once.
 * 4. i6 (loss is signalled): for consecutive grants A, B of the key (by token) where A had neither
 *    released the lease nor learned of its loss when B's acquire returned. A "learns" only when its
 *    `lease.signal` fires (a `lost` event), as DESIGN's I6 asks. A lease looked at after its
 *    validity ran out (`held`, `release()`, …: a worker resuming from a freeze can release before
 *    its overdue validity timer runs) is made lost by core there and then, which aborts the signal
 *    first; so a release of an expired lease without a `lost` event is a violation, not another way
 *    of knowing. Using A's own validity deadline D (reported by A) and whether A's event loop ran a
 *    timer due after D before it learned:
 *    - D after B's grant: A believed in its lease past the grant. Not checked when A's clock ran
 *      slower than 1 − driftFactor during the lease (outside I5's assumption) or when a coordinator
 *      that loses its state crashed during the lease; otherwise a violation.
 *    - D before B's grant and A's loop ran a later timer first: a violation (late while running).
 *    - D before B's grant and the loop did not run: A was frozen at D (then it must learn within
 *      RESUME_BOUND_MS of SIGCONT), or it learned within TIMER_SLACK_MS of D (timer granularity),
 *      or its event loop stalled (it learned as soon as it ran again).
 *    Besides, every worker frozen past its lease's validity must learn within RESUME_BOUND_MS of
 *    SIGCONT, whether or not someone else took the key meanwhile.
 *
 * With `limit` (`verify --limit N`: the workers hold permits of a semaphore of N), two checks change:
 *
 * 5. permits (I9, and I6 for permits): at no moment were more than N leases valid at once. A lease
 *    counts as valid from its `granted` event until the first of: its `release` event, its `lost`
 *    event, and the end of its local validity as the worker last reported it (`validity`). Each of
 *    these ends no later than the coordinator lets the permit go (I5), and each grant is seen after
 *    the coordinator made it, so with a working semaphore the leases valid at any moment are a subset
 *    of the coordinator's permit holders: never more than N. Counted at every grant (the count only
 *    rises there). Not checked (and said so): moments where one of the leases counted had a clock
 *    slower than 1 − driftFactor, or crossed a crash that lost the coordinator's state.
 * 4. i6 keeps its freeze part (every lease that ran out during a freeze is known lost right after
 *    SIGCONT); the pairwise take-over part does not apply, since permits overlap by design (a lost
 *    permit's place taken by another is what the permits check counts).
 *
 *    The fence (check 2) is unchanged and still the rule: accepted tokens never decrease in commit
 *    order. With N writers that means permits are NOT fenced against each other as equals: a valid
 *    permit writing after a newer permit has written is refused too (the fence orders by token; it
 *    cannot know two permits are concurrent), which is safe and counted as "refused while valid".
 *    What "stale" means for a semaphore: a write sent after its own permit had run out or was known
 *    lost (a late write: the worker was frozen or its requests held). Such a write must be refused,
 *    or be harmless: committed while no higher token had committed yet, so it overwrote nothing newer
 *    (the fence's order stays intact). A late write committed after a higher token is a violation.
 *
 * Delayed requests (the delay nemesis) need no exemption: validity counts from when a request was
 * sent (I5), and the coordinator's expiry from when it arrived, so a held request only makes the
 * coordinator's view later than the client's.
 */
import type { HistoryEvent } from './protocol.js';
import type { FinalState, LogRow } from './store.js';

/** A frozen worker's loss signal must fire within this long after SIGCONT. */
export const RESUME_BOUND_MS = 250;
/** Rounding slack when comparing a validity deadline with a grant (ms). */
const SLACK_MS = 1;
/** A timer fires a little after it is due (ms granularity, scheduling): a signal this close after its deadline is on time. */
const TIMER_SLACK_MS = 15;
/** SIGSTOP takes effect a moment after it is sent: a deadline this close before it still counts as frozen. */
const FREEZE_SLACK_MS = 20;
/** At most this many violations are listed per check (the count is always complete). */
const MAX_LISTED = 20;

export type Verdict = 'pass' | 'fail';
export type CheckId = 'grants' | 'permits' | 'tokens' | 'lost-update' | 'i6';

export interface CheckResult {
  id: CheckId;
  title: string;
  verdict: Verdict;
  /** One line: what was checked and what was found. */
  summary: string;
  violations: string[];
  /** How many violations in all (violations lists at most MAX_LISTED). */
  violationCount: number;
}

export interface Stats {
  operations: number;
  granted: number;
  acquireFailed: number;
  writes: number;
  accepted: number;
  refused: number;
  /** Writes that failed (not refused): indeterminate. */
  failed: number;
  /** Of those, how many turned out to have committed (found in the log). */
  failedCommitted: number;
  /** Writes with no outcome at all (the worker was killed mid-write). */
  unfinished: number;
  lost: number;
  faults: { pause: number; delay: number; crash: number; clock: number; skipped: number };
}

export interface CheckInput {
  events: readonly HistoryEvent[];
  final: FinalState;
  fenced: boolean;
  driftFactor: number;
  /** Does the coordinator keep its state across a crash? (local:redis and local:redlock, without persistence: no.) */
  coordinatorDurable: boolean;
  /** The semaphore's limit when the workers held permits (`verify --limit N`); undefined for an exclusive lock. */
  limit?: number | undefined;
}

interface LeaseRecord {
  w: number;
  op: string;
  token: bigint;
  acquireAt: number;
  grantedAt: number;
  releaseAt: number | undefined;
  /** When the worker learned of the loss: its `lease.signal` fired (the `lost` event). */
  learned: { t: number; due: number | null; running: boolean } | undefined;
  /** Last validity deadline reported. */
  until: number | undefined;
}

interface Interval {
  from: number;
  to: number;
}

const fmt = (ms: number): string => `${(ms / 1000).toFixed(3)}s`;

function listed(violations: string[]): string[] {
  return violations.length > MAX_LISTED ? [...violations.slice(0, MAX_LISTED), `… and ${violations.length - MAX_LISTED} more`] : violations;
}

function result(id: CheckId, title: string, violations: string[], summary: string): CheckResult {
  return { id, title, verdict: violations.length === 0 ? 'pass' : 'fail', summary, violations: listed(violations), violationCount: violations.length };
}

export interface CheckOutput {
  checks: CheckResult[];
  stats: Stats;
  /** Operations whose committed write broke the token order or lost an update (marked on the timeline). */
  flagged: string[];
}

export function check(input: CheckInput): CheckOutput {
  const events = [...input.events].sort((a, b) => a.t - b.t);
  const of = <T extends HistoryEvent['type']>(type: T): Extract<HistoryEvent, { type: T }>[] =>
    events.filter((e): e is Extract<HistoryEvent, { type: T }> => e.type === type);

  // Operations and leases, from the workers' own events.
  const acquires = new Map<string, number>();
  for (const e of of('acquire')) acquires.set(e.op, e.t);
  const leases = new Map<string, LeaseRecord>();
  const leaseKey = (w: number, token: string | bigint): string => `${w}/${token}`;
  for (const e of of('granted')) {
    leases.set(leaseKey(e.w, e.token), {
      w: e.w,
      op: e.op,
      token: BigInt(e.token),
      acquireAt: acquires.get(e.op) ?? e.t,
      grantedAt: e.t,
      releaseAt: undefined,
      learned: undefined,
      until: undefined,
    });
  }
  for (const e of events) {
    if (e.type !== 'release' && e.type !== 'lost') continue;
    const l = leases.get(leaseKey(e.w, e.token));
    if (!l) continue;
    if (e.type === 'lost' && !l.learned) l.learned = { t: e.t, due: e.due, running: e.running };
    if (e.type === 'release' && l.releaseAt === undefined) l.releaseAt = e.t;
  }
  for (const e of of('validity')) {
    const l = leases.get(leaseKey(e.w, e.token));
    if (l) l.until = e.until;
  }

  // Nemesis intervals.
  const freezes = new Map<number, Interval[]>();
  const open = new Map<number, number>();
  for (const e of events) {
    if (e.type === 'pause') open.set(e.w, e.t);
    if (e.type === 'resume' && open.has(e.w)) {
      (freezes.get(e.w) ?? freezes.set(e.w, []).get(e.w)!).push({ from: open.get(e.w)!, to: e.t });
      open.delete(e.w);
    }
  }
  for (const [w, from] of open) (freezes.get(w) ?? freezes.set(w, []).get(w)!).push({ from, to: Infinity });
  const crashes: Interval[] = [];
  let down: number | undefined;
  for (const e of events) {
    if (e.type === 'crash') down = e.t;
    if (e.type === 'restart' && down !== undefined) {
      crashes.push({ from: down, to: e.t });
      down = undefined;
    }
  }
  if (down !== undefined) crashes.push({ from: down, to: Infinity });
  const rates = new Map<number, { t: number; rate: number }[]>();
  for (const e of of('clock')) (rates.get(e.w) ?? rates.set(e.w, []).get(e.w)!).push({ t: e.t, rate: e.rate });
  /** Did w's clock run slower than 1 − driftFactor at any time in [from, to]? */
  const slowClock = (w: number, from: number, to: number): boolean => {
    const list = rates.get(w) ?? [];
    let rate = 1;
    for (const r of list) {
      if (r.t > to) break;
      if (r.t <= from) rate = r.rate;
      else if (r.rate < 1 - input.driftFactor) return true;
    }
    return rate < 1 - input.driftFactor;
  };

  const flagged = new Set<string>();
  const all = [...leases.values()];
  const limit = input.limit;
  /** Did this lease cross a crash of a coordinator that loses its state? */
  const stateLost = (l: LeaseRecord, to: number): boolean => !input.coordinatorDurable && crashes.some((c) => c.from < to && c.to > l.acquireAt);
  const tokens = checkTokens(input.final, input.fenced, flagged);
  const checks = [
    checkGrants(all),
    ...(limit === undefined ? [] : [checkPermits(all, limit, slowClock, stateLost)]),
    limit === undefined ? tokens : withLateWrites(tokens, events, leases, input.final),
    checkLostUpdates(events, input.final, flagged),
    checkLoss(all, freezes, crashes, slowClock, input.coordinatorDurable, limit !== undefined),
  ];
  return { checks, stats: stats(events, input.final), flagged: [...flagged] };
}

/** I1, I2 on the grants the workers saw. */
function checkGrants(leases: LeaseRecord[]): CheckResult {
  const violations: string[] = [];
  const byToken = new Map<bigint, LeaseRecord>();
  for (const l of leases) {
    const other = byToken.get(l.token);
    if (other)
      violations.push(
        `token ${l.token} granted twice: to w${other.w} (${other.op}) at ${fmt(other.grantedAt)} and to w${l.w} (${l.op}) at ${fmt(l.grantedAt)}`,
      );
    else byToken.set(l.token, l);
  }
  // A grant requested after another completed must have a larger token.
  const byGranted = [...leases].sort((a, b) => a.grantedAt - b.grantedAt);
  const byRequested = [...leases].sort((a, b) => a.acquireAt - b.acquireAt);
  let i = 0;
  let max: LeaseRecord | undefined;
  for (const l of byRequested) {
    while (i < byGranted.length && byGranted[i]!.grantedAt < l.acquireAt) {
      if (!max || byGranted[i]!.token > max.token) max = byGranted[i]!;
      i++;
    }
    if (max && max.token > l.token) {
      violations.push(
        `w${l.w} (${l.op}) requested at ${fmt(l.acquireAt)} and got token ${l.token}, lower than token ${max.token} granted to w${max.w} at ${fmt(max.grantedAt)}`,
      );
    }
  }
  return result(
    'grants',
    'grants: tokens unique and increasing (I1, I2)',
    violations,
    violations.length === 0
      ? `${leases.length} grants, every token unique and larger than the grants completed before it was requested`
      : `${violations.length} violations in ${leases.length} grants`,
  );
}

/** When a lease stopped counting as valid: its release, its loss signal, or its last reported validity deadline, whichever came first. */
function leaseEnd(l: LeaseRecord): number {
  return Math.min(l.releaseAt ?? Infinity, l.learned?.t ?? Infinity, l.until ?? Infinity);
}

/** I9: never more than `limit` valid leases at once (see the header: validity as the workers report it). */
function checkPermits(
  leases: LeaseRecord[],
  limit: number,
  slowClock: (w: number, from: number, to: number) => boolean,
  stateLost: (l: LeaseRecord, to: number) => boolean,
): CheckResult {
  const violations: string[] = [];
  let most = 0;
  let excused = 0;
  const byGrant = [...leases].sort((a, b) => a.grantedAt - b.grantedAt);
  // Still valid at t (a validity deadline within the rounding slack of t is over).
  const validAt = (l: LeaseRecord, t: number): boolean =>
    (l.releaseAt ?? Infinity) > t && (l.learned?.t ?? Infinity) > t && (l.until ?? Infinity) > t + SLACK_MS;
  let active: LeaseRecord[] = [];
  for (const b of byGrant) {
    const t = b.grantedAt;
    active = active.filter((l) => validAt(l, t));
    const valid = [...active, b];
    active.push(b);
    if (valid.length > limit && valid.some((l) => slowClock(l.w, l.acquireAt, t) || stateLost(l, t))) {
      excused++;
      continue;
    }
    most = Math.max(most, valid.length);
    if (valid.length <= limit) continue;
    const named = valid
      .sort((x, y) => (x.token < y.token ? -1 : 1))
      .map((l) => `w${l.w} token ${l.token} (granted ${fmt(l.grantedAt)}, valid until ${fmt(leaseEnd(l))})`);
    violations.push(`${valid.length} permits valid at once at ${fmt(t)}, limit ${limit}: ${named.join(', ')}`);
  }
  const notChecked =
    excused > 0 ? `; not checked: ${excused} moments with a clock slower than 1 − driftFactor or across a crash that lost the coordinator's state` : '';
  return result(
    'permits',
    `permits: at most ${limit} valid at once (I9)`,
    violations,
    violations.length === 0
      ? `${leases.length} permits, at most ${most} valid at once${excused > 0 ? ' where checked' : ''} (limit ${limit})${notChecked}`
      : `${violations.length} moments with more than ${limit} valid permits (at most ${most}) in ${leases.length} grants${notChecked}`,
  );
}

/**
 * The fence check of a semaphore run, with its writes classified (see the header): late writes
 * (sent after the writer's own permit had ended) must be refused or harmless; valid permits refused
 * because a newer permit had written first are counted, not faulted.
 */
function withLateWrites(tokens: CheckResult, events: readonly HistoryEvent[], leases: Map<string, LeaseRecord>, final: FinalState): CheckResult {
  const outcome = new Map<string, 'accepted' | 'refused' | 'failed'>();
  for (const e of events) {
    if (e.type === 'accepted' || e.type === 'refused') outcome.set(e.op, e.type);
    if (e.type === 'write-failed') outcome.set(e.op, 'failed');
  }
  // For each committed row: was a higher token committed before it?
  const afterHigher = new Set<string>();
  let top: bigint | undefined;
  for (const r of final.log) {
    if (top !== undefined && r.token < top) afterHigher.add(r.op);
    if (top === undefined || r.token > top) top = r.token;
  }
  const n = { late: 0, lateRefused: 0, harmless: 0, indeterminate: 0, validRefused: 0 };
  const violations: string[] = [];
  for (const e of events) {
    if (e.type !== 'write') continue;
    const l = leases.get(`${e.w}/${e.token}`);
    if (!l) continue;
    const o = outcome.get(e.op);
    const late = e.t > leaseEnd(l) + SLACK_MS;
    if (!late) {
      if (o === 'refused') n.validRefused++;
      continue;
    }
    n.late++;
    if (o === 'refused') n.lateRefused++;
    else if (final.log.some((r) => r.op === e.op)) {
      if (afterHigher.has(e.op))
        violations.push(
          `late write ${e.op} (w${e.w}, token ${e.token}, sent at ${fmt(e.t)} after its permit ended at ${fmt(leaseEnd(l))}) committed after a higher token`,
        );
      else n.harmless++;
    } else n.indeterminate++;
  }
  const late =
    n.late === 0
      ? 'no late writes'
      : `${n.late} late writes (sent after the writer's permit had ended): ${n.lateRefused} refused, ${n.harmless} committed before any higher token (harmless)${n.indeterminate ? `, ${n.indeterminate} never committed` : ''}`;
  const all = [...tokens.violations, ...violations];
  return {
    ...tokens,
    verdict: tokens.verdict === 'fail' || violations.length > 0 ? 'fail' : 'pass',
    summary: `${tokens.summary}; ${late}; ${n.validRefused} refused while still valid (a newer permit had written first)`,
    violations: listed(all),
    violationCount: tokens.violationCount + violations.length,
  };
}

/** I3 at the resource: accepted tokens never decrease, in commit order. */
function checkTokens(final: FinalState, fenced: boolean, flagged: Set<string>): CheckResult {
  const violations: string[] = [];
  const log = final.log;
  for (let i = 1; i < log.length; i++) {
    const [prev, row] = [log[i - 1]!, log[i]!];
    if (row.token < prev.token) {
      flagged.add(row.op);
      violations.push(
        `write #${i + 1} (${row.op}, w${row.w}) committed token ${row.token} after #${i} (${prev.op}, w${prev.w}) had committed token ${prev.token}`,
      );
    }
  }
  if (fenced && log.length > 0) {
    let top = 0n;
    for (const r of log) if (r.token > top) top = r.token;
    if (final.highest !== top) violations.push(`the fence's mark is ${final.highest ?? 'missing'} but the highest token written is ${top}`);
  }
  return result(
    'tokens',
    'fence: accepted tokens never decrease (I3)',
    violations,
    violations.length === 0 ? `${log.length} writes in commit order, tokens never decrease` : `${violations.length} decreases in ${log.length} writes`,
  );
}

/** No lost update: the counter, the log and the workers' outcomes agree. */
function checkLostUpdates(events: readonly HistoryEvent[], final: FinalState, flagged: Set<string>): CheckResult {
  const violations: string[] = [];
  const log = final.log;
  const outcome = new Map<string, 'accepted' | 'refused' | 'failed' | 'started'>();
  for (const e of events) {
    if (e.type === 'write') outcome.set(e.op, 'started');
    if (e.type === 'accepted' || e.type === 'refused') outcome.set(e.op, e.type);
    if (e.type === 'write-failed') outcome.set(e.op, 'failed');
  }
  const rows = new Map<string, LogRow[]>();
  for (const r of log) (rows.get(r.op) ?? rows.set(r.op, []).get(r.op)!).push(r);

  if (final.counter !== log.length) violations.push(`the counter is ${final.counter} but the log has ${log.length} writes`);
  for (let i = 0; i < log.length; i++) {
    const row = log[i]!;
    const expected = i === 0 ? 1 : log[i - 1]!.value + 1;
    if (row.value !== expected) {
      flagged.add(row.op);
      const prev = log[i - 1];
      violations.push(
        prev
          ? `lost update: write #${i + 1} (${row.op}, w${row.w}, token ${row.token}) stored ${row.value} right after #${i} (${prev.op}, w${prev.w}, token ${prev.token}) stored ${prev.value}: it read a value from before that write`
          : `lost update: the first write (${row.op}) stored ${row.value}, not 1`,
      );
    }
  }
  let accepted = 0;
  let committedFailed = 0;
  for (const [op, o] of outcome) {
    const n = rows.get(op)?.length ?? 0;
    if (o === 'accepted') {
      accepted++;
      if (n !== 1) violations.push(`${op} was accepted but is in the log ${n} times`);
    } else if (o === 'refused') {
      if (n !== 0) violations.push(`${op} was refused but is in the log`);
    } else {
      if (n > 1) violations.push(`${op} (outcome unknown) is in the log ${n} times`);
      if (n === 1) committedFailed++;
    }
  }
  for (const op of rows.keys()) if (!outcome.has(op)) violations.push(`${op} is in the log but no worker started that write`);
  const extra = committedFailed > 0 ? ` + ${committedFailed} indeterminate that committed` : '';
  return result(
    'lost-update',
    'no lost update',
    violations,
    violations.length === 0
      ? `counter ${final.counter} = log ${log.length} = accepted ${accepted}${extra}; every write read the one before it`
      : `counter ${final.counter}, log ${log.length}, accepted ${accepted}${extra}: ${violations.length} problems`,
  );
}

/** I6 on consecutive grants of the key, and on every freeze past a lease's validity. */
function checkLoss(
  leases: LeaseRecord[],
  freezes: Map<number, Interval[]>,
  crashes: Interval[],
  slowClock: (w: number, from: number, to: number) => boolean,
  durable: boolean,
  permits: boolean,
): CheckResult {
  const violations: string[] = [];
  const n = { handedOff: 0, inTime: 0, frozen: 0, tick: 0, stalled: 0, slow: 0, stateLost: 0, unfinished: 0 };
  let worstResume = 0;
  // Permits overlap by design: no pairwise take-overs (the permits check counts valid leases instead).
  const sorted = permits ? [] : [...leases].sort((a, b) => (a.token < b.token ? -1 : a.token > b.token ? 1 : 0));
  const frozenAt = (w: number, t: number): Interval | undefined => (freezes.get(w) ?? []).find((f) => f.from - FREEZE_SLACK_MS <= t && t <= f.to);

  for (let i = 1; i < sorted.length; i++) {
    const a = sorted[i - 1]!;
    const b = sorted[i]!;
    const grant = b.grantedAt;
    const name = `w${a.w}'s lease (token ${a.token})`;
    const next = `w${b.w} was granted token ${b.token} at ${fmt(grant)}`;
    if (a.learned && a.learned.t <= grant) {
      n.inTime++;
      continue;
    }
    if (a.releaseAt !== undefined && a.releaseAt <= grant) {
      n.handedOff++;
      continue;
    }
    const due = a.learned?.due ?? a.until;
    if (due === undefined || due === null) {
      n.unfinished++;
      continue;
    }
    if (due > grant + SLACK_MS) {
      if (slowClock(a.w, a.acquireAt, grant)) n.slow++;
      else if (!durable && crashes.some((c) => c.from < grant && c.to > a.acquireAt)) n.stateLost++;
      else if (a.grantedAt > grant) {
        violations.push(
          `two holders at once: w${a.w} was granted token ${a.token} at ${fmt(a.grantedAt)}, after w${b.w} had been granted the higher token ${b.token} at ${fmt(grant)}, and both leases were valid (w${a.w}'s until ${fmt(due)})`,
        );
      } else violations.push(`${name} was valid locally until ${fmt(due)}, but ${next}: two holders at once`);
      continue;
    }
    const learned = a.learned;
    if (!learned) {
      if (a.releaseAt === undefined) n.unfinished++;
      else violations.push(`${name} ran out locally at ${fmt(due)}; ${next}, and w${a.w} released it at ${fmt(a.releaseAt)} as if still valid`);
      continue;
    }
    if (learned.running) {
      violations.push(`${name} ran out locally at ${fmt(due)} but w${a.w} learned it only at ${fmt(learned.t)} while its event loop was running; ${next}`);
      continue;
    }
    const freeze = frozenAt(a.w, due);
    if (freeze) {
      const after = learned.t - freeze.to;
      worstResume = Math.max(worstResume, after);
      if (after > RESUME_BOUND_MS)
        violations.push(`${name} ran out while w${a.w} was frozen; its signal fired ${Math.round(after)} ms after SIGCONT (bound ${RESUME_BOUND_MS} ms)`);
      else n.frozen++;
    } else if (learned.t - due <= TIMER_SLACK_MS) n.tick++;
    else n.stalled++;
  }

  // Every freeze past a lease's validity: the signal fires as soon as the worker runs again.
  let frozenPast = 0;
  for (const l of leases) {
    const due = l.learned?.due ?? l.until;
    if (due === undefined || due === null) continue;
    const freeze = (freezes.get(l.w) ?? []).find((f) => f.from <= due && due < f.to && f.from >= l.grantedAt);
    if (!freeze || freeze.to === Infinity) continue;
    if (l.releaseAt !== undefined && l.releaseAt < freeze.from) continue;
    frozenPast++;
    if (!l.learned) {
      if (l.releaseAt !== undefined)
        violations.push(
          `w${l.w}'s lease (token ${l.token}) ran out while it was frozen, and after SIGCONT at ${fmt(freeze.to)} it was released as if still valid`,
        );
      continue;
    }
    const after = l.learned.t - freeze.to;
    worstResume = Math.max(worstResume, after);
    if (after > RESUME_BOUND_MS)
      violations.push(
        `w${l.w}'s lease (token ${l.token}) ran out while it was frozen; its signal fired ${Math.round(after)} ms after SIGCONT (bound ${RESUME_BOUND_MS} ms)`,
      );
  }

  const takeovers = n.inTime + n.frozen + n.tick + n.stalled + n.slow + n.stateLost + violations.length;
  const how = [
    `${n.inTime} knew before the next grant`,
    ...(n.frozen ? [`${n.frozen} frozen, knew right after SIGCONT`] : []),
    ...(n.tick ? [`${n.tick} within ${TIMER_SLACK_MS} ms of their deadline`] : []),
    ...(n.stalled ? [`${n.stalled} right after an event-loop stall`] : []),
  ];
  const text = [
    permits
      ? 'permits overlap by design: take-overs are counted by the permits check'
      : `${takeovers} take-overs from a holder that had not released (${how.join(', ')})`,
    ...(frozenPast > 0
      ? [`${frozenPast} leases ran out during a freeze, each known ≤ ${Math.round(worstResume)} ms after SIGCONT (bound ${RESUME_BOUND_MS} ms)`]
      : []),
    ...(n.slow + n.stateLost > 0
      ? [
          `not checked: ${[n.slow ? `${n.slow} with a clock slower than 1 − driftFactor` : '', n.stateLost ? `${n.stateLost} across a crash that lost the coordinator's state` : ''].filter(Boolean).join(', ')}`,
        ]
      : []),
    ...(permits ? [] : [`${n.handedOff} hand-offs after a release`]),
  ];
  return result('i6', 'I6: loss signalled in time', violations, text.join('; '));
}

function stats(events: readonly HistoryEvent[], final: FinalState): Stats {
  const count = (type: HistoryEvent['type']): number => events.filter((e) => e.type === type).length;
  const started = new Set<string>();
  const done = new Set<string>();
  const failed = new Set<string>();
  for (const e of events) {
    if (e.type === 'write') started.add(e.op);
    if (e.type === 'accepted' || e.type === 'refused' || e.type === 'write-failed') done.add(e.op);
    if (e.type === 'write-failed') failed.add(e.op);
  }
  const inLog = new Set(final.log.map((r) => r.op));
  return {
    operations: count('acquire'),
    granted: count('granted'),
    acquireFailed: count('acquire-failed'),
    writes: count('write'),
    accepted: count('accepted'),
    refused: count('refused'),
    failed: failed.size,
    failedCommitted: [...failed].filter((op) => inLog.has(op)).length,
    unfinished: [...started].filter((op) => !done.has(op)).length,
    lost: count('lost'),
    faults: {
      pause: count('pause'),
      delay: count('delay'),
      crash: count('crash'),
      clock: events.filter((e) => e.type === 'clock-set' && !e.restore).length,
      skipped: count('skipped'),
    },
  };
}

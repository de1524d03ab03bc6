// The checker on hand-made histories: it must pass clean ones, name each kind of violation, and
// stay quiet about what is outside I6's assumption (frozen, stalled, slow clock, lost state).
import { describe, expect, it } from 'vitest';
import { check, RESUME_BOUND_MS, type CheckResult } from '../../src/verify/checker.js';
import type { HistoryEvent } from '../../src/verify/protocol.js';
import type { FinalState, LogRow } from '../../src/verify/store.js';

/** One operation: acquire at `at`, granted +1, validity until +ttl−drift, write, outcome, release. */
function op(
  w: number,
  n: number,
  token: number,
  at: number,
  o: { ttl?: number; write?: 'accepted' | 'refused' | 'write-failed' | 'none'; release?: number | null; value?: number } = {},
): HistoryEvent[] {
  const ttl = o.ttl ?? 300;
  const id = `w${w}.${n}`;
  const tok = String(token);
  const events: HistoryEvent[] = [
    { type: 'acquire', t: at, w, op: id },
    { type: 'granted', t: at + 1, w, op: id, token: tok, ttlMs: ttl },
    { type: 'validity', t: at + 1, w, token: tok, until: at + 1 + ttl - 5 },
  ];
  const write = o.write ?? 'accepted';
  if (write !== 'none') {
    events.push({ type: 'write', t: at + 60, w, op: id, token: tok });
    if (write === 'accepted') events.push({ type: 'accepted', t: at + 61, w, op: id, token: tok, ...(o.value === undefined ? {} : { value: o.value }) });
    if (write === 'refused') events.push({ type: 'refused', t: at + 61, w, op: id, token: tok, highest: '99' });
    if (write === 'write-failed') events.push({ type: 'write-failed', t: at + 61, w, op: id, token: tok, error: 'timeout' });
  }
  if (o.release !== null) events.push({ type: 'release', t: o.release ?? at + 62, w, op: id, token: tok });
  return events;
}

function row(seq: number, w: number, n: number, token: number, value: number): LogRow {
  return { seq, token: BigInt(token), w, op: `w${w}.${n}`, value };
}

function final(
  rows: LogRow[],
  counter = rows.at(-1)?.value ?? 0,
  highest: bigint | null = rows.reduce<bigint | null>((m, r) => (m === null || r.token > m ? r.token : m), null),
): FinalState {
  return { counter, log: rows, highest };
}

function run(events: HistoryEvent[], state: FinalState, o: { fenced?: boolean; durable?: boolean; limit?: number } = {}): Record<string, CheckResult> {
  const { checks } = check({ events, final: state, fenced: o.fenced ?? true, driftFactor: 0.01, coordinatorDurable: o.durable ?? true, limit: o.limit });
  return Object.fromEntries(checks.map((c) => [c.id, c]));
}

/** Three clean hand-offs by release. */
function clean(): { events: HistoryEvent[]; state: FinalState } {
  return {
    events: [...op(1, 1, 1, 0), ...op(2, 1, 2, 70), ...op(3, 1, 3, 140)],
    state: final([row(1, 1, 1, 1, 1), row(2, 2, 1, 2, 2), row(3, 3, 1, 3, 3)]),
  };
}

describe('verify: the checker', () => {
  it('passes a clean history', () => {
    const { events, state } = clean();
    const r = run(events, state);
    for (const c of Object.values(r)) expect(c, c.summary).toMatchObject({ verdict: 'pass', violations: [] });
    expect(r['lost-update']!.summary).toContain('counter 3 = log 3 = accepted 3');
    expect(r.i6!.summary).toContain('2 hand-offs after a release'); // 3 grants: 2 consecutive pairs
  });

  it('names decreasing tokens and lost updates (the zombie of the control run)', () => {
    // w1 (token 1) reads 0, is frozen; w2 (token 2) reads 0 and writes 1; w1 wakes and writes 1.
    const events = [...op(1, 1, 1, 0, { release: 700 }), ...op(2, 1, 2, 400)];
    const r = run(events, final([row(1, 2, 1, 2, 1), row(2, 1, 1, 1, 1)], 1, null), { fenced: false });
    expect(r.tokens!.verdict).toBe('fail');
    expect(r.tokens!.violations[0]).toMatch(/write #2 \(w1\.1, w1\) committed token 1 after #1 \(w2\.1, w2\) had committed token 2/);
    expect(r['lost-update']!.verdict).toBe('fail');
    expect(r['lost-update']!.violations).toEqual(
      expect.arrayContaining([
        'the counter is 1 but the log has 2 writes',
        expect.stringMatching(/^lost update: write #2 \(w1\.1, w1, token 1\) stored 1 right after #1/),
      ]),
    );
  });

  it('checks the log against what the workers saw: accepted once, refused never, failed at most once', () => {
    const events = [
      ...op(1, 1, 1, 0),
      ...op(2, 1, 2, 70, { write: 'refused' }),
      ...op(3, 1, 3, 140, { write: 'write-failed' }),
      ...op(1, 2, 4, 210, { write: 'write-failed' }),
    ];
    const good = run(events, final([row(1, 1, 1, 1, 1), row(2, 3, 1, 3, 2)]));
    expect(good['lost-update']).toMatchObject({ verdict: 'pass' });
    expect(good['lost-update']!.summary).toContain('+ 1 indeterminate that committed');
    const bad = run(events, final([row(1, 2, 1, 2, 1), row(2, 9, 9, 5, 2)]));
    expect(bad['lost-update']!.violations).toEqual(
      expect.arrayContaining([
        'w1.1 was accepted but is in the log 0 times',
        'w2.1 was refused but is in the log',
        'w9.9 is in the log but no worker started that write',
      ]),
    );
    expect(run(events, final([row(1, 1, 1, 1, 1)], 1, 7n)).tokens!.violations).toEqual(["the fence's mark is 7 but the highest token written is 1"]);
  });

  it('I1/I2: a duplicate token, and a lower token for a later request, are violations', () => {
    const events = [...op(1, 1, 5, 0), ...op(2, 1, 5, 70), ...op(3, 1, 4, 140)];
    const r = run(events, final([]), { fenced: false });
    expect(r.grants!.verdict).toBe('fail');
    expect(r.grants!.violations).toEqual(
      expect.arrayContaining([
        expect.stringMatching(/^token 5 granted twice/),
        expect.stringMatching(/^w3 \(w3\.1\) requested at 0\.140s and got token 4, lower than token 5/),
      ]),
    );
  });

  describe('I6', () => {
    /** w1 holds token 1 (valid until 296), never releases before w2 is granted token 2 at `grant`. */
    const takeover = (lost: Partial<Extract<HistoryEvent, { type: 'lost' }>> | null, grant = 400): HistoryEvent[] => [
      ...op(1, 1, 1, 0, { write: 'none', release: 900 }),
      ...(lost ? [{ type: 'lost', t: 296, w: 1, token: '1', reason: 'expired', due: 296, running: true, ...lost } as HistoryEvent] : []),
      ...op(2, 1, 2, grant - 1, { write: 'none' }),
    ];

    it('a signal before the next grant passes', () => {
      expect(run(takeover({}), final([])).i6).toMatchObject({ verdict: 'pass' });
    });

    it('a lower token granted after a higher one that is still valid: two holders at once', () => {
      // w2 is granted token 2 at 0.100s and holds it; w1's grant of token 1 arrives at 0.150s.
      const events: HistoryEvent[] = [...op(2, 1, 2, 99, { write: 'none', release: 500 }), ...op(1, 1, 1, 149, { write: 'none', release: 600 })];
      const r = run(events, final([]));
      expect(r.i6!.verdict).toBe('fail');
      expect(r.i6!.violations[0]).toMatch(/^two holders at once: w1 was granted token 1 at 0\.150s, after w2 had been granted the higher token 2 at 0\.100s/);
    });

    it('a signal after the grant while the worker ran is a violation', () => {
      const r = run(takeover({ t: 450, running: true }), final([]));
      expect(r.i6!.verdict).toBe('fail');
      expect(r.i6!.violations[0]).toMatch(/ran out locally at 0\.296s but w1 learned it only at 0\.450s while its event loop was running/);
    });

    it('no signal at all, and a release as if valid, is a violation', () => {
      expect(run(takeover(null), final([])).i6!.violations[0]).toMatch(/released it at 0\.900s as if still valid/);
    });

    it('frozen across its deadline: the signal must come within the bound after SIGCONT', () => {
      const frozen = (after: number): HistoryEvent[] => [
        ...takeover({ t: 800 + after, running: false }),
        { type: 'pause', t: 100, w: 1, pid: 1, plannedMs: 700 },
        { type: 'resume', t: 800, w: 1, pid: 1 },
      ];
      expect(run(frozen(2), final([])).i6).toMatchObject({ verdict: 'pass' });
      expect(run(frozen(2), final([])).i6!.summary).toContain('1 frozen, knew right after SIGCONT');
      const late = run(frozen(RESUME_BOUND_MS + 50), final([])).i6!;
      expect(late.verdict).toBe('fail');
      expect(late.violations[0]).toMatch(/signal fired 300 ms after SIGCONT/);
    });

    it('a lease released after SIGCONT without its loss ever signalled is a violation', () => {
      const events: HistoryEvent[] = [
        ...op(1, 1, 1, 0, { write: 'none', release: null }),
        { type: 'release', t: 801, w: 1, op: 'w1.1', token: '1' },
        { type: 'pause', t: 100, w: 1, pid: 1, plannedMs: 700 },
        { type: 'resume', t: 800, w: 1, pid: 1 },
        ...op(2, 1, 2, 399, { write: 'none' }),
      ];
      const r = run(events, final([])).i6!;
      expect(r.verdict).toBe('fail');
      expect(r.violations.join('\n')).toMatch(/released it at 0\.801s as if still valid/);
    });

    it('a stalled event loop (no timer ran after the deadline) is not a violation', () => {
      expect(run(takeover({ t: 450, running: false }), final([])).i6).toMatchObject({ verdict: 'pass' });
    });

    it('validity past the grant is a violation, unless the clock was slow or the coordinator lost its state', () => {
      const past = takeover({ t: 500, due: 480, running: false });
      expect(run(past, final([])).i6!.violations[0]).toMatch(/was valid locally until 0\.480s, but w2 was granted token 2 at 0\.400s: two holders at once/);
      const slow = [...past, { type: 'clock', t: 50, w: 1, rate: 0.95, offsetMs: 0 } as HistoryEvent];
      expect(run(slow, final([])).i6).toMatchObject({ verdict: 'pass' });
      expect(run(slow, final([])).i6!.summary).toContain('not checked: 1 with a clock slower than 1 − driftFactor');
      const crashed = [...past, { type: 'crash', t: 200, what: 'redis' } as HistoryEvent, { type: 'restart', t: 300, what: 'redis' } as HistoryEvent];
      expect(run(crashed, final([]), { durable: false }).i6).toMatchObject({ verdict: 'pass' });
      expect(run(crashed, final([]), { durable: true }).i6!.verdict).toBe('fail');
    });
  });

  describe('--limit (permits of a semaphore)', () => {
    // Three permits: w1 [1, 296), w2 [51, 346), w3 [101, 396) by validity; w4 granted at 201 while all three are valid.
    const overlapping = (): HistoryEvent[] => [
      ...op(1, 1, 1, 0, { write: 'none', release: null }),
      ...op(2, 1, 2, 50, { write: 'none', release: null }),
      ...op(3, 1, 3, 100, { write: 'none', release: null }),
    ];

    it('at most N valid at once passes; one more fails, naming the moment and the permits', () => {
      const ok = run(overlapping(), final([]), { limit: 3 });
      expect(Object.keys(ok)).toEqual(['grants', 'permits', 'tokens', 'lost-update', 'i6']);
      expect(ok.permits).toMatchObject({ verdict: 'pass', title: 'permits: at most 3 valid at once (I9)' });
      expect(ok.permits!.summary).toBe('3 permits, at most 3 valid at once (limit 3)');
      // Permits overlap by design: the pairwise I6 take-over analysis is not applied.
      expect(ok.i6).toMatchObject({ verdict: 'pass' });
      expect(ok.i6!.summary).toContain('permits overlap by design');
      const bad = run(overlapping(), final([]), { limit: 2 });
      expect(bad.permits!.verdict).toBe('fail');
      expect(bad.permits!.violations).toEqual([
        '3 permits valid at once at 0.101s, limit 2: w1 token 1 (granted 0.001s, valid until 0.296s), w2 token 2 (granted 0.051s, valid until 0.346s), w3 token 3 (granted 0.101s, valid until 0.396s)',
      ]);
    });

    it('a permit stops counting at its release, its loss signal or its validity deadline, whichever comes first', () => {
      const released = [
        ...overlapping().filter((e) => !(e.type === 'validity' && e.w === 1)),
        { type: 'release', t: 90, w: 1, op: 'w1.1', token: '1' } as HistoryEvent,
      ];
      // w1's validity event is gone (as if never reported): its release at 0.090s ends it.
      expect(run(released, final([]), { limit: 2 }).permits).toMatchObject({ verdict: 'pass' });
      const lost = [...overlapping(), { type: 'lost', t: 95, w: 1, token: '1', reason: 'not-held', due: 296, running: true } as HistoryEvent];
      expect(run(lost, final([]), { limit: 2 }).permits).toMatchObject({ verdict: 'pass' });
      const expired = [
        ...op(1, 1, 1, 0, { write: 'none', release: null, ttl: 50 }),
        ...op(2, 1, 2, 50, { write: 'none', release: null }),
        ...op(3, 1, 3, 100, { write: 'none', release: null }),
      ];
      expect(run(expired, final([]), { limit: 2 }).permits).toMatchObject({ verdict: 'pass' });
    });

    it('a moment over the limit is not checked when a permit counted had a slow clock', () => {
      const slow = [...overlapping(), { type: 'clock', t: 0, w: 1, rate: 0.9, offsetMs: 0 } as HistoryEvent];
      const r = run(slow, final([]), { limit: 2 });
      expect(r.permits).toMatchObject({ verdict: 'pass' });
      expect(r.permits!.summary).toContain('not checked: 1 moments with a clock slower than 1 − driftFactor');
    });

    it('late writes (sent after the permit ended) must be refused or committed before any higher token; valid permits refused are counted', () => {
      // w1 (token 1, valid until 0.296s) is frozen and writes at 0.500s; w2 (token 2) wrote at 0.111s.
      const late = (outcome: 'accepted' | 'refused'): HistoryEvent[] => [
        ...op(1, 1, 1, 0, { write: 'none', release: 600 }),
        { type: 'write', t: 500, w: 1, op: 'w1.1', token: '1' },
        outcome === 'accepted'
          ? ({ type: 'accepted', t: 501, w: 1, op: 'w1.1', token: '1' } as HistoryEvent)
          : ({ type: 'refused', t: 501, w: 1, op: 'w1.1', token: '1', highest: '2' } as HistoryEvent),
        ...op(2, 1, 2, 50),
      ];
      const refused = run(late('refused'), final([row(1, 2, 1, 2, 1)]), { limit: 2 });
      expect(refused.tokens).toMatchObject({ verdict: 'pass' });
      expect(refused.tokens!.summary).toContain(
        "1 late writes (sent after the writer's permit had ended): 1 refused, 0 committed before any higher token (harmless)",
      );
      const overwrote = run(late('accepted'), final([row(1, 2, 1, 2, 1), row(2, 1, 1, 1, 2)], 2, 2n), { limit: 2 });
      expect(overwrote.tokens!.verdict).toBe('fail');
      expect(overwrote.tokens!.violations).toEqual(
        expect.arrayContaining([
          expect.stringMatching(/^late write w1\.1 \(w1, token 1, sent at 0\.500s after its permit ended at 0\.296s\) committed after a higher token$/),
        ]),
      );
      // Committed first, before any higher token: harmless.
      const first = run(late('accepted'), final([row(1, 1, 1, 1, 1), row(2, 2, 1, 2, 2)]), { limit: 2 });
      expect(first.tokens).toMatchObject({ verdict: 'pass' });
      expect(first.tokens!.summary).toContain('0 refused, 1 committed before any higher token (harmless)');
      // A valid permit refused because a newer one wrote first: counted, not a violation.
      const validRefused = [...op(1, 1, 1, 0, { write: 'refused' }), ...op(2, 1, 2, 20)];
      const v = run(validRefused, final([row(1, 2, 1, 2, 1)]), { limit: 2 });
      expect(v.tokens).toMatchObject({ verdict: 'pass' });
      expect(v.tokens!.summary).toContain('1 refused while still valid (a newer permit had written first)');
    });
  });
});

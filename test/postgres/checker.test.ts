// The checker must be able to fail, or the failover test proves nothing.
import { describe, expect, it } from 'vitest';
import { check, type History } from './checker.js';

const good: History = {
  committed: [
    { seq: 1, id: 'a1', token: 1n },
    { seq: 2, id: 'a2', token: 1n },
    { seq: 3, id: 'b1', token: 2n },
  ],
  counter: 3,
  acknowledged: [
    { id: 'a1', token: 1n },
    { id: 'b1', token: 2n },
  ],
  grants: [
    { worker: 0, token: 1n, requestedAt: 0, grantedAt: 1 },
    { worker: 1, token: 2n, requestedAt: 1, grantedAt: 20 },
    { worker: 0, token: 3n, requestedAt: 30, grantedAt: 31 },
  ],
  restarts: [{ startedAt: 10, endedAt: 25 }],
};

describe('counter checker', () => {
  it('accepts a correct history', () => {
    expect(check(good)).toEqual([]);
  });

  it('reports a decreasing token, a lost increment, a missing acknowledged write, a duplicate', () => {
    expect(check({ ...good, committed: [good.committed[0]!, good.committed[2]!, { seq: 4, id: 'z', token: 1n }], counter: 3 })).toEqual([
      'token decreased: increment z (token 1) committed after b1 (token 2)',
    ]);
    expect(check({ ...good, counter: 2 })).toEqual(['counter is 2 but 3 increments were committed (lost or phantom increments)']);
    expect(check({ ...good, acknowledged: [...good.acknowledged, { id: 'c9', token: 3n }] })[0]).toMatch(/c9 .* acknowledged/);
    expect(check({ ...good, committed: [...good.committed, { seq: 9, id: 'b1', token: 2n }], counter: 4 })).toEqual(['increment b1 committed 2 times']);
  });

  it('reports shared tokens and a regression across a restart', () => {
    expect(check({ ...good, grants: [...good.grants, { worker: 2, token: 2n, requestedAt: 40, grantedAt: 41 }] })).toContain('token 2 was granted 2 times');
    const regressed = check({ ...good, grants: [...good.grants.slice(0, 2), { worker: 0, token: 1n, requestedAt: 30, grantedAt: 31 }] });
    expect(regressed.some((v) => v.startsWith('token regression across a restart'))).toBe(true);
  });
});

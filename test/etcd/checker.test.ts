// The failover checker must catch what it claims to catch: histories of mutants (a fence that
// ignores tokens, a lost update, a duplicated token) fail it; a correct history passes.
import { describe, expect, it } from 'vitest';
import { check, type History } from './checker.js';

const good: History = {
  committed: [
    { seq: 1, id: 'a-1', token: 10n },
    { seq: 2, id: 'b-1', token: 12n },
    { seq: 3, id: 'a-2', token: 15n },
  ],
  counter: 3,
  acknowledged: [
    { id: 'a-1', token: 10n },
    { id: 'b-1', token: 12n },
  ],
  granted: [10n, 12n, 14n, 15n],
};

describe('etcd failover checker', () => {
  it('passes a correct history', () => {
    expect(check(good)).toEqual([]);
  });

  it('catches a fence that ignores tokens (a lower token committed later)', () => {
    const bad = { ...good, committed: [...good.committed, { seq: 4, id: 'zombie-1', token: 12n }], counter: 4 };
    expect(check(bad).join('\n')).toMatch(/token decreased/);
  });

  it('catches a lost update (two read-modify-writes from the same value)', () => {
    expect(check({ ...good, counter: 2 }).join('\n')).toMatch(/counter is 2 but 3/);
  });

  it('catches an acknowledged write that is missing, and a token granted twice', () => {
    expect(check({ ...good, acknowledged: [...good.acknowledged, { id: 'c-9', token: 15n }] }).join('\n')).toMatch(/acknowledged but is not/);
    expect(check({ ...good, granted: [...good.granted, 12n] }).join('\n')).toMatch(/granted 2 times/);
  });

  it('catches one token accepted for two increments and a token nobody was granted', () => {
    const twice = { ...good, committed: [...good.committed, { seq: 4, id: 'b-2', token: 15n }], counter: 4 };
    expect(check(twice).join('\n')).toMatch(/accepted for 2 increments/);
    const forged = { ...good, committed: [...good.committed, { seq: 4, id: 'x-1', token: 99n }], counter: 4 };
    expect(check(forged).join('\n')).toMatch(/never granted/);
  });
});

/** The PostgreSQL restart runs are judged by the shared counter checker (test/helpers/counter-checker.ts). */
import { checkCounterHistory, type CounterHistory, type Grant } from '../helpers/counter-checker.js';

export type { Committed, Grant } from '../helpers/counter-checker.js';
export type History = Omit<CounterHistory, 'granted' | 'grants' | 'restarts'> & { grants: readonly Grant[]; restarts: NonNullable<CounterHistory['restarts']> };

export function check(h: History): string[] {
  return checkCounterHistory({ ...h, granted: h.grants.map((g) => g.token) });
}

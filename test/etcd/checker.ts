/** The etcd failover run is judged by the shared counter checker (test/helpers/counter-checker.ts); its workers write once per grant. */
import { checkCounterHistory, type CounterHistory } from '../helpers/counter-checker.js';

export type { Committed } from '../helpers/counter-checker.js';
export type History = Pick<CounterHistory, 'committed' | 'counter' | 'acknowledged' | 'granted'>;

export function check(h: History): string[] {
  return checkCounterHistory({ ...h, oneWritePerGrant: true });
}

import { systemClock, type Clock } from '../core/clock.js';
import { StaleTokenError } from '../core/errors.js';
import type { IdempotencyRecord, IdempotencyStore } from '../core/idempotency.js';
import { checkClock, checkKnownOptions, checkObject } from '../core/validate.js';

export interface MemoryIdempotencyStoreOptions {
  /** Judges keepMs. @default systemClock */
  clock?: Clock;
}

/**
 * Idempotency records in this process (tests, one-process services): each key's record and the
 * highest token that wrote it, checked and written in one synchronous step (the fence). A record is
 * dropped keepMs after it was written (its mark stays), when next read.
 */
export function memoryIdempotencyStore(options?: MemoryIdempotencyStoreOptions): IdempotencyStore {
  const o = checkObject(options, 'options');
  checkKnownOptions(o, ['clock'], 'options');
  const clock = o.clock === undefined ? systemClock : checkClock(o.clock, 'options.clock');
  const records = new Map<string, { record: IdempotencyRecord; expiresAt: number }>();
  const marks = new Map<string, bigint>();
  return {
    async get(key) {
      const r = records.get(key);
      if (r && r.expiresAt <= clock.now()) {
        records.delete(key);
        return undefined;
      }
      return r?.record;
    },
    async claim(key, token, record, keepMs) {
      const r = records.get(key);
      if (r && r.record.state === 'completed' && r.expiresAt > clock.now()) return r.record;
      await this.put(key, token, record, keepMs);
      return undefined;
    },
    async put(key, token, record, keepMs) {
      const high = marks.get(key);
      if (high !== undefined && token < high) throw new StaleTokenError(`idempotency:${key}`, token, high);
      marks.set(key, token);
      if (record) records.set(key, { record, expiresAt: clock.now() + keepMs });
      else records.delete(key);
    },
  };
}

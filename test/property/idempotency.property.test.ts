/**
 * Idempotency over random interleavings (issue 17), on an injected clock: attempts of one key start
 * at random times, run for random lengths, and some stop renewing their lease (as a frozen process
 * does), so attempts are taken over mid-flight. Whatever the interleaving: every call that succeeds
 * gets the same value and token; exactly one of them ran fn to completion (replayed: false); every
 * other attempt that ran fn to the end was refused (StaleTokenError) or gave up waiting; and the
 * stored record is that value under that token. The memory coordinator and store; the same store
 * logic is checked on SQLite, PostgreSQL and Redis by the scenario tests.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { flush } from '../helpers/clock.js';
import type { Backend } from '../../src/core/backend.js';
import { manualClock } from '../../src/core/clock.js';
import { AcquireTimeoutError, StaleTokenError } from '../../src/core/errors.js';
import { createIdempotency, type IdempotentResult } from '../../src/core/idempotency.js';
import { Locks } from '../../src/core/locks.js';
import { memoryBackend, memoryIdempotencyStore } from '../../src/memory/index.js';

const TTL = 300;

interface Attempt {
  startAt: number;
  duration: number;
  /** false: the attempt's lease is never renewed (a process frozen past its ttl). */
  renews: boolean;
}

const attemptArb: fc.Arbitrary<Attempt> = fc.record({
  startAt: fc.integer({ min: 0, max: 2_000 }),
  duration: fc.integer({ min: 0, max: 800 }),
  renews: fc.boolean(),
});

async function history(attempts: Attempt[], unfenced = false): Promise<void> {
  const clock = manualClock(1_000);
  const coordinator = memoryBackend({ clock });
  const own = (): Backend => Object.create(coordinator, { close: { value: async () => {} } }) as Backend;
  const real = memoryIdempotencyStore({ clock });
  // The mutant: a store that writes whatever it is given (no fence), as a plain in-progress flag does.
  let top = 0n;
  const store: typeof real = unfenced
    ? {
        get: (k) => real.get(k),
        put: (k, _t, r, keep) => real.put(k, (top += 1_000_000n), r, keep),
        claim: (k, _t, r, keep) => real.claim(k, (top += 1_000_000n), r, keep),
      }
    : real;
  const clients: Locks[] = [];
  const idem = (renews: boolean) => {
    const locks = new Locks({ backend: own(), clock, defaults: { autoRenew: renews } });
    clients.push(locks);
    return createIdempotency({ locks, store, ttlMs: TTL, keepMs: 1_000_000, waitMs: 5_000 });
  };
  const outcomes: Promise<IdempotentResult<string> | Error>[] = [];
  let ranToEnd = 0;
  const start = clock.now();
  const pending = [...attempts].sort((a, b) => a.startAt - b.startAt);
  const end = start + 2_000 + 800 + 5_000 + 1_000;
  for (let t = start; t <= end; t += 25) {
    while (pending.length > 0 && start + pending[0]!.startAt <= clock.now()) {
      const a = pending.shift()!;
      const i = outcomes.length;
      outcomes.push(
        idem(a.renews)
          .run(
            'job',
            { payload: { n: 1 } },
            () =>
              new Promise<string>((resolve) => {
                clock.setTimeout(
                  () => {
                    ranToEnd++;
                    resolve(`attempt-${i}`);
                  },
                  a.duration,
                  { keepAlive: true },
                );
              }),
          )
          .catch((e: unknown) => e as Error),
      );
    }
    clock.advance(25);
    await flush();
  }
  const results = await Promise.all(outcomes);
  for (const c of clients) await c.close();
  const ok = results.filter((r): r is IdempotentResult<string> => !(r instanceof Error));
  const errors = results.filter((r): r is Error => r instanceof Error);
  for (const e of errors) expect(e instanceof StaleTokenError || e instanceof AcquireTimeoutError, `unexpected ${e.name}: ${e.message}`).toBe(true);
  const fresh = ok.filter((r) => !r.replayed);
  if (ok.length > 0) {
    expect(new Set(ok.map((r) => `${r.value}/${r.token}`)).size, 'every success gets one value and token').toBe(1);
    expect(fresh, 'exactly one call ran fn to a stored completion').toHaveLength(1);
    expect(await store.get('job')).toMatchObject({ state: 'completed', token: ok[0]!.token, value: JSON.stringify(ok[0]!.value) });
  }
  // Every fn that ran to the end either stored the result or was refused by the fence (or its caller gave up).
  expect(ranToEnd).toBeGreaterThanOrEqual(fresh.length);
  expect(ranToEnd - fresh.length).toBeLessThanOrEqual(errors.filter((e) => e instanceof StaleTokenError).length);
}

describe('idempotency over random interleavings (injected clock)', () => {
  it('one stored completion, every success agrees with it, every other completion refused', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(attemptArb, { minLength: 1, maxLength: 6 }), async (attempts) => {
        await history(attempts);
      }),
      { numRuns: 60 },
    );
  });

  it('a store without the fence (the mutant) is caught: a late completion overwrites the stored result', async () => {
    const result = await fc.check(
      fc.asyncProperty(fc.array(attemptArb, { minLength: 1, maxLength: 6 }), async (attempts) => {
        await history(attempts, true);
      }),
      { numRuns: 300, seed: 20261202, endOnFailure: true },
    );
    expect(result.failed, 'the unfenced store escaped the property').toBe(true);
  });
});

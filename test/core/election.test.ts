/**
 * Leader election in one process (the memory coordinator, real time, short ttls): the term is the
 * lease's token and grows with each leader; the published value is the label; resigning elects the
 * next campaigner at once; observe reports each leader in order; lead() campaigns again after a
 * loss or a resignation.
 */
import { describe, expect, it } from 'vitest';
import type { Backend } from '../../src/core/backend.js';
import type { Leader } from '../../src/core/election.js';
import { Locks } from '../../src/core/locks.js';
import { memoryBackend } from '../../src/memory/index.js';
import { eventually } from '../helpers/env.js';

function clients(n: number): Locks[] {
  const coordinator = memoryBackend();
  const own = (): Backend => Object.create(coordinator, { close: { value: async () => {} } }) as Backend;
  return Array.from({ length: n }, (_, i) => new Locks({ backend: own(), holderName: `node-${i}` }));
}

describe('election', () => {
  it('campaign: one leader at a time, each term larger; resign elects the next at once; leader() for anyone', async () => {
    const [a, b, watcher] = clients(3);
    const ea = a!.election('cluster:leader', { ttlMs: 5_000 });
    const eb = b!.election('cluster:leader', { ttlMs: 5_000 });
    expect(await watcher!.election('cluster:leader').leader()).toBeNull();
    const first = await ea.campaign({ value: 'http://10.0.0.5:8080' });
    let second: Awaited<ReturnType<typeof eb.campaign>> | undefined;
    const waiting = eb.campaign({ value: 'http://10.0.0.6:8080' }).then((l) => (second = l));
    expect(await watcher!.election('cluster:leader').leader()).toMatchObject({ value: 'http://10.0.0.5:8080', token: first.token });
    expect(second).toBeUndefined(); // b waits while a leads
    await first.release(); // resign
    await waiting;
    expect(second!.token).toBeGreaterThan(first.token);
    expect(await watcher!.election('cluster:leader').leader()).toMatchObject({ value: 'http://10.0.0.6:8080', token: second!.token });
    await second!.release();
    await Promise.all([a, b, watcher].map((l) => l!.close()));
  });

  it('observe yields the leader now and each change, in order, until its signal aborts', async () => {
    const [a, b, watcher] = clients(3);
    const stop = new AbortController();
    const seen: (Leader | null)[] = [];
    const observing = (async () => {
      for await (const leader of watcher!.election('k').observe({ signal: stop.signal })) seen.push(leader);
    })();
    expect(await eventually(() => seen.length === 1, 2_000)).toBe(true); // null: nobody leads
    const la = await a!.election('k').campaign({ value: 'a' });
    expect(await eventually(() => seen.length === 2, 2_000)).toBe(true);
    const pb = b!.election('k').campaign({ value: 'b' });
    await la.release();
    const lb = await pb;
    expect(await eventually(() => seen.at(-1)?.value === 'b', 2_000)).toBe(true);
    await lb.release();
    expect(await eventually(() => seen.at(-1) === null, 2_000)).toBe(true);
    stop.abort();
    await observing;
    const values = seen.map((l) => l?.value ?? null);
    expect(values[0]).toBeNull();
    expect(values).toContain('a');
    expect(values.at(-2)).toBe('b');
    const terms = seen.filter((l): l is Leader => l !== null).map((l) => l.token);
    expect([...terms].sort((x, y) => (x < y ? -1 : 1))).toEqual(terms); // never out of order
    await Promise.all([a, b, watcher].map((l) => l!.close()));
  });

  it('lead() runs fn for each term and campaigns again after a resignation or a loss, until its signal aborts', async () => {
    const [a, b] = clients(2);
    const stop = new AbortController();
    const terms: bigint[] = [];
    const leading = a!.election('job', { ttlMs: 300 }).lead(
      async (lease) => {
        terms.push(lease.token);
        if (terms.length === 1) return; // resign after the first term
        // second term: wait until it is lost (b's campaign cannot take it while a renews; stop renewing by aborting)
        await new Promise<void>((resolve) => {
          if (lease.signal.aborted || stop.signal.aborted) resolve();
          lease.signal.addEventListener('abort', () => resolve(), { once: true });
          stop.signal.addEventListener('abort', () => resolve(), { once: true });
        });
      },
      { value: 'a', signal: stop.signal },
    );
    expect(await eventually(() => terms.length === 2, 3_000)).toBe(true);
    expect(terms[1]!).toBeGreaterThan(terms[0]!);
    const other = b!.election('job', { ttlMs: 300 }).campaign({ value: 'b' });
    stop.abort();
    await leading; // resigned on abort
    const lb = await other;
    expect(lb.token).toBeGreaterThan(terms[1]!);
    await lb.release();
    await Promise.all([a, b].map((l) => l!.close()));
  });

  it('options are checked', async () => {
    const [a] = clients(1);
    expect(() => a!.election('', {})).toThrow(/key/);
    expect(() => a!.election('k', { ttl: 5 } as never)).toThrow(/ttl/);
    await expect(a!.election('k').campaign({ value: '' })).rejects.toMatchObject({ argument: 'options.label' });
    await a!.close();
  });
});

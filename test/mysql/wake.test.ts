/**
 * The poller's wake-up rule (src/mysql/wake.ts) against scripted rounds: each round's answer is
 * what the test says the key looked like then, so an interleaving that a loaded machine produces
 * now and then (two changes between two rounds) is played every time. No server: the rule is
 * pure; the real-server cases are in watch.test.ts.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { KeyPoller, type PolledKey } from '../../src/mysql/wake.js';
import { eventually, sleep } from '../helpers/env.js';

let poller: KeyPoller | undefined;
afterEach(() => poller?.close());

/** A poller whose every round reads `state.current` for the key 'k'; `rounds` counts them. */
function scripted(initial: PolledKey): { state: { current: PolledKey }; rounds: () => number; poller: KeyPoller } {
  const state = { current: initial };
  let rounds = 0;
  poller = new KeyPoller({
    pollMs: 5,
    watchPollMs: 50,
    retryMs: 50,
    read: async (keys) => {
      rounds++;
      return new Map(keys.map((k) => [k, state.current]));
    },
  });
  return { state, rounds: () => rounds, poller };
}

/** Waits until at least `n` more rounds have run. */
async function roundsPass(rounds: () => number, n = 3): Promise<void> {
  const target = rounds() + n;
  expect(await eventually(() => rounds() >= target, 2_000)).toBe(true);
}

const key = (version: number, lastToken: number, live: number, upto: number | null): PolledKey => ({
  version: BigInt(version),
  lastToken: String(lastToken),
  live,
  upto: upto === null ? null : BigInt(upto),
});

describe('mysql wake-up rule (scripted rounds)', () => {
  it('an exclusive waiter is not woken by a round that shows the change meant for the waiter ahead together with its grant; it is woken by that holder’s release', async () => {
    // w1 (place 1) holds token 5 and is released while w2 (place 2) waits; w3 has place 3.
    const { state, rounds, poller } = scripted(key(10, 5, 1, 2));
    let woken = 0;
    const off = await poller.subscribe('k', () => woken++, 10n, 3n, true);
    await roundsPass(rounds);
    expect(woken).toBe(0); // not its turn
    // Between two rounds: w1's release (version 11, upto 2) and then w2's grant (token 6, its place gone: upto 3).
    state.current = key(11, 6, 1, 3);
    await roundsPass(rounds);
    expect(woken).toBe(0); // its place is reached, but w2 holds the key: asking now would only be refused
    state.current = key(12, 6, 0, 3); // w2 releases
    expect(await eventually(() => woken === 1, 2_000)).toBe(true);
    await roundsPass(rounds);
    expect(woken).toBe(1);
    off();
  });

  it('control: a shared waiter in the same rounds is woken at once (shared holders do not keep it out)', async () => {
    const { state, rounds, poller } = scripted(key(10, 5, 1, 2));
    let woken = 0;
    const off = await poller.subscribe('k', () => woken++, 10n, 3n, false);
    await roundsPass(rounds);
    state.current = key(11, 6, 1, 3);
    expect(await eventually(() => woken === 1, 2_000)).toBe(true);
    off();
  });

  it('a blocked exclusive waiter whose holder expires (no write, the version stays) is woken when a round sees the key free', async () => {
    const { state, rounds, poller } = scripted(key(10, 5, 1, 2));
    let woken = 0;
    const off = await poller.subscribe('k', () => woken++, 10n, 3n, true);
    state.current = key(11, 6, 1, 3);
    await roundsPass(rounds);
    expect(woken).toBe(0);
    state.current = key(11, 6, 0, 3); // the holder's ttl ran out: nothing written, no live holder by the server's clock
    expect(await eventually(() => woken === 1, 2_000)).toBe(true);
    await roundsPass(rounds);
    expect(woken).toBe(1);
    off();
  });

  it('a blocked exclusive waiter stays blocked while the key stays held, and is woken once it is released', async () => {
    const { state, rounds, poller } = scripted(key(10, 5, 1, 2));
    let woken = 0;
    const off = await poller.subscribe('k', () => woken++, 10n, 3n, true);
    state.current = key(11, 6, 1, 3);
    await roundsPass(rounds, 5);
    await sleep(20);
    expect(woken).toBe(0);
    state.current = key(12, 6, 0, 3);
    expect(await eventually(() => woken === 1, 2_000)).toBe(true);
    off();
  });

  it('an exclusive waiter with its place reached and the key free is woken by the change, as before', async () => {
    const { state, poller } = scripted(key(10, 5, 1, 3));
    let woken = 0;
    const off = await poller.subscribe('k', () => woken++, 10n, 3n, true);
    state.current = key(11, 5, 0, 3);
    expect(await eventually(() => woken === 1, 2_000)).toBe(true);
    off();
  });
});

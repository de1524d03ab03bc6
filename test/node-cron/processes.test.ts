/**
 * The test of leasehold/node-cron: node-cron in three real processes (the built package,
 * test/fixtures/node-cron-worker.mjs) on a one-second schedule, sharing a SQLite lease store, for
 * about 20 slots. Two instances fire on time and race for each slot; the third's clock is 2.5 s late,
 * so it asks for each slot after the run has ended and must be refused by the minimum hold alone.
 * Each slot runs exactly once: never twice, and none is missed unless every instance missed it.
 */
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { tempDir } from '../helpers/env.js';

const worker = new URL('../fixtures/node-cron-worker.mjs', import.meta.url).pathname;

/** The instances: two on time, one whose clock is 2.5 s late. */
const SKEWS = [0, 0, -2_500];
/** Each instance's life; the slots every instance saw are about DURATION - 2.5 s - start-up of them. */
const DURATION_MS = 23_000;
/** A few seconds: longer than the late clock's 2.5 s plus node-cron's 1 s tolerance for a late timer. */
const MIN_HOLD_MS = 5_000;

type Event =
  | { type: 'ask'; slot: string; answer: boolean; at: number; id: number; pid: number }
  | { type: 'run'; slot: string; token: string | null; at: number; id: number; pid: number }
  | { type: 'done' | 'missed'; slot: string; at: number; id: number; pid: number }
  | { type: 'error'; slot: string; message: string; at: number; id: number; pid: number };

function runWorker(args: string[]): Promise<{ code: number | null; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [worker, ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr.setEncoding('utf8').on('data', (d: string) => void (stderr += d));
    child.on('error', reject);
    child.on('exit', (code) => resolve({ code, stderr }));
  });
}

describe('node-cron in three processes sharing a SQLite lease store', () => {
  it('runs each one-second slot exactly once over ~20 slots, the late instance skipping every slot it asks for after its run', async () => {
    const dir = tempDir();
    try {
      const db = join(dir.path, 'locks.db');
      const log = join(dir.path, 'runs.jsonl');
      const exits = await Promise.all(
        SKEWS.map((skew, i) => runWorker([db, log, String(i), String(skew), String(DURATION_MS), String(MIN_HOLD_MS), 'every-second'])),
      );
      for (const e of exits) expect(e, e.stderr).toMatchObject({ code: 0 });
      const events = readFileSync(log, 'utf8')
        .trim()
        .split('\n')
        .map((line) => JSON.parse(line) as Event);

      expect(events.filter((e) => e.type === 'error')).toEqual([]);
      const runs = events.filter((e) => e.type === 'run');
      const asks = events.filter((e): e is Extract<Event, { type: 'ask' }> => e.type === 'ask');

      // Never twice, over every slot any instance saw; each run held its slot's lease, granted once:
      // a slot is its own key, so its first grant has token 1 and a second grant would have 2.
      const runsBySlot = new Map<string, typeof runs>();
      for (const r of runs) runsBySlot.set(r.slot, [...(runsBySlot.get(r.slot) ?? []), r]);
      for (const [slot, r] of runsBySlot)
        expect(
          r.map((x) => `${x.id}@${x.at}`),
          `slot ${slot} ran ${r.length} times`,
        ).toHaveLength(1);
      for (const r of runs) {
        expect(r.token, `slot ${r.slot}`).toBe('1');
        expect(asks.some((a) => a.slot === r.slot && a.id === r.id && a.answer)).toBe(true);
      }

      // The slots every instance saw (asked for, or missed): each ran once, or every instance missed it.
      const seen = SKEWS.map((_, id) => new Set(events.filter((e) => e.id === id && (e.type === 'ask' || e.type === 'missed')).map((e) => e.slot)));
      const window = [...seen[0]!].filter((slot) => seen.every((s) => s.has(slot))).sort();
      expect(window.length).toBeGreaterThanOrEqual(16);
      const missedByAll = window.filter((slot) => !asks.some((a) => a.slot === slot));
      for (const slot of window) {
        if (missedByAll.includes(slot)) continue;
        expect(runsBySlot.get(slot)?.length ?? 0, `slot ${slot}: asked for, but nobody ran it`).toBe(1);
      }
      expect(window.length - missedByAll.length).toBeGreaterThanOrEqual(14);

      // The late instance asked after the run it lost had ended and released its lease: only the
      // minimum hold refused it (with minHoldMs 0 each of these slots would have run twice).
      const done = new Map(events.filter((e) => e.type === 'done').map((e) => [e.slot, e.at]));
      const lateAfterRelease = asks.filter((a) => a.id === 2 && window.includes(a.slot) && !a.answer && a.at > (done.get(a.slot) ?? Infinity));
      expect(lateAfterRelease.length).toBeGreaterThanOrEqual(10);
      for (const a of asks.filter((x) => x.id === 2 && window.includes(x.slot))) expect(a.at - Date.parse(a.slot)).toBeGreaterThanOrEqual(2_000);
    } finally {
      dir.cleanup();
    }
  }, 60_000);
});

// The measuring loops and the table of the SQL benchmarks (bench/postgres.mjs, bench/mysql.mjs), shared
// so that both measure leasehold and its peers the same way. Not a benchmark itself (run.mjs lists the
// .mjs files of bench/ only, not of bench/lib/).
//
// A side is a client factory: open() → { lock(key) → Promise<release()>, close() }, where lock waits
// until it holds the key, however the side waits (leasehold queues; the pollers ask again).
import os from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';

/** `--name value` from argv, else the fallback (the first occurrence wins). */
export function options(argv = process.argv.slice(2)) {
  return (name, fallback) => {
    const i = argv.indexOf(`--${name}`);
    return i >= 0 && argv[i + 1] !== undefined ? argv[i + 1] : fallback;
  };
}

/** ms with µs resolution, on the monotonic clock: the one clock every grant and release is read on. */
export const now = () => performance.now();

export const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

/** The machine line every recorded table is headed by. */
export function machine() {
  const cpus = os.cpus();
  return `${cpus[0]?.model ?? 'unknown cpu'}, ${cpus.length} cores, ${Math.round(os.totalmem() / 2 ** 30)} GiB; node ${process.version}; load average ${os
    .loadavg()
    .map((x) => x.toFixed(1))
    .join(' ')}`;
}

/**
 * Uncontended: one client, one key, acquire + release in sequence for `seconds`, after 20 pairs of
 * warm-up (tables made, statements prepared, connections opened). `mark()` runs between the warm-up and
 * the timed pairs (where the bench reads its statement counters). Returns pairs, their rate, and the
 * median time of an acquire and of a release (which half a difference is in).
 */
export async function pairs(client, key, seconds, mark = async () => {}) {
  for (let i = 0; i < 20; i++) await (await client.lock(key))();
  await mark();
  const acquires = [];
  const releases = [];
  const start = now();
  const end = start + seconds * 1000;
  while (now() < end) {
    const t0 = now();
    const release = await client.lock(key);
    const t1 = now();
    await release();
    acquires.push(t1 - t0);
    releases.push(now() - t1);
  }
  const n = acquires.length;
  return { pairs: n, perSecond: (n * 1000) / (now() - start), acquireP50: median(acquires), releaseP50: median(releases) };
}

/**
 * Contended: every client (a worker, its own connections) loops acquire → hold ~holdMs (a timer) →
 * release on one key for `seconds`, all starting together. Before that, each takes a key of its own
 * once, alone (warm-up), and `mark()` runs. Returns each section as { w, asked, got, releasing }: the
 * acquire call, its grant, and the release call, on one clock.
 */
export async function sections(clients, key, seconds, holdMs, mark = async () => {}) {
  for (let w = 0; w < clients.length; w++) await (await clients[w].lock(`${key}:warm:${w}`))();
  await mark();
  const startAt = now() + 20;
  const stopAt = startAt + seconds * 1000;
  const out = [];
  await Promise.all(
    clients.map(async (c, w) => {
      await sleep(Math.max(0, startAt - now()));
      while (now() < stopAt) {
        const asked = now();
        const release = await c.lock(key);
        const got = now();
        await sleep(holdMs);
        const releasing = now();
        await release();
        out.push({ w, asked, got, releasing });
      }
    }),
  );
  return out;
}

/**
 * The figures of one contended run. Hand-off: from a holder's release call to the grant of a
 * *different* worker (a grant back to the releaser is counted as barging instead). Wait: from an
 * acquire call to its grant. Overlap: a grant before the release call of any earlier grant (two
 * holders at once; must be 0). Jain's index: fairness of the grants among the workers (1 = equal).
 */
export function summarize(list, workers, seconds) {
  const s = [...list].sort((a, b) => a.got - b.got);
  const handoffs = [];
  const waits = s.map((x) => x.got - x.asked).sort((a, b) => a - b);
  let same = 0;
  let overlaps = 0;
  let lastRelease = Number.NEGATIVE_INFINITY;
  for (let i = 0; i < s.length; i++) {
    if (s[i].got < lastRelease) overlaps++;
    lastRelease = Math.max(lastRelease, s[i].releasing);
    if (i === 0) continue;
    if (s[i].w === s[i - 1].w) same++;
    else handoffs.push(s[i].got - s[i - 1].releasing);
  }
  handoffs.sort((a, b) => a - b);
  const q = (xs, p) => (xs.length ? xs[Math.min(xs.length - 1, Math.floor(p * xs.length))] : Number.NaN);
  const counts = Array.from({ length: workers }, (_, w) => s.filter((x) => x.w === w).length);
  const sum = counts.reduce((a, b) => a + b, 0);
  return {
    sections: s.length,
    perSecond: s.length / seconds,
    handoffP50: q(handoffs, 0.5),
    handoffP99: q(handoffs, 0.99),
    waitP50: q(waits, 0.5),
    waitP99: q(waits, 0.99),
    longestWait: waits.length ? waits[waits.length - 1] : Number.NaN,
    jain: sum ? (sum * sum) / (workers * counts.reduce((a, b) => a + b * b, 0)) : Number.NaN,
    barge: s.length > 1 ? same / (s.length - 1) : Number.NaN,
    overlaps,
  };
}

/**
 * Round trips of the statements that acquire and release, timed where the bench hands them to the
 * driver: with the acquire and release calls' own times, this splits a side's time between the
 * statement (network, server, commit) and the client's code around it.
 */
export class Trips {
  acquire = [];
  release = [];

  /** Records how long `promise` (one statement of `kind`, or undefined for others) took. */
  async time(kind, promise) {
    if (!kind) return promise;
    const t0 = now();
    try {
      return await promise;
    } finally {
      this[kind].push(now() - t0);
    }
  }

  /** Forgets what was recorded (after the warm-up). */
  reset() {
    this.acquire.length = 0;
    this.release.length = 0;
  }
}

/** A figure as the tables show it: thousands separated, three significant digits below 100. */
export function fmt(v) {
  if (v === undefined || Number.isNaN(v)) return '—';
  if (!Number.isFinite(v)) return '∞';
  if (Math.abs(v) >= 100) return Math.round(v).toLocaleString('en-US');
  return Math.abs(v) >= 10 ? v.toFixed(1) : v.toFixed(Math.abs(v) < 1 ? 3 : 2);
}

/** leasehold's figure over a peer's, as "0.42×" or, below 0.01, "1/250×". */
export function ratio(lh, peer) {
  if (lh === undefined || peer === undefined || Number.isNaN(lh) || Number.isNaN(peer)) return '—';
  if (peer === 0) return lh === 0 ? '—' : '∞×';
  const r = lh / peer;
  return r !== 0 && r < 0.01 ? `1/${fmt(peer / lh)}×` : `${r.toFixed(2)}×`;
}

/**
 * Collects figures per round and prints the Markdown table of medians: one column per side, then
 * `lh / peer` for each peer. Figures are added in the order the rows should appear.
 */
export class Figures {
  rows = new Map();

  add(figure, side, value) {
    let bySide = this.rows.get(figure);
    if (!bySide) this.rows.set(figure, (bySide = new Map()));
    let values = bySide.get(side);
    if (!values) bySide.set(side, (values = []));
    values.push(value);
  }

  median(figure, side) {
    const values = this.rows.get(figure)?.get(side);
    return values ? median(values) : undefined;
  }

  rounds(figure, side) {
    return this.rows.get(figure)?.get(side) ?? [];
  }

  table(sides, lh, peers) {
    const header = ['figure', ...sides, ...peers.map((p) => `lh / ${p}`)];
    const lines = [header, header.map(() => '---')];
    for (const figure of this.rows.keys()) {
      const m = (side) => this.median(figure, side);
      lines.push([figure, ...sides.map((s) => fmt(m(s))), ...peers.map((p) => ratio(m(lh), m(p)))]);
    }
    return lines.map((l) => `| ${l.join(' | ')} |`).join('\n');
  }
}

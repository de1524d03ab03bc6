#!/usr/bin/env node
// The etcd backend (through `Locks`, as users call it) against the etcd3 package's own `Lock`, on
// the same etcd.
//
//   npm run bench -- etcd [--members 1] [--prefer-leader true] [--iterations 500] [--seconds 5] [--workers 8] [--rounds 3]
//                         [--poll-ms 5] [--scenarios 0/0,0/2,1/0] [--hosts http://h1:2379,http://h2:2379]
//
// Starts its own etcd (--members members on free loopback ports, etcd's default timings, in a
// temporary directory removed at the end) unless --hosts names a running cluster; the binary is
// LEASEHOLD_TEST_ETCD, else `etcd` on PATH. Measures, in rounds that alternate the two sides:
// - uncontended: acquire + release pairs per second, one client, one key, in sequence;
// - contended: --workers clients (each its own etcd client, as separate processes would have) loop
//   acquire → (hold) → release → (work outside the lock) on one key for --seconds; critical
//   sections per second, and hand-off = from the holder's release() call to the next grant *to
//   another worker*, on one clock. etcd3's Lock cannot wait: its callers retry every --poll-ms after
//   EtcdLockFailedError, and a worker that releases and asks again at once usually gets the key back
//   before the pollers notice (barging), so the share of grants that went back to the worker that
//   had just released is printed too. --scenarios lists the contended runs as HOLD/OUTSIDE in ms
//   (0/0: release and ask again at once, the worst case for a queue; 1/0: ~1 ms inside the lock, as
//   the Redis benchmark holds); --outside-ms 0,2 is short for 0/0,0/2;
// - round trips: gRPC messages etcd received (its own /metrics, every member), per acquire+release.
// Prints figures; never fails on them.
import os from 'node:os';
import { execFileSync } from 'node:child_process';
import { Etcd3, EtcdLockFailedError } from 'etcd3';
import { Locks } from '../dist/index.js';
import { etcdBackend } from '../dist/etcd/index.js';
import { startCluster } from '../test/fixtures/etcd-cluster.mjs';

const args = process.argv.slice(2);
const opt = (name, fallback) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 && args[i + 1] !== undefined ? args[i + 1] : fallback;
};
const MEMBERS = Number(opt('members', 1));
const ITERATIONS = Number(opt('iterations', 500));
const SECONDS = Number(opt('seconds', 5));
const WORKERS = Number(opt('workers', 8));
const ROUNDS = Number(opt('rounds', 3));
const POLL_MS = Number(opt('poll-ms', 5));
const SCENARIOS = (
  opt('outside-ms', undefined) !== undefined
    ? opt('outside-ms')
        .split(',')
        .map((x) => `0/${x}`)
    : opt('scenarios', '0/0,0/2,1/0').split(',')
).map((x) => {
  const [hold, outside] = x.split('/').map(Number);
  if (!Number.isFinite(hold) || !Number.isFinite(outside) || hold < 0 || outside < 0) throw new Error(`--scenarios: ${x} is not HOLD/OUTSIDE in ms`);
  return { hold, outside, label: `${hold} ms held, ${outside} ms outside` };
});
const HOSTS = opt('hosts', undefined)?.split(',');
const PREFER_LEADER = opt('prefer-leader', 'true') !== 'false'; // leasehold's preferLeader (with several members)
const TTL_MS = 30_000;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const percentile = (sorted, p) => sorted[Math.min(sorted.length - 1, Math.floor(p * (sorted.length - 1)))];
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
let keySeq = 0;
const freshKey = (label) => `bench-${process.pid}-${label}-${++keySeq}`;

/** gRPC messages received by every member so far (requests of unary calls and stream messages), by method. */
async function serverMessages(endpoints) {
  const byMethod = {};
  for (const url of endpoints) {
    const text = await (await fetch(`${url}/metrics`)).text();
    for (const line of text.split('\n')) {
      const m = /^grpc_server_msg_received_total\{([^}]*)\} ([0-9.e+]+)$/.exec(line);
      if (!m) continue;
      const method = /grpc_method="([^"]+)"/.exec(m[1])?.[1] ?? '?';
      byMethod[method] = (byMethod[method] ?? 0) + Number(m[2]);
    }
  }
  return byMethod;
}
/** Raft work so far on the member that leads: entries committed and WAL fsyncs (each fsync is one batch of entries). */
// A run whose leader changed reads NaN (shown as —): its counters are another member's.
async function leaderRaft(endpoints, before) {
  for (const url of endpoints) {
    const text = await (await fetch(`${url}/metrics`)).text();
    const value = (name) => Number(new RegExp(`^${name}(?:\\{[^}]*\\})? ([0-9.e+]+)$`, 'm').exec(text)?.[1] ?? NaN);
    if (value('etcd_server_is_leader') !== 1) continue;
    if (before && before.url !== url) break;
    return { url, committed: value('etcd_server_proposals_committed_total'), fsyncs: value('etcd_disk_wal_fsync_duration_seconds_count') };
  }
  return { url: undefined, committed: NaN, fsyncs: NaN };
}
const total = (byMethod) => Object.values(byMethod).reduce((a, b) => a + b, 0);
function diff(after, before) {
  const out = {};
  for (const [k, v] of Object.entries(after)) if (v - (before[k] ?? 0) > 0) out[k] = v - (before[k] ?? 0);
  return out;
}

// ---------- the two sides, behind one shape: connect() → { acquire(key) → release(), close() } ----------

const sides = {
  leasehold: (hosts) => {
    const locks = new Locks({ backend: etcdBackend({ hosts, preferLeader: PREFER_LEADER }) });
    return {
      async acquire(key) {
        const lease = await locks.acquire(key, { ttlMs: TTL_MS, waitMs: 60_000 });
        return () => lease.release();
      },
      close: () => locks.close(),
    };
  },
  etcd3: (hosts) => {
    const client = new Etcd3({ hosts });
    return {
      async acquire(key) {
        for (;;) {
          const lock = client.lock(key).ttl(TTL_MS / 1000);
          try {
            await lock.acquire();
            return () => lock.release();
          } catch (error) {
            if (!(error instanceof EtcdLockFailedError)) throw error;
            await sleep(POLL_MS);
          }
        }
      },
      close: async () => client.close(),
    };
  },
};

async function uncontended(name, hosts, endpoints) {
  const c = sides[name](hosts);
  const key = freshKey(`u-${name}`);
  for (let i = 0; i < 50; i++) await (await c.acquire(key))(); // warm-up: connections, session
  const before = await serverMessages(endpoints);
  const start = performance.now();
  for (let i = 0; i < ITERATIONS; i++) await (await c.acquire(key))();
  const elapsed = performance.now() - start;
  const messages = diff(await serverMessages(endpoints), before);
  await c.close();
  return { perSecond: (ITERATIONS * 1000) / elapsed, perPair: total(messages) / ITERATIONS, messages };
}

async function contended(name, hosts, endpoints, { hold: holdMs, outside: outsideMs }) {
  const clients = Array.from({ length: WORKERS }, () => sides[name](hosts));
  const key = freshKey(`c-${name}`);
  for (const c of clients) await (await c.acquire(freshKey('warm')))();
  const handoffs = [];
  let releasedAt; // when the current holder called release()
  let releasedBy;
  let inside = 0;
  let overlaps = 0;
  let grants = 0;
  let regrabs = 0; // grants to the worker that had just released
  const perWorker = new Array(WORKERS).fill(0);
  let stop = false;
  const before = await serverMessages(endpoints);
  const raftBefore = await leaderRaft(endpoints);
  const start = performance.now();
  const deadline = start + SECONDS * 1000;
  await Promise.all(
    clients.map(async (c, w) => {
      while (!stop) {
        const release = await c.acquire(key);
        const now = performance.now();
        if (++inside > 1) overlaps++;
        if (releasedBy === w) regrabs++;
        else if (releasedAt !== undefined) handoffs.push(now - releasedAt);
        grants++;
        perWorker[w]++;
        if (now >= deadline) stop = true;
        if (holdMs > 0) await sleep(holdMs);
        inside--;
        releasedAt = performance.now();
        releasedBy = w;
        await release();
        if (outsideMs > 0) await sleep(outsideMs);
      }
    }),
  );
  const elapsed = performance.now() - start;
  const messages = diff(await serverMessages(endpoints), before);
  const raftAfter = await leaderRaft(endpoints, raftBefore);
  await Promise.all(clients.map((c) => c.close()));
  handoffs.sort((a, b) => a - b);
  return {
    perSecond: (grants * 1000) / elapsed,
    p50: percentile(handoffs, 0.5),
    p99: percentile(handoffs, 0.99),
    perAcquire: total(messages) / grants,
    entries: (raftAfter.committed - raftBefore.committed) / grants,
    fsyncs: (raftAfter.fsyncs - raftBefore.fsyncs) / grants,
    messages,
    overlaps,
    grants,
    regrabShare: regrabs / grants,
    minShare: Math.min(...perWorker) / grants,
    maxShare: Math.max(...perWorker) / grants,
  };
}

async function main() {
  let cluster;
  let hosts = HOSTS;
  if (!hosts) {
    cluster = await startCluster({ members: MEMBERS });
    hosts = cluster.endpoints;
  }
  try {
    const bin = process.env.LEASEHOLD_TEST_ETCD ?? 'etcd';
    let version = '?';
    try {
      version = /etcd Version: (\S+)/.exec(execFileSync(bin, ['--version'], { encoding: 'utf8' }))?.[1] ?? '?';
    } catch {
      // an external cluster
    }
    console.log(`leasehold etcd benchmark — ${new Date().toISOString()}`);
    console.log(
      `machine: ${os.cpus()[0]?.model ?? 'unknown cpu'}, ${os.cpus().length} cores, ${Math.round(os.totalmem() / 2 ** 30)} GiB; load ${os
        .loadavg()
        .map((x) => x.toFixed(1))
        .join(
          ' ',
        )}; node ${process.version}; etcd ${version}, ${HOSTS ? `external (${hosts.join(',')})` : `${MEMBERS} member(s) on loopback, default timings, data in ${os.tmpdir()}`}`,
    );
    console.log(
      `${ROUNDS} rounds; uncontended ${ITERATIONS} pairs; contended ${WORKERS} workers × ${SECONDS}s, scenarios (held / outside the lock) ${SCENARIOS.map((x) => `${x.hold}/${x.outside} ms`).join(', ')}; etcd3 Lock polls every ${POLL_MS} ms; ttl ${TTL_MS / 1000}s; leasehold preferLeader ${PREFER_LEADER}\n`,
    );

    // One raft write, timed alone (in sequence) at the start and in every round: every hand-off
    // needs the release committed, so 1000 / this is a ceiling on critical sections/s for any lock.
    const single = new Etcd3({ hosts });
    const putMs = async () => {
      const t0 = performance.now();
      for (let i = 0; i < 100; i++) await single.put(`bench-${process.pid}-probe`).value(String(i));
      return (performance.now() - t0) / 100;
    };
    const puts = [];
    console.log(`one etcd write (put) takes ${(await putMs()).toFixed(2)} ms here\n`);

    const results = { leasehold: { u: [], c: SCENARIOS.map(() => []) }, etcd3: { u: [], c: SCENARIOS.map(() => []) } };
    for (let r = 0; r < ROUNDS; r++) {
      const order = r % 2 === 0 ? ['leasehold', 'etcd3'] : ['etcd3', 'leasehold'];
      for (const name of order) results[name].u.push(await uncontended(name, hosts, hosts));
      puts.push(await putMs());
      const parts = [
        `round ${r + 1}: put ${puts[r].toFixed(2)} ms; uncontended ${order.map((n) => `${n} ${results[n].u[r].perSecond.toFixed(0)}/s`).join(', ')}`,
      ];
      for (const [i, scenario] of SCENARIOS.entries()) {
        for (const name of order) results[name].c[i].push(await contended(name, hosts, hosts, scenario));
        parts.push(
          `contended (${scenario.label}) ${order
            .map((n) => {
              const c = results[n].c[i][r];
              return `${n} ${c.perSecond.toFixed(0)}/s p50 ${c.p50.toFixed(2)} ms`;
            })
            .join(', ')}`,
        );
      }
      console.log(parts.join('; '));
    }

    const f0 = (x) => x.toFixed(0);
    const f2 = (x) => x.toFixed(2);
    const orDash = (x) => (Number.isFinite(x) ? f2(x) : '—'); // no member said it leads (or its /metrics was out of reach)
    const pct = (x) => `${(100 * x).toFixed(0)} %`;
    const uSummary = (name) => ({
      perSecond: median(results[name].u.map((x) => x.perSecond)),
      perPair: median(results[name].u.map((x) => x.perPair)),
      messages: results[name].u[Math.floor(ROUNDS / 2)].messages,
    });
    const cSummary = (name, i) => {
      const c = results[name].c[i];
      const mid = c.slice().sort((a, b) => a.perSecond - b.perSecond)[Math.floor(c.length / 2)];
      return {
        perSecond: median(c.map((x) => x.perSecond)),
        p50: median(c.map((x) => x.p50)),
        p99: median(c.map((x) => x.p99)),
        perAcquire: median(c.map((x) => x.perAcquire)),
        entries: median(c.map((x) => x.entries)),
        fsyncs: median(c.map((x) => x.fsyncs)),
        regrab: median(c.map((x) => x.regrabShare)),
        min: median(c.map((x) => x.minShare)),
        max: median(c.map((x) => x.maxShare)),
        overlaps: c.reduce((a, x) => a + x.overlaps, 0),
        messages: mid.messages,
        grants: mid.grants,
      };
    };
    const uL = uSummary('leasehold');
    const uE = uSummary('etcd3');
    await single.delete().key(`bench-${process.pid}-probe`);
    single.close();
    const put = median(puts);
    const rows = [
      ['one etcd write (put) ms, alone, median of the rounds', f2(put), '', ''],
      ['uncontended acquire+release /s (median)', f0(uL.perSecond), f0(uE.perSecond), `${(uL.perSecond / uE.perSecond).toFixed(2)}×`],
      // leasehold writes twice per pair (grant, release), etcd3's Lock three times (lease grant, txn, revoke)
      ['  ceiling from writes alone: 1000 / (writes per pair × put)', f0(1000 / (2 * put)), f0(1000 / (3 * put)), '1.50×'],
      ['etcd requests per uncontended acquire+release', f2(uL.perPair), f2(uE.perPair), ''],
    ];
    for (const [i, scenario] of SCENARIOS.entries()) {
      const L = cSummary('leasehold', i);
      const E = cSummary('etcd3', i);
      const label = `${WORKERS} workers, ${scenario.label}`;
      rows.push(
        [`contended critical sections /s (${label})`, f0(L.perSecond), f0(E.perSecond), `${(L.perSecond / E.perSecond).toFixed(2)}×`],
        ['  ceiling for any lock: one committed release per hand-off, 1000 / put', f0(1000 / put), '', `${(1000 / put / E.perSecond).toFixed(2)}× etcd3`],
        ['  hand-off to another worker p50 ms', f2(L.p50), f2(E.p50), `${(E.p50 / L.p50).toFixed(1)}× faster`],
        ['  hand-off to another worker p99 ms', f2(L.p99), f2(E.p99), `${(E.p99 / L.p99).toFixed(1)}× faster`],
        ['  grants back to the worker that just released', pct(L.regrab), pct(E.regrab), ''],
        ['  grants of the least / most served worker', `${pct(L.min)} / ${pct(L.max)}`, `${pct(E.min)} / ${pct(E.max)}`, ''],
        ['  etcd requests per contended acquire+release', f2(L.perAcquire), f2(E.perAcquire), ''],
        ['  raft entries committed per section (leader)', orDash(L.entries), orDash(E.entries), ''],
        // entries that share a batch share an fsync: as many fsyncs as entries means each write had a round of its own
        ['  WAL fsyncs per section (leader)', orDash(L.fsyncs), orDash(E.fsyncs), ''],
        ['  overlapping holders seen', String(L.overlaps), String(E.overlaps), ''],
      );
      const fmt = (m, n) =>
        Object.entries(m)
          .sort((a, b) => b[1] - a[1])
          .map(([k, v]) => `${k} ${(v / n).toFixed(2)}`)
          .join(', ');
      console.log(
        `requests by method per contended acquire (${scenario.label}) — leasehold: ${fmt(L.messages, L.grants)}; etcd3: ${fmt(E.messages, E.grants)}`,
      );
    }
    const fmt = (m, n) =>
      Object.entries(m)
        .sort((a, b) => b[1] - a[1])
        .map(([k, v]) => `${k} ${(v / n).toFixed(2)}`)
        .join(', ');
    console.log(`requests by method per uncontended pair — leasehold: ${fmt(uL.messages, ITERATIONS)}; etcd3: ${fmt(uE.messages, ITERATIONS)}`);
    const w = Math.max(...rows.map((r) => r[0].length));
    console.log('');
    console.log(`| ${'measure'.padEnd(w)} | leasehold etcd | etcd3 Lock | ratio |`);
    console.log(`| ${'-'.repeat(w)} | -------------: | ---------: | ----: |`);
    for (const [name, a, b, ratio] of rows) console.log(`| ${name.padEnd(w)} | ${a.padStart(14)} | ${b.padStart(10)} | ${ratio} |`);
  } finally {
    await cluster?.stop();
  }
}

main().then(
  () => process.exit(0),
  (error) => {
    console.error(error);
    process.exit(1);
  },
);

// A/B of the etcd backend's preferLeader on one three-member cluster: 8 workers through `Locks`
// loop acquire → release on one key, 4 s per run, the two settings alternating for --rounds
// rounds (the first setting of each round alternates too). Prints each run; compare within a round.
//
//   npm run build && node bench/etcd-prefer-leader.mjs [--rounds 6] [--seconds 4]
import { Locks } from '../dist/index.js';
import { etcdBackend } from '../dist/etcd/index.js';
import { startCluster } from '../test/fixtures/etcd-cluster.mjs';

const argv = process.argv.slice(2);
const opt = (name, dflt) => (argv.includes(`--${name}`) ? argv[argv.indexOf(`--${name}`) + 1] : dflt);
const ROUNDS = Number(opt('rounds', 6));
const SECONDS = Number(opt('seconds', 4));
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

const cluster = await startCluster({ members: 3 });
try {
  const run = async (preferLeader) => {
    const workers = Array.from({ length: 8 }, () => new Locks({ backend: etcdBackend({ hosts: cluster.endpoints, preferLeader }) }));
    const key = `ab-${Math.random().toString(36).slice(2)}`;
    for (const l of workers) await (await l.acquire(`warm-${Math.random()}`, { ttlMs: 30_000 })).release();
    let stop = false;
    let grants = 0;
    let releasedAt;
    let releasedBy;
    const handOffs = [];
    setTimeout(() => (stop = true), SECONDS * 1000);
    const start = performance.now();
    await Promise.all(
      workers.map(async (l, w) => {
        while (!stop) {
          const lease = await l.acquire(key, { ttlMs: 30_000, waitMs: 60_000 });
          const now = performance.now();
          if (releasedBy !== w && releasedAt !== undefined) handOffs.push(now - releasedAt);
          grants++;
          releasedAt = performance.now();
          releasedBy = w;
          await lease.release();
        }
      }),
    );
    const perSecond = (grants * 1000) / (performance.now() - start);
    await Promise.all(workers.map((l) => l.close()));
    return { perSecond, p50: median(handOffs) };
  };
  for (let r = 0; r < ROUNDS; r++) {
    const order = r % 2 === 0 ? [false, true] : [true, false];
    const parts = [];
    for (const preferLeader of order) {
      const x = await run(preferLeader);
      parts.push(`preferLeader ${preferLeader}: ${x.perSecond.toFixed(0)} sections/s, hand-off p50 ${x.p50.toFixed(2)} ms`);
    }
    console.log(`round ${r + 1}: ${parts.join('; ')}`);
  }
} finally {
  await cluster.stop();
}

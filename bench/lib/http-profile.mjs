// Where a lock server's CPU went (bench/http.mjs --server-cpu-prof DIR): each V8 .cpuprofile in DIR
// (one per server process) summed by what was running when sampled — socket writes (the write
// system calls Node makes on the event loop thread), the garbage collector, each npm package, each
// directory of leasehold's dist/, Node's own JavaScript — as shares of the time the process was busy.
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';

/** Native functions that are a socket write (libuv's try-write on the event loop thread). */
const WRITES = new Set(['writev', 'writeUtf8String', 'writeLatin1String', 'writeAsciiString', 'writeUcs2String', 'writeBuffer']);
const NOT_BUSY = new Set(['(idle)', '(program)']);

function category(frame) {
  if (WRITES.has(frame.functionName)) return 'socket writes';
  if (frame.functionName === '(garbage collector)') return 'garbage collector';
  const pkg = /node_modules\/((?:@[^/]+\/)?[^/]+)\//.exec(frame.url)?.[1];
  if (pkg) return pkg;
  const lh = /\/dist\/([^/]+)\//.exec(frame.url)?.[1];
  if (lh) return `leasehold ${lh}/`;
  if (frame.url.startsWith('node:')) return 'node (JS)';
  return frame.url ? 'other JS' : 'native (other)';
}

/** One line per profile: busy CPU ms, then the categories over 2 % of it. */
export function summarizeProfiles(dir) {
  const lines = [];
  for (const file of readdirSync(dir)
    .filter((f) => f.endsWith('.cpuprofile'))
    .sort()) {
    const profile = JSON.parse(readFileSync(join(dir, file), 'utf8'));
    const nodes = new Map(profile.nodes.map((n) => [n.id, n]));
    const shares = new Map();
    let busy = 0;
    for (let i = 0; i < profile.samples.length; i++) {
      const frame = nodes.get(profile.samples[i]).callFrame;
      if (NOT_BUSY.has(frame.functionName)) continue;
      const us = profile.timeDeltas[i] ?? 0;
      busy += us;
      const c = category(frame);
      shares.set(c, (shares.get(c) ?? 0) + us);
    }
    const top = [...shares]
      .sort((a, b) => b[1] - a[1])
      .filter(([, us]) => us / busy >= 0.02)
      .map(([c, us]) => `${c} ${((100 * us) / busy).toFixed(0)} %`);
    lines.push(`${file}: ${Math.round(busy / 1000)} ms busy: ${top.join(', ')}`);
  }
  return lines;
}

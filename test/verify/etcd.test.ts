// `leasehold verify` against etcd: local:etcd, one member verify starts in a data directory of its
// own and crashes with SIGKILL. etcd leases are whole seconds with a minimum (the backend rounds
// the ttl up to 2 s), so this run is longer than the others; the resource is SQLite.
import { join } from 'node:path';
import { afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { killAll, requireBuild, sandbox, type Sandbox } from '../cli/helpers.js';
import { expectPass, faultCount, killLeftovers, readReport, verify, type VerifyRun } from './helpers.js';

let sb: Sandbox;
const runs: VerifyRun[] = [];

beforeAll(requireBuild);
beforeEach(() => {
  sb = sandbox();
});
afterEach(() => {
  killAll();
  for (const r of runs.splice(0)) killLeftovers(r.marker, sb.dir);
  sb.cleanup();
});

describe('leasehold verify on etcd', () => {
  it('local:etcd: passes under every nemesis, crash and delay included, with the ttl rounded up to the server\'s minimum', async () => {
    const report = join(sb.dir, 'report');
    const r = await verify(['--url', 'local:etcd', '--duration', '14s', '--ttl', '1s', '--seed', '6', '--report', report], sb, 180_000);
    runs.push(r);
    expectPass(r, sb);
    expect(r.stdout).toMatch(/coordinator {2}local:etcd \(etcd :\d+, started by verify\)/);
    expect(r.stdout).toMatch(/ttl 2s \(the coordinator's minimum; asked 1s\)/);
    for (const kind of ['pause', 'delay', 'crash', 'clock'] as const) expect(faultCount(r, kind), kind).toBeGreaterThanOrEqual(1);
    const { header, events } = readReport(report, 3);
    expect(header).toMatchObject({ ttlMs: 2_000, fence: 'sqlite' });
    expect(events.some((e) => e.type === 'crash')).toBe(true);
    expect(events.some((e) => e.type === 'restart' && e.error === undefined)).toBe(true);
  }, 200_000);
});

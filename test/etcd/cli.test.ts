/**
 * The command line against etcd: `leasehold run --url etcd://…` (real processes, an etcd member of
 * the test's own), `leasehold ls --url etcd://…` and `leasehold demo --url etcd://…`. Needs dist/ (`npm run build`; `npm test` builds first).
 */
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startCluster, type Cluster } from '../fixtures/etcd-cluster.mjs';
import { eventually, uniqueName } from '../helpers/env.js';

const CLI = fileURLToPath(new URL('../../dist/cli/main.js', import.meta.url));

function leasehold(args: string[]): { done: Promise<{ code: number | null; stdout: string; stderr: string }> } {
  const child = spawn(process.execPath, [CLI, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  return { done: new Promise((resolve) => child.once('close', (code) => resolve({ code, stdout, stderr }))) };
}

describe('leasehold CLI with --url etcd://', () => {
  let cluster: Cluster;
  let url: string;

  beforeAll(async () => {
    if (!existsSync(CLI)) throw new Error(`${CLI} is missing: run \`npm run build\` first (npm test does)`);
    cluster = await startCluster({ members: 1 });
    url = `etcd://${cluster.hostList}`;
  });
  afterAll(async () => {
    await cluster?.stop();
  });

  it('run holds the lease for the command, hands it the token, and says busy (75) to a second run', async () => {
    const key = uniqueName('cli');
    const first = leasehold([
      'run',
      key,
      '--url',
      url,
      '--ttl',
      '5s',
      '--',
      process.execPath,
      '-e',
      // holds 8 s: on a loaded machine, starting `ls` and the second `run` took longer than 1.5 s
      'console.log("token=" + process.env.LEASEHOLD_TOKEN); setTimeout(() => {}, 8000)',
    ]);
    // while the first command runs, ls shows its lease
    let listing = '';
    expect(
      await eventually(
        async () => {
          listing = (await leasehold(['ls', key, '--url', url]).done).stdout;
          return listing.includes(key);
        },
        10_000,
        100,
      ),
    ).toBe(true);
    expect(listing).toMatch(/exclusive/);
    const second = await leasehold(['run', key, '--url', url, '--', process.execPath, '-e', 'console.log("ran")']).done;
    expect(second.code).toBe(75);
    expect(second.stdout).not.toContain('ran');
    const result = await first.done;
    expect(result.code).toBe(0);
    const token = /token=(\d+)/.exec(result.stdout)?.[1];
    expect(BigInt(token ?? '0')).toBeGreaterThan(0n);
    // released: the next run gets a higher token
    const third = await leasehold(['run', key, '--url', url, '--', process.execPath, '-e', 'console.log("token=" + process.env.LEASEHOLD_TOKEN)']).done;
    expect(third.code).toBe(0);
    expect(BigInt(/token=(\d+)/.exec(third.stdout)?.[1] ?? '0')).toBeGreaterThan(BigInt(token ?? '0'));
  });

  it("run exits with the command's own code", async () => {
    const r = await leasehold(['run', uniqueName('cli-code'), '--url', url, '--', process.execPath, '-e', 'process.exit(3)']).done;
    expect(r.code).toBe(3);
  });

  it('demo: the fence refuses the frozen worker, and the timeline shows the ttl etcd rounded up to', async () => {
    // The member runs etcd's default timings (election 1000 ms), so its minimum lease is 2 s: --ttl 1s becomes 2 s.
    const r = await leasehold(['demo', '--ttl', '1s', '--pause', '1.2s', '--url', url]).done;
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/verdict: LOST UPDATE/);
    expect(r.stdout).toMatch(/REFUSED: StaleTokenError/);
    expect(r.stdout).toMatch(/verdict: SAFE/);
    expect(r.stdout).toMatch(/A\s+acquired doc:42:recompute: token \d+, ttl 2s /);
    // both runs (unfenced, fenced) print the effective ttl on the SIGSTOP line, not the --ttl asked for
    expect(r.stdout.match(/SIGSTOP A: frozen for 1\.2s between its check and its write \(ttl 2s, the coordinator's rounding of --ttl 1s\)/g)).toHaveLength(2);
  }, 120_000);
});

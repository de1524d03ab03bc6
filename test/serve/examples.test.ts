/**
 * The lock service's examples in other languages run (issue 19, point 6), against a real
 * `leasehold serve` (the built command over a SQLite file): the README's curl lines print what the
 * README says they print; its --auth recipe makes a file the server takes; the plain-shell cron
 * wrapper (examples/http/cron-wrapper.sh) runs a job under a renewed lease and releases it, skips a
 * busy key (75), waits for one, and stops the job when the lease is lost; the standard-library Python
 * client (examples/http/client.py) takes, renews and releases leases and its SQLite fence refuses the
 * stale token. The README's excerpts of the two files are the files' own text.
 */
import { spawn } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Cli, killAll, requireBuild, ROOT, type Sandbox, sandbox, startCli } from '../cli/helpers.js';
import { eventually, sleep } from '../helpers/env.js';
import { acquirePath, http, sha256 } from './helpers.js';

const README = readFileSync(join(ROOT, 'README.md'), 'utf8');
const CRON_WRAPPER = join(ROOT, 'examples/http/cron-wrapper.sh');
const CLIENT_PY = join(ROOT, 'examples/http/client.py');
const LISTENING = /leasehold serve: listening on (https?:\/\/[^\s]+)/;

/** README code blocks announced by `<!-- example: NAME -->` on the line before them. */
function readmeExample(name: string): string {
  const m = new RegExp(`<!-- example: ${name} -->\\n\`\`\`\\w+\\n([\\s\\S]*?)\`\`\``).exec(README);
  if (!m) throw new Error(`README has no block marked <!-- example: ${name} -->`);
  return m[1]!;
}

interface Ran {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs a program to its end (killed after `timeoutMs`). */
function run(cmd: string, args: string[], options: { env?: NodeJS.ProcessEnv; cwd?: string; timeoutMs?: number } = {}): Promise<Ran> {
  const child = spawn(cmd, args, { cwd: options.cwd ?? ROOT, env: { ...process.env, ...options.env }, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.setEncoding('utf8').on('data', (d: string) => {
    stdout += d;
  });
  child.stderr.setEncoding('utf8').on('data', (d: string) => {
    stderr += d;
  });
  const timer = setTimeout(() => child.kill('SIGKILL'), options.timeoutMs ?? 60_000);
  return new Promise<Ran>((resolve) => {
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

let sb: Sandbox;
let server: Cli;
let url: string;

beforeAll(async () => {
  requireBuild();
  sb = sandbox();
  server = startCli(['serve', '--url', `sqlite:${sb.db}`, '--port', '0'], sb);
  url = (await server.waitFor(LISTENING))[1]!;
}, 30_000);
afterAll(() => {
  killAll();
  sb?.cleanup();
});

interface LockJson {
  key: string;
  lastToken: string;
  holders: { token: string; holder: string; expiresInMs: number }[];
  waiters: number;
}
const lockOf = async (key: string): Promise<LockJson | undefined> =>
  ((await http(url, 'GET', `/v1/locks?prefix=${encodeURIComponent(key)}`)).body.locks as LockJson[]).find((k) => k.key === key);

describe('the README', () => {
  it('curl: acquire, renew, list, check the sequencer and release print what the README shows, and leave the key free', async () => {
    const script = readmeExample('curl');
    const ran = await run('sh', ['-eu', '-c', script], { env: { LEASEHOLD_SERVICE: url } });
    expect(ran.stderr).toBe('');
    expect(ran.code).toBe(0);
    // Each `# {…}` or `# 204` the README shows is an output line, in order (… stands for anything).
    const shown = [...script.matchAll(/# (\{.*\}|\d{3})$/gm)].map((m) => m[1]!);
    expect(shown.length).toBe(5);
    const lines = ran.stdout.split('\n').filter((l) => l !== '');
    expect(lines).toHaveLength(shown.length);
    shown.forEach((expected, i) => {
      const pattern = new RegExp(`^${expected.split('…').map(escapeRegExp).join('.*')}$`);
      expect(lines[i], `README line ${expected}`).toMatch(pattern);
    });
    expect(await lockOf('reports/nightly')).toBeUndefined(); // released: nothing held, nobody waiting
  });

  it('auth-file: the recipe makes a callers file that `leasehold serve --auth` takes, for the token it made', async () => {
    const dir = sandbox();
    try {
      const ran = await run('sh', ['-eu', '-c', `${readmeExample('auth-file')}\nprintf %s "$TOKEN"`], { cwd: dir.dir });
      expect(ran.code).toBe(0);
      const token = ran.stdout;
      expect(token).toMatch(/^[0-9a-f]{64}$/);
      const file = JSON.parse(readFileSync(join(dir.dir, 'callers.json'), 'utf8')) as { callers: { name: string; tokenSha256: string }[] };
      expect(file.callers[0]).toMatchObject({ name: 'reports', tokenSha256: sha256(token) });
      const guarded = startCli(['serve', '--url', 'memory:', '--port', '0', '--auth', join(dir.dir, 'callers.json')], dir);
      const base = (await guarded.waitFor(LISTENING))[1]!;
      const bearer = { authorization: `Bearer ${token}` };
      expect((await http(base, 'POST', acquirePath('reports/nightly'), {}, bearer)).status).toBe(200);
      expect((await http(base, 'POST', acquirePath('billing/run'), {}, bearer)).status).toBe(403);
      expect((await http(base, 'POST', acquirePath('reports/other'), {})).status).toBe(401);
      guarded.child.kill('SIGTERM');
      expect((await guarded.done).code).toBe(0);
    } finally {
      dir.cleanup();
    }
  });

  it('shows excerpts of the example scripts as they are in the files', () => {
    const excerpts = [...README.matchAll(/<!-- from: (\S+) -->\n```\w+\n([\s\S]*?)```/g)];
    expect(excerpts.map((m) => m[1])).toEqual(['examples/http/cron-wrapper.sh', 'examples/http/client.py', 'examples/http/client.py']);
    for (const [, file, text] of excerpts) expect(readFileSync(join(ROOT, file!), 'utf8'), `${file} holds the README's excerpt`).toContain(text);
  });
});

describe('examples/http/cron-wrapper.sh (plain shell: curl, sed, awk)', () => {
  const wrapper = (key: string, command: string[], env: NodeJS.ProcessEnv = {}, timeoutMs?: number) =>
    run('sh', [CRON_WRAPPER, key, ...command], { env: { LEASEHOLD_SERVICE: url, ...env }, ...(timeoutMs && { timeoutMs }) });

  it('runs the job under the lease, renews it past its ttl while the job runs, passes the token on, and releases it on exit', async () => {
    const job = wrapper('cron/report', ['sh', '-c', 'echo "report under token $LEASEHOLD_TOKEN ($LEASEHOLD_SEQUENCER)"; sleep 5'], { TTL_MS: '2000' });
    expect(await eventually(async () => ((await lockOf('cron/report'))?.holders.length ?? 0) === 1, 20_000)).toBe(true);
    const [granted] = (await lockOf('cron/report'))!.holders;
    expect(granted!.holder).toMatch(/^cron-wrapper@/);
    await sleep(3_000); // past the 2 s ttl: only renewals keep it
    expect((await lockOf('cron/report'))?.holders.map((h) => h.token)).toEqual([granted!.token]);
    const done = await job;
    expect(done.code).toBe(0);
    expect(done.stdout).toBe(`report under token ${granted!.token} (lh1.e.${granted!.token}.${Buffer.from('cron/report').toString('base64url')})\n`);
    expect(done.stderr).toContain(`cron-wrapper: cron/report held under token ${granted!.token}`);
    // Released on exit (a renewed lease would still have a second or more to run).
    expect((await lockOf('cron/report'))?.holders ?? []).toEqual([]);
  });

  it('skips a busy key at once (exit 75, one line naming the holder) without running the job', async () => {
    const held = await http(url, 'POST', acquirePath('cron/busy'), { ttlMs: 30_000, label: 'other-host' });
    expect(held.status).toBe(200);
    const marker = join(sb.dir, 'busy-ran');
    const done = await wrapper('cron/busy', ['touch', marker]);
    expect(done.code).toBe(75);
    expect(done.stderr).toBe('cron-wrapper: cron/busy is busy (held by other-host); skipped\n');
    expect(existsSync(marker)).toBe(false);
    await http(url, 'DELETE', `/v1/leases/${held.body.lease}`);
  });

  it('with WAIT_MS waits for the key (long polls) and exits with the job’s code', async () => {
    const held = await http(url, 'POST', acquirePath('cron/wait'), { ttlMs: 30_000 });
    const job = wrapper('cron/wait', ['sh', '-c', 'echo "ran under $LEASEHOLD_TOKEN"; exit 3'], { WAIT_MS: '20000' });
    expect(await eventually(async () => (await lockOf('cron/wait'))?.waiters === 1, 20_000)).toBe(true);
    await http(url, 'DELETE', `/v1/leases/${held.body.lease}`);
    const done = await job;
    expect(done).toMatchObject({ code: 3, stdout: 'ran under 2\n' });
    expect((await lockOf('cron/wait'))?.holders ?? []).toEqual([]);
  });

  it('stops the job (SIGTERM) when a renewal finds the lease lost', async () => {
    const job = wrapper('cron/lost', ['sleep', '30'], { TTL_MS: '1500' }, 40_000);
    expect(await eventually(async () => ((await lockOf('cron/lost'))?.holders.length ?? 0) === 1, 20_000)).toBe(true);
    // An operator takes the lease away at the coordinator.
    const db = new Database(sb.db);
    try {
      db.prepare('DELETE FROM leasehold_locks WHERE key = ?').run('cron/lost');
    } finally {
      db.close();
    }
    const done = await job;
    expect(done.code).toBe(143); // 128 + SIGTERM: the job was stopped
    expect(done.stderr).toContain('cron-wrapper: lease on cron/lost lost; stopping the command\n');
  });
});

describe('examples/http/client.py (standard library only)', () => {
  it('takes, renews and releases leases; its fence takes the successor’s write and refuses the paused worker’s stale token', async () => {
    const store = join(sb.dir, 'fenced.db');
    const ran = await run('python3', [CLIENT_PY, 'demo', '--service', url, '--db', store, '--key', 'docs/42']);
    expect(ran.stderr).toBe('');
    expect(ran.code).toBe(0);
    expect(ran.stdout).toBe(
      [
        'holder: token 1',
        'holder: still valid after 2.5 ttls: True',
        'holder: wrote under token 1',
        'holder: released',
        'zombie: token 2, then paused (no renewals)',
        'successor: token 3',
        'successor: wrote under token 3',
        'zombie: still valid? False',
        'zombie: refused by the fence: token 2 < 3',
        "document: 'written by the successor' (token 3)",
        '',
      ].join('\n'),
    );
    // The service: every lease released (the zombie's expired), nothing held or waiting.
    expect(await lockOf('docs/42')).toBeUndefined();
    expect((await http(url, 'POST', '/v1/sequencers/check', { sequencer: `lh1.e.3.${Buffer.from('docs/42').toString('base64url')}` })).body).toMatchObject({
      valid: false,
      key: 'docs/42',
    });
    // The fence's own store: the mark is the successor's, and a stale token still changes nothing.
    const db = new Database(store, { readonly: true });
    try {
      expect(db.prepare('SELECT token FROM marks WHERE resource = ?').get('docs/42')).toEqual({ token: 3 });
      expect(db.prepare('SELECT body, token FROM documents WHERE id = ?').get('docs/42')).toEqual({ body: 'written by the successor', token: 3 });
    } finally {
      db.close();
    }
    const stale = await run('python3', [
      '-c',
      `import sys; sys.path.insert(0, ${JSON.stringify(join(ROOT, 'examples/http'))})
from client import FencedStore, StaleToken
store = FencedStore(${JSON.stringify(store)})
try:
    store.write("docs/42", "2", "late")
except StaleToken as e:
    print("refused:", e)
store.write("docs/42", "3", "same holder again")
print(store.read("docs/42"))`,
    ]);
    expect(stale.stderr).toBe('');
    expect(stale.stdout).toBe("refused: token 2 < 3\n('same holder again', 3)\n");
  });
});

function escapeRegExp(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}

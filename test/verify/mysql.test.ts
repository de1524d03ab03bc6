// `leasehold verify` against MySQL / MariaDB: the shared test server as a user's own deployment (the
// resource's rows are keyed by the run id and deleted at the end; crash is not applicable, verify
// did not start it), its control run, and `--fence mysql` behind another coordinator.
import mysql from 'mysql2/promise';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { killAll, requireBuild, runCli, sandbox, type Sandbox } from '../cli/helpers.js';
import { MYSQL_URL, uniqueName } from '../helpers/env.js';
import { expectPass, faultCount, killLeftovers, verify, type VerifyRun } from './helpers.js';

let sb: Sandbox;
const runs: VerifyRun[] = [];
/** The coordinator's lease tables get a name of this file's own (`?table=`), dropped at the end. */
const table = uniqueName('lh_verify');
const coordinatorUrl = `${MYSQL_URL}${MYSQL_URL.includes('?') ? '&' : '?'}table=${table}`;

beforeAll(requireBuild);
beforeEach(() => {
  sb = sandbox();
});
afterEach(() => {
  killAll();
  for (const r of runs.splice(0)) killLeftovers(r.marker, sb.dir);
  sb.cleanup();
});
afterAll(async () => {
  // Whatever the backend made under that name: its tables (and any routines named after them).
  const c = await mysql.createConnection({ uri: MYSQL_URL });
  try {
    const like = `${table}%`;
    const [tables] = await c.query('SELECT table_name AS n FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name LIKE ?', [like]);
    const [routines] = await c.query(
      'SELECT routine_name AS n, routine_type AS t FROM information_schema.routines WHERE routine_schema = DATABASE() AND routine_name LIKE ?',
      [like],
    );
    for (const r of routines as { n: string; t: string }[]) await c.query(`DROP ${r.t} IF EXISTS \`${r.n}\``);
    // Foreign key checks off for this session: the tables may reference each other.
    await c.query('SET foreign_key_checks = 0');
    if ((tables as unknown[]).length > 0) await c.query(`DROP TABLE IF EXISTS ${(tables as { n: string }[]).map((t) => `\`${t.n}\``).join(', ')}`);
  } finally {
    await c.end();
  }
});

/** Rows of the verify tables that belong to run `id` (all three must be empty after a run). */
async function rowsLeft(id: string): Promise<Record<string, number>> {
  const c = await mysql.createConnection({ uri: MYSQL_URL });
  try {
    const left: Record<string, number> = {};
    for (const t of ['leasehold_verify_counters', 'leasehold_verify_log', 'leasehold_verify_fences']) {
      const [exists] = await c.query('SELECT 1 FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?', [t]);
      if ((exists as unknown[]).length === 0) continue;
      const [rows] = await c.query(`SELECT COUNT(*) AS n FROM ${t} WHERE resource LIKE ?`, [`leasehold-verify/${id}/%`]);
      left[t] = Number((rows as { n: number }[])[0]!.n);
    }
    return left;
  } finally {
    await c.end();
  }
}

const runIdOf = (r: VerifyRun): string => /run ([0-9a-f]{8}),/.exec(r.stdout)![1]!;

describe('leasehold verify on MySQL / MariaDB', () => {
  it('your own MariaDB (the shared server): passes with pause, delay and clock (crash: not applicable), the resource in MariaDB behind mysqlFence, and deletes what it wrote (storage layout: its tables are read)', async () => {
    const r = await verify(['--url', coordinatorUrl, '--duration', '5s', '--ttl', '400ms', '--seed', '5'], sb);
    runs.push(r);
    expectPass(r, sb);
    expect(r.stdout).toMatch(/^ {2}resource {5}mysql: mysql:\/\/.*; writes through the fence \(mysqlFence\)$/m);
    expect(faultCount(r, 'pause')).toBeGreaterThanOrEqual(1);
    expect(faultCount(r, 'delay')).toBeGreaterThanOrEqual(1);
    expect(r.stdout).toMatch(/crash n\/a \(verify did not start the coordinator/);
    // mysql2 warns on stderr about options it does not know (verify's own connections write to its stderr): ?table= never reaches it.
    expect(r.stderr).not.toMatch(/Ignoring invalid configuration option/);
    const left = await rowsLeft(runIdOf(r));
    expect(Object.keys(left).sort()).toEqual(['leasehold_verify_counters', 'leasehold_verify_fences', 'leasehold_verify_log']);
    expect(left).toEqual({ leasehold_verify_counters: 0, leasehold_verify_fences: 0, leasehold_verify_log: 0 });
  }, 120_000);

  it('the control run (--no-fence) against MariaDB fails: lost updates, named', async () => {
    const r = await verify(['--url', coordinatorUrl, '--duration', '5s', '--ttl', '400ms', '--seed', '5', '--nemesis', 'pause', '--no-fence'], sb);
    runs.push(r);
    expect(r.code, `${r.stdout}\n${r.stderr}`).toBe(1);
    expect(r.stdout).toMatch(/CONTROL RUN \(--no-fence\)/);
    expect(r.verdicts['no lost update'], r.stdout).toBe('FAIL');
    expect(r.stdout).toMatch(/^ {6}- lost update: /m);
    expect(await rowsLeft(runIdOf(r))).toMatchObject({ leasehold_verify_counters: 0, leasehold_verify_log: 0 });
  }, 120_000);

  it('--fence mysql behind another coordinator (SQLite): the resource in MariaDB, its traffic delayed, passes', async () => {
    const r = await verify(
      [
        '--url',
        'sqlite:./locks.db',
        '--fence',
        'mysql',
        '--fence-url',
        MYSQL_URL,
        '--duration',
        '4s',
        '--ttl',
        '400ms',
        '--seed',
        '5',
        '--nemesis',
        'pause,delay,clock',
      ],
      sb,
    );
    runs.push(r);
    expectPass(r, sb);
    expect(r.stdout).toMatch(/^ {2}resource {5}mysql: mysql:\/\/.*; writes through the fence \(mysqlFence\)$/m);
    // Only the resource is reached over TCP here: the delay nemesis applies through MariaDB's traffic alone.
    expect(faultCount(r, 'delay')).toBeGreaterThanOrEqual(1);
    expect(await rowsLeft(runIdOf(r))).toEqual({ leasehold_verify_counters: 0, leasehold_verify_fences: 0, leasehold_verify_log: 0 });
  }, 120_000);

  it('bad --fence mysql arguments exit 64 with a usage line, before starting anything', async () => {
    const cases: [string[], RegExp][] = [
      [['--url', 'local:sqlite', '--fence', 'mysql'], /--fence mysql needs --fence-url/],
      [
        ['--url', 'local:sqlite', '--fence', 'mysql', '--fence-url', 'redis://127.0.0.1:6379'],
        /--fence-url must be a mysql:\/\/ \(or mariadb:\/\/\) URL for --fence mysql/,
      ],
      [['--url', 'local:sqlite', '--fence', 'mysql', '--fence-url', 'mysql://root@127.0.0.1:3306'], /--fence-url: .*names no database/],
      [['--url', 'mysql://root@127.0.0.1:3306/'], /--url: .*names no database/],
      [['--url', 'local:sqlite', '--fence', 'mysql', '--no-fence'], /--no-fence and --fence do not go together/],
    ];
    for (const [args, message] of cases) {
      const r = await runCli(['verify', ...args], sb, { timeoutMs: 30_000, env: { LEASEHOLD_URL: '' } });
      expect(r.code, `${args.join(' ')}\n${r.stderr}`).toBe(64);
      expect(r.stderr, args.join(' ')).toMatch(message);
      expect(r.errLines.at(-1), args.join(' ')).toMatch(/^usage: leasehold verify --url URL/);
    }
  }, 60_000);

  it('a MariaDB that cannot be reached exits 69', async () => {
    const r = await verify(
      ['--url', 'sqlite:./locks.db', '--fence', 'mysql', '--fence-url', 'mysql://root@127.0.0.1:1/test', '--duration', '2s', '--ttl', '300ms'],
      sb,
    );
    runs.push(r);
    expect(r.code, r.stderr).toBe(69);
    expect(r.errLines[0]).toMatch(/^leasehold: resource store \(mysql at mysql:\/\/\*\*\*@127\.0\.0\.1:1\/test\) unavailable: /);
  }, 60_000);
});

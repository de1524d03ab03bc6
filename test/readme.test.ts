/** The README stays true: every ```js example and CLI line runs against the built package and prints what it should, and the error table matches the code. */
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import ts from 'typescript';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startCluster, type Cluster } from './fixtures/etcd-cluster.mjs';
import { ERROR_CODES } from '../src/index.js';
import * as errors from '../src/core/errors.js';

const root = new URL('..', import.meta.url).pathname;
const readme = readFileSync(join(root, 'README.md'), 'utf8');
const examples = [...readme.matchAll(/```js\n([\s\S]*?)```/g)].map((m) => m[1]!);
/** Shell examples of the CLI (`npx leasehold …` lines), run with the built bin. */
const commands = [...readme.matchAll(/```sh\n([\s\S]*?)```/g)].flatMap((m) => m[1]!.split('\n').filter((line) => line.startsWith('npx leasehold ')));

/** The examples name their servers the way users' apps do; point those names at the test servers. */
const exampleEnv: NodeJS.ProcessEnv = {
  ...process.env,
  LEASEHOLD_URL: '',
  DATABASE_URL: process.env.LEASEHOLD_TEST_PG_URL ?? 'postgres://postgres@127.0.0.1:5432/test',
  MYSQL_URL: process.env.LEASEHOLD_TEST_MYSQL_URL ?? 'mysql://root@127.0.0.1:3306/test',
  REDIS_URL: process.env.LEASEHOLD_TEST_REDIS_URL ?? 'redis://127.0.0.1:6379',
};

/**
 * What each example prints, found by a phrase of its code (so reordering the README is fine, and a
 * new example fails until its output is pinned here). Exact where the output is deterministic (each
 * example runs in a fresh directory, so the embedded store starts empty); token numbers from shared
 * servers (PostgreSQL, MariaDB, Redis, etcd) grow from run to run, so those are patterns.
 */
const EXPECTED_OUTPUT: [phrase: string, output: string | RegExp][] = [
  ['sqliteFence(db)', 'document 42, recomputed\n'],
  // parseSequencer's result, then tryAcquire on the key the example holds: busy, so null
  ['parseSequencer(lease.sequencer)', "{ version: 1, key: 'tenant:42:export', mode: 'exclusive', token: 1n }\nnull\n"],
  ['postgresFence(pool)', /^exported under token [1-9]\d*\n$/],
  ['mysqlFence(pool)', /^invoiced under token [1-9]\d*\n$/],
  ['redisFence(client', /^written under token [1-9]\d*\n$/],
  ['etcdBackend({ hosts })', /^leader under token [1-9]\d* \(ttl 2000 ms\)\n$/],
  ['api:quota', "[ 1n, 2n, 3n ]\nnull\n3 [ 'worker-1', 'worker-2', 'worker-3' ]\n"],
  ["election('cluster:leader'", 'leading in term 1\nhttp://10.0.0.5:8080\nnull\n'],
  ["tryAcquire('nightly-report', { minHoldMs", 'null\n'],
  ['cronCoordinator(locks', 'one instance ran it, token 1\nthe other skipped it: not-elected\n'],
  ['fastifyIdempotency', '201 /charges/1 null {"charge":1,"amount":500}\n201 /charges/1 true {"charge":1,"amount":500}\n'],
  [
    "idem.run('charge:order-17'",
    "{ value: { charge: 1, token: '1' }, replayed: false, token: 1n }\n{ value: { charge: 1, token: '1' }, replayed: true, token: 1n }\n",
  ],
  ['instrumentLocks(locks', 'leasehold_acquire_total{backend="memory",key="tenant:*:export",outcome="acquired"} 1\n'],
];
const CLI_OUTPUT: [prefix: string, output: string | RegExp][] = [
  ['npx leasehold run nightly-report ', 'report run under token 1\n'],
  ['npx leasehold verify ', /\nverdict: PASS \(every check passed\)\n$/],
];

/** The major of the oldest Node the package supports (package.json `engines`, `>=20.4.0`), whose syntax every example must keep to. */
const MIN_NODE = Number(
  /^>=(\d+)(?:\.\d+){0,2}$/.exec((JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { engines: { node: string } }).engines.node)?.[1],
);
/** The newest ECMAScript edition each supported Node runs in full (Node 20: ES2023). */
const TARGET_OF_NODE: Record<number, ts.ScriptTarget> = { 20: ts.ScriptTarget.ES2023 };

/**
 * Syntax in `code` that the oldest supported Node cannot parse, found whatever Node runs this test:
 * TypeScript, transpiling to that Node's edition, has to emit a helper for it (`await using` needs
 * __addDisposableResource, decorators __esDecorate, …). Returns the helpers' names.
 */
function syntaxTooNew(code: string): string[] {
  const target = TARGET_OF_NODE[MIN_NODE];
  if (target === undefined) throw new Error(`engines.node is >=${MIN_NODE}: add its ECMAScript edition to TARGET_OF_NODE`);
  const out = ts.transpileModule(code, { compilerOptions: { target, module: ts.ModuleKind.ESNext } }).outputText;
  return [...out.matchAll(/^var (__\w+) = \(this && this\.\1\)/gm)].map((m) => m[1]!);
}

function expectOutput(table: [string, string | RegExp][], text: string, matches: (text: string, key: string) => boolean, out: string): void {
  const found = table.filter(([key]) => matches(text, key));
  expect(
    found.map(([key]) => key),
    'exactly one expected output in the test for this README example',
  ).toHaveLength(1);
  const expected = found[0]![1];
  if (typeof expected === 'string') expect(out).toBe(expected);
  else expect(out).toMatch(expected);
}

describe('README', () => {
  // The etcd example needs a member: one of the test's own, on free ports.
  let etcd: Cluster | undefined;
  beforeAll(async () => {
    etcd = await startCluster({ members: 1 });
    exampleEnv.ETCD_HOSTS = etcd.endpoints.join(',');
  }, 60_000);
  afterAll(async () => {
    await etcd?.stop();
  });

  it('has examples to run', () => {
    expect(examples.length).toBeGreaterThanOrEqual(2);
  });

  it(`finds syntax that Node ${MIN_NODE} cannot run (the check below can fail)`, () => {
    expect(syntaxTooNew('const lease = { async [Symbol.asyncDispose]() {} };\n{ await using l = lease; }')).toContain('__addDisposableResource');
    expect(syntaxTooNew('using x = { [Symbol.dispose]() {} };')).toContain('__addDisposableResource');
    expect(syntaxTooNew('const a = [1].findLast((x) => x > 0); const b = a?.toString() ?? 1_000n;')).toEqual([]);
  });

  it(`says, wherever it mentions \`await using\`, that Node ${MIN_NODE} cannot run it`, () => {
    const paragraphs = readme.split(/\n\s*\n/).filter((p) => p.includes('await using'));
    expect(paragraphs.length).toBeGreaterThan(0);
    for (const p of paragraphs) expect(p).toMatch(new RegExp(`SyntaxError[\\s\\S]*Node ${MIN_NODE}|Node ${MIN_NODE}[\\s\\S]*SyntaxError`));
  });

  examples.forEach((code, i) => {
    // Run below on whatever Node runs the tests; this holds them to the oldest one supported, so an
    // example with `await using` (a SyntaxError on Node 20) fails here even on a newer Node.
    it(`example ${i + 1} uses only syntax Node ${MIN_NODE} has`, () => {
      expect(syntaxTooNew(code)).toEqual([]);
    });

    it(`example ${i + 1} runs`, () => {
      // Inside the package directory, so `import 'leasehold'` resolves to this package (self-reference).
      mkdirSync(join(root, '.readme-run'), { recursive: true });
      const dir = mkdtempSync(join(root, '.readme-run', 'ex-'));
      try {
        writeFileSync(join(dir, 'example.mjs'), code);
        const out = execFileSync(process.execPath, ['example.mjs'], {
          cwd: dir,
          encoding: 'utf8',
          env: exampleEnv,
          stdio: ['ignore', 'pipe', 'pipe'],
          timeout: 60_000,
        });
        expectOutput(EXPECTED_OUTPUT, code, (c, phrase) => c.includes(phrase), out);
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    });
  });

  it('has CLI examples to run', () => {
    expect(commands.length).toBeGreaterThanOrEqual(1);
  });

  commands.forEach((line) => {
    it(`runs: ${line}`, () => {
      const dir = mkdtempSync(join(tmpdir(), 'leasehold-readme-'));
      try {
        const cli = join(root, 'dist', 'cli', 'main.js');
        const out = execFileSync('sh', ['-c', line.replace(/^npx leasehold /, `"${process.execPath}" "${cli}" `)], {
          cwd: dir,
          encoding: 'utf8',
          env: { ...process.env, LEASEHOLD_URL: '' },
          timeout: 60_000,
        });
        expectOutput(CLI_OUTPUT, line, (l, prefix) => l.startsWith(prefix), out);
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    });
  });

  it('documents every error code with its class, as the code defines them', () => {
    const instances = [
      new errors.AcquireTimeoutError('k', 1),
      new errors.LeaseLostError('k', 1n, 'expired'),
      new errors.StaleTokenError('r', 1n, 2n),
      new errors.InvalidArgumentError('ttlMs', 'bad'),
      new errors.BackendUnavailableError('sqlite', 'down'),
      new errors.PartialWriteError('r', 1n, 'committed by mutate'),
      new errors.ClosedError('Locks instance'),
      new errors.IdempotencyMismatchError('k'),
    ];
    expect(instances.map((e) => e.code).sort()).toEqual(Object.keys(ERROR_CODES).sort());
    for (const e of instances) {
      expect(readme).toContain(`| \`${e.code}\` | \`${e.name}\` | ${ERROR_CODES[e.code]} |`);
    }
  });
});

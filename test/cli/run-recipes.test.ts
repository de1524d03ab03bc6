// `leasehold run` with the recipes' flags, as real processes on a SQLite lease store: --limit N
// (a semaphore permit per instance: Consul's `lock -n`), --min-hold D (the key stays held after an
// early exit: ShedLock's lockAtLeastFor), --label TEXT (the grant's public label), their bad values.
import { afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { createLocks, type Locks } from '../../src/index.js';
import { sqliteBackend } from '../../src/sqlite/index.js';
import { CHILD, NODE, eventually, killAll, requireBuild, runCli, sandbox, startCli, type Sandbox } from './helpers.js';

let sb: Sandbox;
let locks: Locks | undefined;

/** A Locks instance of the test process on the same lease store as the command. */
function testLocks(): Locks {
  locks ??= createLocks({ backend: sqliteBackend({ path: sb.db }), holderName: 'test-holder' });
  return locks;
}

async function state(key: string) {
  return (await testLocks().inspect(key)).find((s) => s.key === key);
}

beforeAll(requireBuild);
beforeEach(() => {
  sb = sandbox();
});
afterEach(async () => {
  killAll();
  await locks?.close();
  locks = undefined;
  sb.cleanup();
});

describe('leasehold run --limit', () => {
  it('three instances of --limit 2: two run at once with tokens of their own, the third skips with --wait 0 or waits for a permit with --wait', async () => {
    const first = startCli(['run', 'gpu', '--limit', '2', '--label', 'first', '--', NODE, CHILD, 'wait'], sb);
    const second = startCli(['run', 'gpu', '--limit', '2', '--label', 'second', '--', NODE, CHILD, 'wait'], sb);
    await first.waitFor(/^ready$/m);
    await second.waitFor(/^ready$/m);
    const held = await state('gpu');
    expect(held?.limit).toBe(2);
    expect(held?.holders.map((h) => h.holder).sort()).toEqual(['first', 'second']);
    expect(new Set(held?.holders.map((h) => h.token)).size).toBe(2);

    // The third, --wait 0 (the cron case): skips with one line naming the permits' holders, without running COMMAND.
    const skipped = await runCli(['run', 'gpu', '--limit', '2', '--', NODE, CHILD, 'env'], sb);
    expect(skipped.code).toBe(75);
    expect(skipped.stdout).toBe('');
    expect(skipped.errLines).toHaveLength(1);
    expect(skipped.errLines[0]).toMatch(/^leasehold: gpu is busy \(all 2 permits held: by (first|second), token \d+; (first|second), token \d+\)$/);

    // The third, --wait: queues, and runs once a permit is given back, with a token of its own.
    const third = startCli(['run', 'gpu', '--limit', '2', '--wait', '20s', '--', NODE, CHILD, 'env'], sb);
    await eventually(async () => ((await state('gpu'))?.waiters ?? 0) > 0, 15_000, 'the third instance to queue for a permit');
    expect(third.stdout).toBe('');
    first.child.kill('SIGTERM'); // forwarded: the first COMMAND ends, its permit is released
    expect((await first.done).code).toBe(128 + 15);
    const r = await third.done;
    expect(r).toMatchObject({ code: 0, stderr: '' });
    const tokens = held!.holders.map((h) => h.token.toString());
    const got = (JSON.parse(r.stdout) as { token: string }).token;
    expect(tokens).not.toContain(got);
    expect(BigInt(got)).toBeGreaterThan(BigInt(tokens.reduce((a, b) => (BigInt(a) > BigInt(b) ? a : b))));
    second.child.kill('SIGTERM');
    await second.done;
  }, 60_000);

  it('a plain run on a key held by permits is busy', async () => {
    const permit = await testLocks().acquire('gpu', { ttlMs: 30_000, limit: 2 });
    const r = await runCli(['run', 'gpu', '--', NODE, CHILD, 'exit', '0'], sb);
    expect(r.code).toBe(75);
    await permit.release();
  });
});

describe('leasehold run --min-hold', () => {
  it('keeps the key after a COMMAND that exits at once: a second run right after skips (75), one after the hold runs', async () => {
    const started = Date.now();
    const first = await runCli(['run', 'nightly', '--min-hold', '2s', '--', NODE, CHILD, 'exit', '0'], sb);
    expect(first).toMatchObject({ code: 0, stderr: '' });
    const again = await runCli(['run', 'nightly', '--wait', '0', '--', NODE, CHILD, 'exit', '0'], sb);
    // Only meaningful while the hold lasts: on a machine so slow that 2 s passed, the key may be free.
    if (Date.now() - started < 1_800) {
      expect(again.code).toBe(75);
      expect(again.errLines).toHaveLength(1);
      expect(again.errLines[0]).toMatch(/^leasehold: nightly is busy \(held by /);
    }
    // The hold ends by expiry: the key frees itself about 2 s after the grant, with no process left holding it.
    await eventually(async () => ((await state('nightly'))?.holders.length ?? 0) === 0, 10_000, 'the hold to end');
    expect(Date.now() - started).toBeGreaterThanOrEqual(1_900);
    const later = await runCli(['run', 'nightly', '--', NODE, CHILD, 'env'], sb);
    expect(later.code).toBe(0);
    expect(JSON.parse(later.stdout)).toMatchObject({ token: '2' });
  }, 30_000);

  it('a hold longer than --ttl: leasehold stays until one ttl is left, and the key is held for the whole hold', async () => {
    const started = Date.now();
    const first = await runCli(['run', 'nightly', '--ttl', '500ms', '--min-hold', '2s', '--', NODE, CHILD, 'exit', '0'], sb);
    expect(first).toMatchObject({ code: 0, stderr: '' });
    expect(Date.now() - started).toBeGreaterThanOrEqual(1_400); // stayed until 2 s − 500 ms after the grant
    const held = await state('nightly');
    if (Date.now() - started < 1_900) expect(held?.holders).toHaveLength(1);
    await eventually(async () => ((await state('nightly'))?.holders.length ?? 0) === 0, 10_000, 'the hold to end');
    expect(Date.now() - started).toBeGreaterThanOrEqual(1_900);
  }, 30_000);
});

describe('leasehold run --label', () => {
  it("publishes the label as the grant's holder (ls shows it); the default is the holder name", async () => {
    const labelled = startCli(['run', 'job', '--label', 'web-3 nightly', '--', NODE, CHILD, 'wait'], sb);
    await labelled.waitFor(/^ready$/m);
    const ls = await runCli(['ls'], sb);
    expect(ls.stdout).toMatch(/^job +exclusive +- +1 +web-3 nightly +/m);
    labelled.child.kill('SIGTERM');
    await labelled.done;
    const plain = startCli(['run', 'job', '--', NODE, CHILD, 'wait'], sb);
    await plain.waitFor(/^ready$/m);
    expect((await state('job'))?.holders[0]?.holder).not.toBe('web-3 nightly');
    plain.child.kill('SIGTERM');
    await plain.done;
  }, 30_000);
});

describe('leasehold run: bad recipe flags', () => {
  it.each([
    { why: '--limit 0', args: ['--limit', '0'], message: /--limit.*expected an integer from 1 to 10000, got "0"/ },
    { why: '--limit above 10,000', args: ['--limit', '10001'], message: /--limit.*expected an integer from 1 to 10000, got "10001"/ },
    { why: '--limit not a number', args: ['--limit', 'many'], message: /--limit.*got "many"/ },
    { why: '--limit fractional', args: ['--limit', '1.5'], message: /--limit.*got "1.5"/ },
    { why: '--limit with --mode', args: ['--limit', '2', '--mode', 'exclusive'], message: /--limit and --mode do not go together/ },
    { why: '--min-hold bad duration', args: ['--min-hold', 'soon'], message: /--min-hold.*expected a duration/ },
    { why: '--min-hold negative', args: ['--min-hold', '-5s'], message: /--min-hold.*must not be negative/ },
    { why: '--label empty', args: ['--label', ''], message: /--label.*expected 1–200 printable ASCII characters/ },
    { why: '--label too long', args: ['--label', 'x'.repeat(201)], message: /--label.*expected 1–200 printable ASCII characters/ },
    { why: '--label with a newline', args: ['--label', 'a\nb'], message: /--label.*expected 1–200 printable ASCII characters/ },
  ])('exits 64 with the usage line: $why', async ({ args, message }) => {
    const r = await runCli(['run', 'job', ...args, '--', NODE, CHILD, 'exit', '0'], sb);
    expect(r.code).toBe(64);
    expect(r.stderr).toMatch(message);
    expect(r.errLines.at(-1)).toMatch(/^usage: leasehold run KEY .*\[--limit N\] \[--min-hold D\] \[--label TEXT\]/);
    expect(r.stdout).toBe('');
  });
});

/** createLocks() with no backend: SQLite at ./leasehold.db, or the URL in LEASEHOLD_URL. */
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { tempDir } from '../helpers/env.js';

const entry = new URL('../../dist/index.js', import.meta.url).href;
const script = `
  const { createLocks } = await import(${JSON.stringify(entry)});
  const locks = createLocks();
  const lease = await locks.acquire('default-store', { ttlMs: 1000 });
  console.log(lease.token.toString());
  await locks.close();
`;

describe('the embedded default', () => {
  const dir = tempDir();
  afterAll(() => dir.cleanup());
  const run = (env: Record<string, string | undefined>) =>
    execFileSync(process.execPath, ['--input-type=module', '-e', script], {
      cwd: dir.path,
      env: { ...process.env, LEASEHOLD_URL: undefined, ...env },
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'pipe'],
    }).trim();

  it('uses ./leasehold.db in the working directory, durably across processes', () => {
    expect(run({})).toBe('1');
    expect(existsSync(join(dir.path, 'leasehold.db'))).toBe(true);
    expect(run({})).toBe('2');
  });

  it('follows LEASEHOLD_URL', () => {
    expect(run({ LEASEHOLD_URL: `sqlite:${join(dir.path, 'other.db')}` })).toBe('1');
    expect(existsSync(join(dir.path, 'other.db'))).toBe(true);
    expect(run({ LEASEHOLD_URL: 'memory:' })).toBe('1');
  });

  it('a bad LEASEHOLD_URL is an InvalidArgumentError at createLocks, naming the URL', () => {
    let message = '';
    try {
      run({ LEASEHOLD_URL: 'mongodb://x' });
    } catch (error) {
      message = String((error as { stderr?: string }).stderr);
    }
    expect(message).toContain('InvalidArgumentError');
    expect(message).toContain('mongodb://x');
  });

  it('never prints credentials from a URL', () => {
    let message = '';
    try {
      run({ LEASEHOLD_URL: 'mongodb://admin:s3cret@db:27017/x' });
    } catch (error) {
      message = String((error as { stderr?: string }).stderr);
    }
    expect(message).toContain('mongodb://***@db:27017/x');
    expect(message).not.toContain('s3cret');
  });
});

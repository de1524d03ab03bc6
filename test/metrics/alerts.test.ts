/**
 * The alerting rules in examples/prometheus/alerts.yml, checked and unit-tested by Prometheus's own
 * promtool (Debian's `prometheus` package; scripts/test-services.mjs installs it): each rule fires
 * on one series and stays quiet on another (examples/prometheus/alerts.test.yml).
 */
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const dir = fileURLToPath(new URL('../../examples/prometheus/', import.meta.url));
const promtool = process.env.LEASEHOLD_TEST_PROMTOOL ?? 'promtool';

function run(args: string[]): { status: number | null; out: string } {
  const r = spawnSync(promtool, args, { cwd: dir, encoding: 'utf8' });
  if (r.error) throw new Error(`cannot run ${promtool} (install Debian's prometheus package): ${r.error.message}`);
  return { status: r.status, out: `${r.stdout}${r.stderr}` };
}

describe('examples/prometheus/alerts.yml', () => {
  it('is valid (promtool check rules)', () => {
    const r = run(['check', 'rules', 'alerts.yml']);
    expect(r.out).toContain('SUCCESS: 4 rules found');
    expect(r.status).toBe(0);
  });

  it('passes its unit tests (promtool test rules): each rule fires on one series and stays quiet on another', () => {
    const r = run(['test', 'rules', 'alerts.test.yml']);
    expect(r.out).toContain('SUCCESS');
    expect(r.status).toBe(0);
  });
});

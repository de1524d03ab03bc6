/**
 * The coordinator's sequencer reaches the lease (issue 19 point 4): a backend that answers a grant
 * with `sequencer` (the lock service, signing with `--sequencer-key`) gives the lease that
 * sequencer, in `lease.sequencer` and `toJSON()`, so a fence with `sequencerKey` accepts what a
 * client hands on. One that names another key, mode or token is ignored (core formats its own): a
 * backend's answer cannot give a lease another grant's sequencer.
 */
import { randomBytes } from 'node:crypto';
import { afterEach, describe, expect, it } from 'vitest';
import type { AcquireRequest, AcquireResult, Backend } from '../../src/core/backend.js';
import { Locks } from '../../src/core/locks.js';
import { signSequencer, verifySequencer } from '../../src/core/sequencer-sign.js';
import { formatSequencer } from '../../src/core/token.js';
import { memoryBackend } from '../../src/memory/index.js';
import { memoryFence } from '../../src/memory/fence.js';

const secret = randomBytes(32);

/** The memory backend, its grants answered with the sequencer `issue` makes of each request and grant. */
function issuing(issue: (req: AcquireRequest, token: bigint) => string | undefined): Backend {
  const inner = memoryBackend();
  return {
    ...inner,
    acquire: async (req): Promise<AcquireResult> => {
      const answer = await inner.acquire(req);
      if (!answer.granted) return answer;
      const sequencer = issue(req, answer.token);
      return sequencer === undefined ? answer : { ...answer, sequencer };
    },
  };
}

const signed = (req: AcquireRequest, token: bigint) => signSequencer(formatSequencer(req.key, req.mode, token), secret);

describe("the coordinator's sequencer", () => {
  const clients: Locks[] = [];
  const client = (backend: Backend): Locks => {
    const locks = new Locks({ backend });
    clients.push(locks);
    return locks;
  };
  afterEach(async () => {
    await Promise.all(clients.splice(0).map((l) => l.close()));
  });

  it('a signed sequencer the coordinator issued is the lease’s, in toJSON too, and verifies', async () => {
    const issued: string[] = [];
    const locks = client(
      issuing((req, token) => {
        const s = signed(req, token);
        issued.push(s);
        return s;
      }),
    );
    const lease = await locks.acquire('doc:1', { ttlMs: 5_000 });
    expect(issued).toHaveLength(1);
    expect(lease.sequencer).toBe(issued[0]);
    expect(lease.sequencer.startsWith('lh1s.')).toBe(true);
    expect(lease.toJSON()).toEqual({ key: 'doc:1', token: lease.token.toString(), mode: 'exclusive', sequencer: issued[0] });
    expect(JSON.parse(JSON.stringify(lease)).sequencer).toBe(issued[0]);
    expect(verifySequencer(lease.sequencer, secret)).toEqual({ version: 1, key: 'doc:1', mode: 'exclusive', token: lease.token });

    // A fence that takes only signed sequencers accepts the lease's.
    const fence = memoryFence({ sequencerKey: secret });
    expect(await fence.write('doc', lease.sequencer, () => 'written')).toBe('written');
    await lease.release();

    const shared = await locks.acquire('doc:1', { mode: 'shared', ttlMs: 5_000 });
    expect(shared.sequencer).toBe(issued[1]);
    expect(verifySequencer(shared.sequencer, secret)).toMatchObject({ mode: 'shared', token: shared.token });
  });

  it('through withLock and tryAcquire as well', async () => {
    const locks = client(issuing(signed));
    const seen = await locks.withLock('job', { ttlMs: 5_000 }, async (lease) => lease.sequencer);
    expect(verifySequencer(seen, secret).key).toBe('job');
    const lease = await locks.tryAcquire('job2', { ttlMs: 5_000 });
    expect(verifySequencer(lease!.sequencer, secret)).toMatchObject({ key: 'job2', token: lease!.token });
  });

  it('one that names another key, mode or token, or is not a sequencer, is ignored: the lease formats its own', async () => {
    const cases: [string, (req: AcquireRequest, token: bigint) => string][] = [
      ['another token', (req, token) => signSequencer(formatSequencer(req.key, req.mode, token + 1n), secret)],
      ['an earlier token', (req, token) => formatSequencer(req.key, req.mode, token > 1n ? token - 1n : token + 5n)],
      ['another key', (req, token) => signSequencer(formatSequencer(`${req.key}x`, req.mode, token), secret)],
      ['another mode', (req, token) => signSequencer(formatSequencer(req.key, req.mode === 'shared' ? 'exclusive' : 'shared', token), secret)],
      ['garbage', () => 'not a sequencer'],
      ['an empty string', () => ''],
      ['a bare token', (_req, token) => token.toString()],
    ];
    for (const [what, issue] of cases) {
      const locks = client(issuing(issue));
      const lease = await locks.acquire(`k:${what}`, { ttlMs: 5_000 });
      const own = formatSequencer(lease.key, lease.mode, lease.token);
      expect(lease.sequencer, what).toBe(own);
      expect(lease.toJSON().sequencer, what).toBe(own);
      await lease.release();
    }
  });

  it('an unsigned one that names the grant is used as it is; none at all, core formats one', async () => {
    const unsigned = await client(issuing((req, token) => formatSequencer(req.key, req.mode, token))).acquire('a', { ttlMs: 5_000 });
    expect(unsigned.sequencer).toBe(formatSequencer('a', 'exclusive', unsigned.token));
    const none = await client(issuing(() => undefined)).acquire('b', { ttlMs: 5_000 });
    expect(none.sequencer).toBe(formatSequencer('b', 'exclusive', none.token));
  });
});

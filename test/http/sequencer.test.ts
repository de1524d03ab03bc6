/**
 * Signed sequencers end to end (issue 19 point 4): a Node client using a lock service started with
 * a sequencer key (httpBackend) gets the server's signed sequencer in `lease.sequencer`, not one core
 * formats, so it verifies offline with the key (`verifySequencer`), and a SQLite or PostgreSQL fence
 * given the key (`sequencerKey`) accepts it and refuses an unsigned, forged or altered one with
 * nothing written. Plain, session, shared, tryAcquire and long-poll grants; HMAC and Ed25519 keys.
 */
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { InvalidArgumentError } from '../../src/core/errors.js';
import type { Fence } from '../../src/core/fence.js';
import type { Lease } from '../../src/core/lease.js';
import { Locks } from '../../src/core/locks.js';
import { signSequencer, verifySequencer } from '../../src/core/sequencer-sign.js';
import { formatSequencer } from '../../src/core/token.js';
import { httpBackend } from '../../src/http/index.js';
import { createLocks } from '../../src/index.js';
import { memoryBackend } from '../../src/memory/index.js';
import { type PgClient, postgresFence } from '../../src/postgres/index.js';
import { type RunningLockServer, startLockServer } from '../../src/serve/index.js';
import { type SqliteDatabase, sqliteFence } from '../../src/sqlite/index.js';
import { loadSequencerKey } from '../../src/util/sequencer-key.js';
import { PG_URL, tempDir, uniqueName } from '../helpers/env.js';

/** A lock service over the memory backend (with sessions) signing with the key file `keyText`. */
async function signingServer(keyText: string, dir: string): Promise<{ server: RunningLockServer; close: () => Promise<void> }> {
  const file = join(dir, `seq-${randomBytes(4).toString('hex')}.key`);
  writeFileSync(file, keyText);
  const coordinator = memoryBackend({ sessions: true });
  const server = await startLockServer({ backend: coordinator, port: 0, sequencerKey: loadSequencerKey(file) });
  return {
    server,
    close: async () => {
      await server.close();
      await coordinator.close();
    },
  };
}

/** A fenced write under `sequencer`: 'written', or the error the fence refused it with. */
async function fencedWrite<Tx>(fence: Fence<Tx>, resource: string, sequencer: string, write: (tx: Tx) => unknown): Promise<'written' | unknown> {
  try {
    // As it is: sqliteFence runs mutate synchronously, and a promise back from it is refused.
    await fence.write(resource, sequencer, (tx) => write(tx));
    return 'written';
  } catch (error) {
    return error;
  }
}

/** Forgeries of a lease's sequencer: unsigned, signed with another key, a higher token under its signature. */
function forgeriesOf(lease: Lease): [string, string][] {
  const sig = lease.sequencer.slice(lease.sequencer.lastIndexOf('.') + 1);
  const higher = formatSequencer(lease.key, lease.mode, lease.token + 1n);
  return [
    ['unsigned', higher],
    ['signed with another key', signSequencer(higher, randomBytes(32))],
    ['a higher token under the lease’s signature', `${higher.replace(/^lh1\./, 'lh1s.')}.${sig}`],
  ];
}

describe('a Node client of a signing lock service (HMAC)', () => {
  const dir = tempDir();
  const secret = `# lock service key\n${randomBytes(32).toString('hex')}\n`;
  let service: Awaited<ReturnType<typeof signingServer>>;
  const opened: Locks[] = [];
  const client = (): Locks => {
    const locks = new Locks({ backend: httpBackend({ url: service.server.url }) });
    opened.push(locks);
    return locks;
  };
  const schema = uniqueName('lh_seqhttp');
  const pool = new pg.Pool({ connectionString: PG_URL, max: 2 });

  beforeAll(async () => {
    service = await signingServer(secret, dir.path);
    await pool.query(`CREATE SCHEMA ${schema}`);
    await pool.query(`CREATE TABLE ${schema}.items (resource text NOT NULL, value text NOT NULL)`);
  });
  afterAll(async () => {
    await Promise.allSettled(opened.map((l) => l.close()));
    await service?.close();
    await pool.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
    await pool.end();
    dir.cleanup();
  });

  it('lease.sequencer is the server’s signed one: it verifies with the key file and names the grant', async () => {
    const locks = client();
    const lease = await locks.acquire('tenant:7:export', { ttlMs: 10_000 });
    expect(lease.sequencer).toMatch(/^lh1s\.e\.[1-9][0-9]*\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]{43}$/);
    expect(verifySequencer(lease.sequencer, secret)).toEqual({ version: 1, key: 'tenant:7:export', mode: 'exclusive', token: lease.token });
    expect(lease.toJSON().sequencer).toBe(lease.sequencer);
    await lease.release();

    const shared = await locks.acquire('docs', { mode: 'shared', ttlMs: 10_000 });
    expect(verifySequencer(shared.sequencer, secret)).toMatchObject({ key: 'docs', mode: 'shared', token: shared.token });
    const tried = await locks.tryAcquire('tried', { ttlMs: 10_000 });
    expect(verifySequencer(tried!.sequencer, secret)).toMatchObject({ key: 'tried', token: tried!.token });
    // Through createLocks and an http:// URL too.
    const byUrl = createLocks({ url: service.server.url });
    opened.push(byUrl);
    const viaUrl = await byUrl.acquire('by-url', { ttlMs: 10_000 });
    expect(verifySequencer(viaUrl.sequencer, secret)).toMatchObject({ key: 'by-url', token: viaUrl.token });
    await Promise.all([shared.release(), tried!.release(), viaUrl.release()]);
  });

  it('a waiter granted at the end of a long poll gets a signed sequencer too', async () => {
    const locks = client();
    const holder = await locks.acquire('queue', { ttlMs: 10_000 });
    const waiting = client().acquire('queue', { ttlMs: 10_000, waitMs: 20_000 });
    setTimeout(() => void holder.release(), 300);
    const lease = await waiting;
    expect(lease.token).toBeGreaterThan(holder.token);
    expect(verifySequencer(lease.sequencer, secret)).toMatchObject({ key: 'queue', token: lease.token });
    await lease.release();
  });

  it('a SQLite fence with sequencerKey accepts the lease’s sequencer and refuses forged ones, nothing written', async () => {
    const db = new Database(':memory:');
    try {
      db.exec('CREATE TABLE items (resource TEXT NOT NULL, value TEXT NOT NULL)');
      const fence = sqliteFence(db, { sequencerKey: secret });
      const lease = await client().acquire('sqlite:row', { ttlMs: 10_000 });
      const insert = (value: string) => (tx: SqliteDatabase) => tx.prepare('INSERT INTO items VALUES (?, ?)').run('row', value);
      expect(await fencedWrite(fence, 'row', lease.sequencer, insert('genuine'))).toBe('written');
      for (const [what, forged] of forgeriesOf(lease)) {
        const refused = await fencedWrite(fence, 'row', forged, insert(what));
        expect(refused, what).toBeInstanceOf(InvalidArgumentError);
        expect((refused as InvalidArgumentError).argument, what).toBe('token');
      }
      expect(db.prepare('SELECT value FROM items').all()).toEqual([{ value: 'genuine' }]);
      expect(await fence.highest('row')).toBe(lease.token);
      await lease.release();
    } finally {
      db.close();
    }
  });

  it('a PostgreSQL fence with sequencerKey accepts the lease’s sequencer and refuses forged ones, nothing written', async () => {
    const fence = postgresFence(pool, { schema, table: 'marks', sequencerKey: secret });
    const lease = await client().acquire('pg:row', { ttlMs: 10_000 });
    const insert = (value: string) => (tx: PgClient) => tx.query(`INSERT INTO ${schema}.items VALUES ($1, $2)`, ['row', value]);
    expect(await fencedWrite(fence, 'row', lease.sequencer, insert('genuine'))).toBe('written');
    for (const [what, forged] of forgeriesOf(lease)) {
      const refused = await fencedWrite(fence, 'row', forged, insert(what));
      expect(refused, what).toBeInstanceOf(InvalidArgumentError);
      expect((refused as InvalidArgumentError).argument, what).toBe('token');
    }
    expect((await pool.query(`SELECT value FROM ${schema}.items`)).rows).toEqual([{ value: 'genuine' }]);
    expect(await fence.highest('row')).toBe(lease.token);
    await lease.release();
  });
});

describe('a Node client of a lock service signing with an Ed25519 key', () => {
  it('lease.sequencer verifies with the public key alone, and a fence holding only the public key accepts it', async () => {
    const dir = tempDir();
    const { privateKey, publicKey } = generateKeyPairSync('ed25519');
    const publicPem = publicKey.export({ type: 'spki', format: 'pem' }) as string;
    const service = await signingServer(privateKey.export({ type: 'pkcs8', format: 'pem' }) as string, dir.path);
    const locks = new Locks({ backend: httpBackend({ url: service.server.url }) });
    const db = new Database(':memory:');
    try {
      const lease = await locks.acquire('ed', { ttlMs: 10_000 });
      expect(lease.sequencer).toMatch(/\.[A-Za-z0-9_-]{86}$/);
      expect(verifySequencer(lease.sequencer, publicPem)).toMatchObject({ key: 'ed', token: lease.token });
      const fence = sqliteFence(db, { sequencerKey: publicPem });
      expect(await fencedWrite(fence, 'r', lease.sequencer, () => {})).toBe('written');
      expect(await fencedWrite(fence, 'r', signSequencer(formatSequencer('ed', 'exclusive', lease.token + 1n), randomBytes(32)), () => {})).toBeInstanceOf(
        InvalidArgumentError,
      );
      await lease.release();
    } finally {
      db.close();
      await locks.close();
      await service.close();
      dir.cleanup();
    }
  });
});

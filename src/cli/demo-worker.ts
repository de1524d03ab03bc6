/**
 * A worker process of `leasehold demo` (started by demo.ts with `fork`, never by hand). It holds
 * a lease in the demo's SQLite lease store and recomputes one document in a separate SQLite data
 * file, either through `sqliteFence` or with a plain UPDATE. It reports every step over IPC
 * (see demo-protocol.ts) and does only what the demo tells it to.
 */
import { readSync } from 'node:fs';
import Database from 'better-sqlite3';
import { StaleTokenError } from '../core/errors.js';
import { onLoss, type Lease } from '../core/lease.js';
import { createLocks } from '../index.js';
import { sqliteFence, type SqliteDatabase } from '../sqlite/index.js';
import { GO_FD, type DocumentRow, type WorkerCommand, type WorkerConfig, type WorkerEvent } from './demo-protocol.js';

/** Reads the row; replaces it. Named beside the operation that runs them. */
const SELECT_DOCUMENT = 'SELECT body, written_by AS writtenBy, token FROM documents WHERE id = ?';
const UPDATE_DOCUMENT = 'UPDATE documents SET body = ?, written_by = ?, token = ? WHERE id = ?';

function send(event: WorkerEvent): Promise<void> {
  return new Promise((resolve) => {
    if (!process.send || !process.connected) return resolve();
    process.send(event, undefined, undefined, () => resolve());
  });
}

async function fail(error: unknown): Promise<never> {
  await send({ ev: 'failed', message: error instanceof Error ? `${error.name}: ${error.message}` : String(error) });
  process.exit(1);
}

/**
 * Blocks the whole process (event loop included) until the demo writes one byte to the go pipe.
 * While A sits here, no renewal or timer can run, and it holds no SQLite lock: the freeze the
 * demo adds with SIGSTOP lands exactly between the lease check and the write.
 */
function waitForGo(): void {
  const byte = Buffer.alloc(1);
  const nap = new Int32Array(new SharedArrayBuffer(4));
  for (;;) {
    try {
      if (readSync(GO_FD, byte, 0, 1, null) === 1) return;
      throw new Error('the demo closed the go pipe (it exited)');
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      if (code !== 'EAGAIN' && code !== 'EWOULDBLOCK' && code !== 'EINTR') throw error;
      Atomics.wait(nap, 0, 0, 1); // a non-blocking pipe: nap 1 ms, still without running the event loop
    }
  }
}

async function main(): Promise<void> {
  const config = JSON.parse(process.argv[2] ?? '') as WorkerConfig;
  const { role, key, docId } = config;
  // The demo is gone: so are we (a frozen worker learns this when it is continued or killed).
  process.on('disconnect', () => process.exit(1));

  const locks = createLocks({ url: config.leaseUrl, holderName: `worker ${role} (pid ${process.pid})` });
  const db = new Database(config.dataDb, { timeout: 5_000 });
  const data = db as unknown as SqliteDatabase;
  const fence = sqliteFence(data);
  const selectDocument = db.prepare(SELECT_DOCUMENT).safeIntegers(true);
  const updateDocument = db.prepare(UPDATE_DOCUMENT);
  let lease: Lease | undefined;

  const readDocument = (): DocumentRow => {
    const row = selectDocument.get(docId) as { body: string; writtenBy: string; token: bigint } | undefined;
    if (!row) throw new Error(`document ${docId} does not exist`);
    return { body: row.body, writtenBy: row.writtenBy, token: row.token.toString() };
  };

  const watch = (l: Lease): void => {
    // onLoss reads l.signal once, so a lease already lost when we start watching is reported too.
    onLoss(l, (reason) => {
      void send({ ev: 'lost', reason: reason.reason, message: reason.message });
    });
  };

  /** The save. Note what is not here: no second look at lease.signal — the check came before. */
  const save = async (l: Lease, body: string): Promise<void> => {
    const abortedAtWrite = l.signal.aborted;
    const token = l.token.toString();
    const replace = (): DocumentRow => {
      const previous = readDocument();
      updateDocument.run(body, role, l.token, docId);
      return previous;
    };
    if (config.write === 'plain') {
      const previous = db.transaction(replace).immediate();
      await send({ ev: 'saved', via: 'plain', token, body, previous, abortedAtWrite });
      return;
    }
    try {
      const previous = await fence.write(docId, l.token, replace);
      await send({ ev: 'saved', via: 'fence', token, body, previous, abortedAtWrite });
    } catch (error) {
      if (!(error instanceof StaleTokenError)) throw error;
      await send({ ev: 'refused', token, highest: error.highest.toString(), error: error.name, message: error.message, abortedAtWrite });
    }
  };

  /** The "work": stands for minutes of computation; the result names who made it under which token. */
  const recompute = (l: Lease): string => `recomputed by ${role} under token ${l.token}`;

  const handle = async (command: WorkerCommand): Promise<void> => {
    switch (command.cmd) {
      case 'acquire': {
        lease = await locks.acquire(key, { ttlMs: config.ttlMs, waitMs: 10_000 });
        watch(lease);
        await send({ ev: 'acquired', token: lease.token.toString(), ttlMs: lease.ttlMs });
        return;
      }
      case 'take-over': {
        const first = await locks.tryAcquire(key, { ttlMs: config.ttlMs });
        if (first) lease = first;
        else {
          const state = (await locks.inspect(key)).find((s) => s.key === key);
          await send({ ev: 'busy', holder: state?.holders.map((h) => `${h.holder}, token ${h.token}`).join('; ') || 'someone' });
          lease = await locks.acquire(key, { ttlMs: config.ttlMs, waitMs: config.waitMs });
        }
        watch(lease);
        await send({ ev: 'acquired', token: lease.token.toString(), ttlMs: lease.ttlMs });
        readDocument();
        if (lease.signal.aborted) throw new Error('lost the lease before saving');
        await save(lease, recompute(lease));
        return;
      }
      case 'work': {
        if (!lease) throw new Error('work before acquire');
        const read = readDocument();
        const result = recompute(lease);
        const aborted = lease.signal.aborted; // the check: the lease looks fine
        await send({ ev: 'checked', aborted, read, result });
        if (aborted) return;
        waitForGo(); // ← SIGSTOP lands here: after the check, before the write
        await save(lease, result);
        return;
      }
      case 'finish': {
        await lease?.release().catch(() => {});
        await locks.close();
        db.close();
        await send({ ev: 'finished' });
        process.exit(0);
      }
    }
  };

  process.on('message', (command: WorkerCommand) => {
    handle(command).catch(fail);
  });
  await send({ ev: 'ready', pid: process.pid });
}

main().catch(fail);

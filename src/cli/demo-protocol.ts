/**
 * What `leasehold demo` and its worker processes (demo-worker.ts) say to each other over the IPC
 * channel. Tokens travel as decimal strings (the channel speaks JSON, which has no bigint).
 *
 * Besides IPC, worker A gets one more pipe, its fd {@link GO_FD}: after it reports `checked` it
 * blocks reading one byte from it, so nothing (no timer, no renewal) runs between its check and
 * its write. The demo freezes it there with SIGSTOP, writes the byte, and later SIGCONTs it: the
 * write then happens the instant A runs again, exactly like code resuming after a GC pause.
 */

/** Worker A's extra pipe: stdio index 4 (0–2 are stdio, 3 is IPC). */
export const GO_FD = 4;

export type WorkerRole = 'A' | 'B';

/** Passed as the worker's one command-line argument, JSON-encoded. */
export interface WorkerConfig {
  role: WorkerRole;
  /** The lease key, e.g. `doc:42:recompute`. */
  key: string;
  ttlMs: number;
  /** How long B waits for the key (A's lease must expire first). */
  waitMs: number;
  /** The coordinator's URL (default: a SQLite file beside the data). */
  leaseUrl: string;
  /** The protected data (a separate SQLite file): table `documents`, fence table `leasehold_fences`. */
  dataDb: string;
  /** The document both workers recompute, e.g. `doc:42`; also the fence's resource name. */
  docId: string;
  /** `fence`: `sqliteFence(db).write(docId, lease.token, …)`. `plain`: an UPDATE that checks nothing. */
  write: 'fence' | 'plain';
}

export type WorkerCommand =
  /** A: acquire the key (it is free). */
  | { cmd: 'acquire' }
  /** B: try the key (busy), wait for it, then read, recompute and save on its own. */
  | { cmd: 'take-over' }
  /** A: read, recompute, check `lease.signal`, report `checked`, block on the go pipe, then save. */
  | { cmd: 'work' }
  /** Release the lease (a no-op once lost), close, exit. */
  | { cmd: 'finish' };

/** A document row as read or replaced by a worker. */
export interface DocumentRow {
  body: string;
  writtenBy: string;
  token: string;
}

export type WorkerEvent =
  | { ev: 'ready'; pid: number }
  | { ev: 'busy'; holder: string }
  | { ev: 'acquired'; token: string; ttlMs: number }
  /** A is about to save: it read `read`, computed `result`, and its lease looked valid (`aborted` false). */
  | { ev: 'checked'; aborted: boolean; read: DocumentRow; result: string }
  /** The write went through; `previous` is the row it replaced; `abortedAtWrite` is what lease.signal said at that moment. */
  | { ev: 'saved'; via: 'fence' | 'plain'; token: string; body: string; previous: DocumentRow; abortedAtWrite: boolean }
  /** The fence refused the write (StaleTokenError): nothing changed. */
  | { ev: 'refused'; token: string; highest: string; error: string; message: string; abortedAtWrite: boolean }
  /** `lease.signal` aborted, with the LeaseLostError's reason. */
  | { ev: 'lost'; reason: string; message: string }
  | { ev: 'finished' }
  | { ev: 'failed'; message: string };

export type WorkerEventName = WorkerEvent['ev'];

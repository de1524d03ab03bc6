import { setTimeout as sleep } from 'node:timers/promises';
import { InvalidArgumentError, LeaseholdError } from '../core/errors.js';
import { guardHandle } from '../core/fence.js';
import { mapMysqlError, mysqlCode, RETRYABLE, SERVER_STATUS_IN_TRANS, type MysqlConnection, type MysqlPool } from './util.js';
import { dropConnection } from './pool.js';

/**
 * One transaction on one pooled connection around a user's function (the fence's `mutate`, the
 * idempotency store's effect), for MySQL and MariaDB, where far more than COMMIT ends a
 * transaction: every DDL statement, LOCK TABLES, SET autocommit = 1 and a few more commit
 * implicitly, a deadlock rolls the whole transaction back, and what follows then runs in
 * autocommit mode, each statement committed on its own. So besides refusing what it can see
 * coming (the first statement of a string, the connection's transaction methods), the guard
 * reads the server's in-transaction flag (SERVER_STATUS_IN_TRANS) in the OK packet of each of
 * the function's statements, and puts a savepoint before its first one, released just before
 * COMMIT: gone means the transaction ended and another began (COMMIT AND CHAIN, a commit inside a
 * stored procedure, a hidden COMMIT; BEGIN), which the flag alone cannot see.
 */

/** How one store runs a transaction around a user's function. */
export interface GuardedTransactionOptions {
  /** Names the user's function in messages ('mutate', 'fn'). */
  readonly who: string;
  /** Names the transaction in messages ('the fenced transaction'). */
  readonly what: string;
  /**
   * After the user's function ended the transaction: whether the store's own writes were
   * committed with it (true), certainly not (false), or cannot be told (undefined). Runs on the
   * connection, outside any transaction (rolled back first).
   */
  readonly committed: (conn: MysqlConnection) => Promise<boolean | undefined>;
  /** The error for a transaction the user's function ended and that was (`certain`) or may have been committed. */
  readonly partial: (problem: string, certain: boolean, cause: unknown) => Error;
}

/** What the store's body gets: the connection for its own statements, and the user's function's runner. */
export interface GuardedTransaction {
  /** The pooled connection itself, for the store's own statements (through `own`). */
  readonly conn: MysqlConnection;
  /** One of the store's own statements: its failure becomes BackendUnavailableError('mysql', what …). */
  own<T>(what: string, op: (conn: MysqlConnection) => Promise<T>): Promise<T>;
  /**
   * Runs the user's function on the guarded view of the connection. Its result, or its error, reaches the caller
   * unchanged unless the function misused the view (InvalidArgumentError, even if it caught the refusal) or let
   * the transaction end (PartialWriteError-like from `partial` when something may have been committed,
   * InvalidArgumentError when certainly nothing was). The view refuses every call once this settles.
   */
  user<R>(fn: (conn: MysqlConnection) => R | Promise<R>): Promise<R>;
}

/** The savepoint before the user's first statement; released just before COMMIT (gone: the transaction is not the store's any more). */
const SAVEPOINT = 'leasehold_guard';
const SET_SAVEPOINT = `SAVEPOINT ${SAVEPOINT}`;
const RELEASE_SAVEPOINT = `RELEASE SAVEPOINT ${SAVEPOINT}`;
/** A statement that does nothing and answers with an OK packet: the server's status flags after a failed statement. */
const PROBE = 'DO 0';

/** Connection methods that end, open or escape the transaction, or give the connection away. */
const REFUSED_METHODS: ReadonlySet<string> = new Set([
  'release',
  'destroy',
  'end',
  'close',
  'connect',
  'beginTransaction',
  'commit',
  'rollback',
  'changeUser',
  'reset',
  'createBinlogStream',
]);
/** Methods whose API is asynchronous: refused with a rejected promise. */
const ASYNC_METHODS: ReadonlySet<string> = new Set([
  'query',
  'execute',
  'prepare',
  'end',
  'close',
  'connect',
  'beginTransaction',
  'commit',
  'rollback',
  'changeUser',
  'reset',
]);
/** Methods that send a statement: guarded by its text, and preceded by the savepoint. */
const STATEMENT_METHODS: ReadonlySet<string> = new Set(['query', 'execute', 'prepare']);

/** How the user's function's transaction ended behind the store's back. */
interface Ended {
  /** The server rolled it back itself (a deadlock): certainly nothing committed. */
  readonly rolledBack: boolean;
  /** Found after a statement of the function failed (rather than after one that succeeded, or at the savepoint). */
  readonly failed: boolean;
  readonly cause: unknown;
}

/**
 * Runs `body` in one transaction on one pooled connection: START TRANSACTION, `body`, COMMIT;
 * ROLLBACK and rethrow on error. A connection whose link broke (a fatal driver error, an 'error'
 * event, a failed ROLLBACK) is destroyed rather than returned to the pool. A failed COMMIT is
 * BackendUnavailableError: whether it took effect is then unknown.
 */
export async function withGuardedTransaction<R>(pool: MysqlPool, options: GuardedTransactionOptions, body: (tx: GuardedTransaction) => Promise<R>): Promise<R> {
  let conn: MysqlConnection;
  try {
    conn = await pool.getConnection();
  } catch (error) {
    throw mapMysqlError('connect', error);
  }
  let broken = false;
  const noteFatal = (error: unknown): void => {
    if ((error as { fatal?: unknown } | null)?.fatal === true) broken = true;
  };
  const events = conn as unknown as { on?(e: 'error', l: (e: unknown) => void): unknown; removeListener?(e: 'error', l: (e: unknown) => void): unknown };
  const onError = (): void => {
    broken = true;
  };
  events.on?.('error', onError);

  const own = async <T>(what: string, op: (c: MysqlConnection) => Promise<T>): Promise<T> => {
    try {
      return await op(conn);
    } catch (error) {
      noteFatal(error);
      throw mapMysqlError(what, error);
    }
  };

  let views = 0;
  const revokes: (() => void)[] = [];
  const tx: GuardedTransaction = {
    conn,
    own,
    async user<T>(fn: (c: MysqlConnection) => T | Promise<T>): Promise<T> {
      if (views++ > 0) throw new Error('withGuardedTransaction: user() runs once per transaction');
      let savepoint: Promise<unknown> | undefined;
      let ended: Ended | undefined;
      let endedMisuse: InvalidArgumentError | undefined;

      /** The user's statement, after the savepoint; its OK packets are read for the in-transaction flag. */
      const send = async (method: string, args: unknown[]): Promise<unknown> => {
        const target = conn as unknown as Record<string, (...a: unknown[]) => Promise<unknown>>;
        await (savepoint ??= own('savepoint', (c) => c.query(SET_SAVEPOINT)));
        let result: unknown;
        try {
          result = await target[method]!.apply(conn, args);
        } catch (error) {
          noteFatal(error);
          // A broken connection is not an end the store must explain: the server rolls back what it had not committed.
          if (broken || ended) throw error;
          if (mysqlCode(error) === 'ER_LOCK_DEADLOCK') ended = { rolledBack: true, failed: true, cause: error };
          else {
            // Most failed statements undo only themselves; a few end the transaction (DDL commits before it runs).
            const probe = await conn.query(PROBE).catch((e: unknown) => (noteFatal(e), undefined));
            if (probe === undefined || !inTransaction(probe)) ended = { rolledBack: false, failed: true, cause: error };
          }
          throw error; // the statement's own error reaches the function unchanged
        }
        if (method !== 'prepare' && !inTransaction(result)) {
          ended ??= { rolledBack: false, failed: false, cause: undefined };
          endedMisuse ??= new InvalidArgumentError(
            options.who,
            `${options.who} ran a statement that ended ${options.what} (a COMMIT or ROLLBACK inside a multi-statement string, DDL or another implicit commit, a stored procedure that commits); its later statements are refused`,
          );
          throw endedMisuse;
        }
        return result;
      };

      const refuse = (method: string, args: unknown[]): string | undefined => {
        if (ended) return `${method}() was called after ${options.what} had ended; nothing more runs in it`;
        if (REFUSED_METHODS.has(method)) {
          return `${options.who} called ${method}() on the connection of ${options.what}; the store commits or rolls back and releases it itself (refused; rolled back)`;
        }
        if (STATEMENT_METHODS.has(method)) {
          const statement = mysqlTransactionControl(statementText(args[0]) ?? '');
          if (statement !== undefined) {
            return `${options.who} ran ${statement} inside ${options.what}: it ends or opens a transaction (in MySQL, DDL and a few more statements commit implicitly); the store commits or rolls back itself (refused; rolled back)`;
          }
        }
        return undefined;
      };
      // The view's statements go through `send`; everything else reaches the connection as it is.
      const inner = new Proxy(conn, {
        get(t, prop, receiver) {
          if (typeof prop === 'string' && (prop === 'query' || prop === 'execute')) return (...args: unknown[]) => send(prop, args);
          if (prop === 'prepare')
            return async (...args: unknown[]) => (
              await (savepoint ??= own('savepoint', (c) => c.query(SET_SAVEPOINT))), Reflect.get(t, prop, receiver).apply(t, args)
            );
          return Reflect.get(t, prop, receiver);
        },
      });
      const guard = guardHandle(inner, refuse, ASYNC_METHODS);
      revokes.push(() => guard.revoke());

      let result: T | undefined;
      let failed = false;
      let thrown: unknown;
      try {
        result = await fn(guard.handle);
      } catch (error) {
        failed = true;
        thrown = error;
      } finally {
        guard.revoke();
      }

      // The savepoint is still there only if the transaction is still the store's.
      if (!ended && savepoint !== undefined && !broken) {
        try {
          const released = await conn.query(RELEASE_SAVEPOINT);
          if (!inTransaction(released)) ended = { rolledBack: false, failed: false, cause: undefined };
        } catch (error) {
          noteFatal(error);
          if (mysqlCode(error) === 'ER_SP_DOES_NOT_EXIST') ended = { rolledBack: false, failed: false, cause: error };
          else if (!failed && !guard.misuse) throw mapMysqlError('release savepoint', error);
        }
      }

      if (ended) {
        const misuse = guard.misuse ?? endedMisuse;
        const cause = ended.cause ?? thrown;
        let committed: boolean | undefined = false;
        if (!ended.rolledBack) {
          if (broken) committed = undefined;
          else {
            // Outside any transaction (a ROLLBACK ends whatever the function may have begun), the store reads what was committed.
            await own('rollback', (c) => c.query('ROLLBACK'));
            committed = await options.committed(conn);
          }
        }
        if (committed !== false) {
          const how = committed === true ? 'it was committed' : 'it may have been committed';
          const problem = `${options.who} ended ${options.what} itself and ${how}, with what ${options.who} had run before that (and the statements after it in the same multi-statement string, each committed on its own); the rest of ${options.who} was refused or rolled back`;
          throw options.partial(problem, committed === true, cause);
        }
        if (misuse) throw misuse;
        if (failed) throw thrown;
        throw new InvalidArgumentError(
          options.who,
          ended.failed
            ? `a statement inside ${options.who} failed (${mysqlCode(cause) ?? 'error'}) and the server rolled back ${options.what}; ${options.who} carried on as if it had not; nothing was committed`
            : `${options.who} rolled back ${options.what} itself (a ROLLBACK the guard could not see: a prepared statement, a stored procedure, a multi-statement string); nothing was committed`,
          { cause },
        );
      }
      if (guard.misuse) throw guard.misuse; // the function caught the refusal: roll back all the same
      if (failed) throw thrown;
      return result as T;
    },
  };

  try {
    await own('begin', (c) => c.query('START TRANSACTION'));
    const result = await body(tx);
    await own('commit', (c) => c.query('COMMIT'));
    return result;
  } catch (error) {
    // Harmless outside a transaction (after a COMMIT that failed, or a transaction the function ended).
    if (!broken) await conn.query('ROLLBACK').catch(() => (broken = true));
    throw error;
  } finally {
    for (const revoke of revokes) revoke();
    events.removeListener?.('error', onError);
    if (broken) dropConnection(conn);
    else conn.release();
  }
}

/**
 * Attempts of a store operation (in all) that ran into deadlocks before any user code ran. InnoDB
 * finds a deadlock at once and rolls back one side, so another attempt is cheap; they come in
 * bursts when many writers first insert one new key (gap locks).
 */
export const DEADLOCK_ATTEMPTS = 8;
/** Attempts (in all) after lock-wait timeouts: each has already waited the server's innodb_lock_wait_timeout (50 s by default). */
export const LOCK_WAIT_ATTEMPTS = 2;

/** The driver's code of `error` (mapped or raw) when it is a deadlock or a lock-wait timeout: the same statements, run again, may succeed. */
export function lockConflict(error: unknown): string | undefined {
  const code = mysqlCode(error instanceof LeaseholdError ? error.cause : error);
  return code !== undefined && RETRYABLE.has(code) ? code : undefined;
}

/**
 * Runs `op` again, after a short jittered pause, while it fails with a deadlock (up to
 * DEADLOCK_ATTEMPTS in all) or a lock-wait timeout (up to LOCK_WAIT_ATTEMPTS) and `again()` says
 * it may (no user code ran yet); then its error reaches the caller.
 */
export async function retryLockConflicts<T>(op: () => Promise<T>, again: () => boolean = () => true): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await op();
    } catch (error) {
      const code = lockConflict(error);
      const limit = code === 'ER_LOCK_WAIT_TIMEOUT' ? LOCK_WAIT_ATTEMPTS : DEADLOCK_ATTEMPTS;
      if (code === undefined || attempt >= limit || !again()) throw error;
      await sleep(Math.floor(Math.random() * 10 * attempt) + 1);
    }
  }
}

/** False when an answer carries an OK packet whose status says no transaction is open (each OK packet of a multi-statement answer). */
export function inTransaction(answer: unknown): boolean {
  if (!Array.isArray(answer)) return true;
  const [rows, fields] = answer as [unknown, unknown];
  let headers: unknown[] = [];
  if (fields === undefined) headers = [rows];
  else if (Array.isArray(fields) && Array.isArray(rows) && fields.some((f) => f === undefined || Array.isArray(f))) {
    // several result sets: an OK packet where a statement returned no rows
    headers = rows.filter((_, i) => fields[i] === undefined);
  }
  return !headers.some((h) => {
    const status = (h as { serverStatus?: unknown } | null)?.serverStatus;
    return typeof h === 'object' && h !== null && !Array.isArray(h) && typeof status === 'number' && (status & SERVER_STATUS_IN_TRANS) === 0;
  });
}

/** The SQL text of a query/execute/prepare argument: a string or mysql2's `{ sql }` options. */
function statementText(arg: unknown): string | undefined {
  if (typeof arg === 'string') return arg;
  const sql = (arg as { sql?: unknown } | null)?.sql;
  return typeof sql === 'string' ? sql : undefined;
}

/** Statements that commit implicitly (MySQL 8.0 manual, "Statements That Cause an Implicit Commit"; MariaDB alike), by first word. */
const IMPLICIT_COMMIT: ReadonlySet<string> = new Set([
  'ALTER',
  'RENAME',
  'TRUNCATE',
  'GRANT',
  'REVOKE',
  'FLUSH',
  'ANALYZE',
  'OPTIMIZE',
  'REPAIR',
  'CHECK',
  'INSTALL',
  'UNINSTALL',
  'RESET',
  'CHANGE',
  'STOP',
  'LOCK',
  'UNLOCK',
  'XA',
]);

/**
 * The statement that `sql` starts with when it ends or opens a transaction in MySQL or MariaDB —
 * COMMIT, ROLLBACK (but not ROLLBACK TO), BEGIN, START TRANSACTION, XA — or commits implicitly:
 * DDL (CREATE, ALTER, DROP, RENAME, TRUNCATE; CREATE and DROP of a TEMPORARY table excepted),
 * LOCK / UNLOCK TABLES, SET autocommit, SET PASSWORD, GRANT, REVOKE, FLUSH, ANALYZE, OPTIMIZE,
 * REPAIR, CHECK TABLE, CACHE / LOAD INDEX, RESET, replication control; undefined otherwise. Reads
 * past white space and comments (`--`, `#`, `/* *\/`; the code inside `/*! *\/` counts). Only the
 * first statement is read: the in-transaction flag and the savepoint catch the rest.
 */
export function mysqlTransactionControl(sql: string): string | undefined {
  const { words, text } = leadingWords(sql, 4);
  const [first, second, third, fourth] = words;
  switch (first) {
    case undefined:
      return undefined;
    case 'COMMIT':
    case 'BEGIN':
      return first;
    case 'ROLLBACK': {
      const next = second === 'WORK' ? third : second;
      return next === 'TO' ? undefined : 'ROLLBACK';
    }
    case 'START':
      return second === undefined ? first : `START ${second}`;
    case 'SET':
      if (second === 'PASSWORD') return 'SET PASSWORD';
      return /\bautocommit\b/i.test(text) ? 'SET autocommit' : undefined;
    case 'CREATE': {
      const kind = second === 'OR' && third === 'REPLACE' ? fourth : second;
      return kind === 'TEMPORARY' ? undefined : `CREATE ${kind ?? ''}`.trim();
    }
    case 'DROP':
      return second === 'TEMPORARY' ? undefined : `DROP ${second ?? ''}`.trim();
    case 'CACHE':
    case 'LOAD':
      return second === 'INDEX' ? `${first} INDEX` : undefined;
    default:
      return IMPLICIT_COMMIT.has(first) ? `${first}${second === undefined ? '' : ` ${second}`}` : undefined;
  }
}

/**
 * The first statement of `sql`: up to its first `;` outside quotes and comments (a `;` inside an
 * executable comment `/*! … *\/` ends it too: its body is code).
 */
function firstStatement(sql: string): string {
  let quote: string | undefined;
  for (let i = 0; i < sql.length; i++) {
    const c = sql[i]!;
    if (quote !== undefined) {
      if (c === '\\' && quote !== '`') i++;
      else if (c === quote) quote = undefined;
    } else if (c === "'" || c === '"' || c === '`') {
      quote = c;
    } else if (c === ';') {
      return sql.slice(0, i);
    } else if (sql.startsWith('--', i) || c === '#') {
      const end = sql.indexOf('\n', i);
      if (end < 0) break;
      i = end;
    } else if (sql.startsWith('/*', i) && sql[i + 2] !== '!' && !sql.startsWith('/*M!', i)) {
      const end = sql.indexOf('*/', i + 2);
      if (end < 0) break;
      i = end + 1;
    }
  }
  return sql;
}

/**
 * Up to `n` leading words of the first statement of `sql` in upper case, skipping white space and
 * comments (the body of an executable comment, `/*!50000 … *\/` or MariaDB's `/*M! … *\/`, is
 * code); `text` is that first statement.
 */
function leadingWords(sql: string, n: number): { words: string[]; text: string } {
  const text = firstStatement(sql);
  const words: string[] = [];
  let i = 0;
  while (i < text.length && words.length < n) {
    const c = text[i]!;
    if (/\s/.test(c) || c === '(') {
      i++;
    } else if (text.startsWith('--', i) || c === '#') {
      const end = text.indexOf('\n', i);
      i = end < 0 ? text.length : end + 1;
    } else if (text.startsWith('/*!', i) || text.startsWith('/*M!', i)) {
      i += text.startsWith('/*M!', i) ? 4 : 3;
      while (i < text.length && /[0-9]/.test(text[i]!)) i++; // the version the code needs
    } else if (text.startsWith('/*', i)) {
      const end = text.indexOf('*/', i + 2);
      i = end < 0 ? text.length : end + 2;
    } else if (text.startsWith('*/', i)) {
      i += 2; // the end of an executable comment
    } else {
      const m = /^[A-Za-z_]+/.exec(text.slice(i, i + 64));
      if (!m) break;
      words.push(m[0].toUpperCase());
      i += m[0].length;
    }
  }
  return { words, text };
}

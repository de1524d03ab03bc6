/** What the MySQL backend tests share: dropping a lease table, and a pool that records its statements. */
import mysql from 'mysql2/promise';
import type { MysqlPool } from '../../src/mysql/index.js';
import { MYSQL_URL } from '../helpers/env.js';

/** Drops a lease table's tables and procedures (what the backend creates for `table`). */
export async function dropLeaseTables(table: string): Promise<void> {
  const admin = await mysql.createConnection({ uri: MYSQL_URL });
  try {
    for (const suffix of ['', '_keys', '_waiters']) await admin.query(`DROP TABLE IF EXISTS \`${table}${suffix}\``);
    for (const suffix of ['_acquire', '_release', '_cancel']) await admin.query(`DROP PROCEDURE IF EXISTS \`${table}${suffix}\``);
  } finally {
    await admin.end();
  }
}

type Query = (sql: unknown, values?: unknown) => Promise<[unknown, unknown]>;

/**
 * A mysql2 pool as the backend sees it (getConnection, query), recording the text of every
 * statement sent on its connections: instrumentation of the public pool surface, not a mock.
 */
export function recordingPool(inner: mysql.Pool): { pool: MysqlPool; statements: string[] } {
  const statements: string[] = [];
  const sqlOf = (sql: unknown): string => (typeof sql === 'string' ? sql : String((sql as { sql: string }).sql));
  const pool = {
    async getConnection() {
      const c = await inner.getConnection();
      const query: Query = (sql, values) => {
        statements.push(sqlOf(sql));
        return (c.query as unknown as Query).call(c, sql, values);
      };
      return { query, release: () => c.release(), destroy: () => c.destroy(), threadId: c.threadId };
    },
    query: ((sql: unknown, values?: unknown) => {
      statements.push(sqlOf(sql));
      return (inner.query as unknown as Query).call(inner, sql, values);
    }) as MysqlPool['query'],
  };
  return { pool, statements };
}

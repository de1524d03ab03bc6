/** What the MySQL backend tests share: dropping a lease table, and a pool that records its statements. */
import mysql from 'mysql2/promise';
import type { MysqlPool } from '../../src/mysql/index.js';
import { MYSQL_URL } from '../helpers/env.js';

/**
 * Drops everything the backend made for `table`: the table itself and every table and procedure
 * named `<table>_…` in the current database (read from information_schema, so a table or procedure
 * a later schema adds is dropped too, without a list to keep up to date).
 */
export async function dropLeaseTables(table: string): Promise<void> {
  const admin = await mysql.createConnection({ uri: MYSQL_URL });
  try {
    // `_` and `%` are LIKE wildcards: escape them so only `<table>_…` matches
    const like = `${table.replace(/[\\_%]/g, (c) => `\\${c}`)}\\_%`;
    const [tables] = await admin.query(
      `SELECT TABLE_NAME AS name FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND (TABLE_NAME = ? OR TABLE_NAME LIKE ?)`,
      [table, like],
    );
    for (const { name } of tables as { name: string }[]) await admin.query(`DROP TABLE IF EXISTS \`${name}\``);
    const [procedures] = await admin.query(
      `SELECT ROUTINE_NAME AS name FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_TYPE = 'PROCEDURE' AND ROUTINE_NAME LIKE ?`,
      [like],
    );
    for (const { name } of procedures as { name: string }[]) await admin.query(`DROP PROCEDURE IF EXISTS \`${name}\``);
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

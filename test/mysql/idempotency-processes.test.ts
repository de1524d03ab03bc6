/**
 * The idempotency recipe with real processes on the local MariaDB (test/fixtures/idempotency-worker.mjs,
 * which uses dist/: `npm run build` first), coordinator (mysqlBackend) and records in one database:
 * fn once for two processes at once, the takeover of a SIGSTOPped attempt refused by the fence (in
 * the transactional variant A is frozen inside its transaction, after writing its effect row, which
 * is absent in the end), and the control — a plain in-progress flag with an expiry — completing twice.
 */
import mysql from 'mysql2/promise';
import { mysqlIdempotencyStore } from '../../src/mysql/index.js';
import { MYSQL_URL, uniqueName } from '../helpers/env.js';
import { processScenarios } from '../helpers/idempotency.js';
import { dropLeaseTables } from './support.js';

processScenarios('mysql', async () => {
  const prefix = uniqueName('lh_ip');
  const pool = mysql.createPool({ uri: MYSQL_URL, connectionLimit: 2 });
  await pool.query(
    `CREATE TABLE ${prefix}_effects (seq BIGINT AUTO_INCREMENT PRIMARY KEY, \`key\` VARCHAR(255) NOT NULL, attempt VARCHAR(64) NOT NULL) ENGINE=InnoDB`,
  );
  await pool.query(
    `CREATE TABLE ${prefix}_flags (\`key\` VARCHAR(255) PRIMARY KEY, state VARCHAR(16) NOT NULL, value TEXT, expires_at DATETIME(6) NOT NULL) ENGINE=InnoDB`,
  );
  const rowsOf = async <T>(answer: Promise<[unknown, unknown]>): Promise<T[]> => (await answer)[0] as T[];
  return {
    connection: { db: 'mysql', url: MYSQL_URL, prefix },
    effects: async (key) =>
      (await rowsOf<{ attempt: string }>(pool.query(`SELECT attempt FROM ${prefix}_effects WHERE \`key\` = ? ORDER BY seq`, [key]))).map((r) => r.attempt),
    store: () => mysqlIdempotencyStore(pool, { table: `${prefix}_records` }),
    flag: async (key) =>
      (await rowsOf<{ state: string; value: string | null }>(pool.query(`SELECT state, value FROM ${prefix}_flags WHERE \`key\` = ?`, [key])))[0],
    cleanup: async () => {
      const locks = `${prefix}_locks`;
      await pool.query(`DROP TABLE IF EXISTS ${prefix}_effects, ${prefix}_flags, ${prefix}_records`);
      await dropLeaseTables(locks);
      await pool.end();
    },
  };
});

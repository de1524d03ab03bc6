import mysql from 'mysql2/promise';
import { mysqlBackend } from '../../src/mysql/index.js';
import { backendConformance } from '../../src/testing/index.js';
import { MYSQL_URL, uniqueName } from '../helpers/env.js';

// The shared server is not restarted here (other tests use it); restarts are covered by the MySQL
// failure tests on a server of their own.
backendConformance('mysql', async () => {
  const table = uniqueName('lh_conf');
  return {
    // each client has its own pool (and poller), as separate processes would
    connect: async () => mysqlBackend({ uri: MYSQL_URL, table, poolSize: 4 }),
    prefix: 'conf',
    ttlMs: 400,
    cleanup: async () => {
      const admin = await mysql.createConnection({ uri: MYSQL_URL });
      try {
        for (const suffix of ['', '_keys', '_waiters']) await admin.query(`DROP TABLE IF EXISTS \`${table}${suffix}\``);
        for (const suffix of ['_acquire', '_release', '_cancel']) await admin.query(`DROP PROCEDURE IF EXISTS \`${table}${suffix}\``);
      } finally {
        await admin.end();
      }
    },
  };
});

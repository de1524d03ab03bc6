import { mysqlBackend } from '../../src/mysql/index.js';
import { backendConformance } from '../../src/testing/index.js';
import { MYSQL_URL, uniqueName } from '../helpers/env.js';
import { dropLeaseTables } from '../mysql/support.js';

// The shared server is not restarted here (other tests use it); restarts are covered by the MySQL
// failure tests on a server of their own.
backendConformance('mysql', async () => {
  const table = uniqueName('lh_conf');
  return {
    // each client has its own pool (and poller), as separate processes would
    connect: async () => mysqlBackend({ uri: MYSQL_URL, table, poolSize: 4 }),
    prefix: 'conf',
    ttlMs: 400,
    cleanup: () => dropLeaseTables(table),
  };
});

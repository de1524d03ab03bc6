// A lock service (`leasehold serve`, from dist/: run `npm run build` first) in a process of its
// own, for the conformance suite over the wire (test/conformance/http.test.ts): its clients and the
// server do not share an event loop, as in production, so a burst of requests from the clients does
// not stall their own keep-alive timers.
//
//   node lock-server-process.mjs '{"backend":"memory"|"memory-sessions"|"sqlite"|"postgres"|"redis"|"mysql"|"etcd", "path"?, "url"?, "schema"?, "prefix"?, "table"?, "hosts"?}'
//
// Prints {"url": …} once listening. Commands on stdin: "restart" (close the server and start a new
// one over the same backend on the same port, as a restarted stateless server; prints {"url"}
// again), "stop" (close the server and the backend, then exit).
import { createInterface } from 'node:readline';
import { etcdBackend } from '../../dist/etcd/index.js';
import { memoryBackend } from '../../dist/memory/index.js';
import { mysqlBackend } from '../../dist/mysql/index.js';
import { postgresBackend } from '../../dist/postgres/index.js';
import { redisBackend } from '../../dist/redis/index.js';
import { startLockServer } from '../../dist/serve/index.js';
import { sqliteBackend } from '../../dist/sqlite/index.js';

const cfg = JSON.parse(process.argv[2]);
const backends = {
  memory: () => memoryBackend(),
  'memory-sessions': () => memoryBackend({ sessions: true }),
  sqlite: () => sqliteBackend({ path: cfg.path }),
  postgres: () => postgresBackend({ connectionString: cfg.url, schema: cfg.schema, poolSize: 8 }),
  redis: () => redisBackend({ url: cfg.url, prefix: cfg.prefix }),
  mysql: () => mysqlBackend({ uri: cfg.url, table: cfg.table, poolSize: 8 }),
  etcd: () => etcdBackend({ hosts: cfg.hosts, prefix: cfg.prefix, minTtlMs: 1_000 }),
};
const backend = backends[cfg.backend]();
let server = await startLockServer({ backend, port: 0 });
const port = Number(new URL(server.url).port);
const say = (line) => process.stdout.write(`${JSON.stringify(line)}\n`);
say({ url: server.url });

createInterface({ input: process.stdin }).on('line', async (line) => {
  if (line === 'restart') {
    await server.close();
    server = await startLockServer({ backend, port });
    say({ url: server.url });
  }
  if (line === 'stop') {
    await server.close();
    await backend.close();
    process.exit(0);
  }
});

#!/usr/bin/env node
// `npm run bench -- redis [--seconds 2] [--rounds 3] [--url redis://…] [--only uncontended,contended,commands,renewals,server]`
//
// leasehold's Redis backend side by side with redlock 5 (defaults, and tuned to 1 ms polling),
// redis-semaphore 5 (Mutex, defaults) and a hand-written floor (SET NX PX + compare-and-delete
// script, polling every 1 ms when busy), and, uncontended only, leasehold's two calls sent raw
// (leasehold-calls: the server-side cost alone), on one redis-server started for the run (no
// persistence) unless --url is given. Rounds are interleaved (every library runs each scenario
// once per round, in turn), so drift of this machine hits all alike. Prints figures, never fails
// on them. Commands per critical section and renewal commands are counted in separate runs under
// MONITOR (which tells client commands from commands inside scripts), not during the timed runs.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir, cpus, totalmem, hostname } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Redis } from 'ioredis';
import Redlock from 'redlock';
import { Mutex } from 'redis-semaphore';
import { Locks } from '../dist/core/locks.js';
import { CLIENT_DEFAULTS, redisBackend } from '../dist/redis/index.js';
import { REDIS_DEFAULTS, REDIS_LIBRARY } from '../dist/redis/backend.js';

const argv = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = argv.indexOf(`--${name}`);
  return i >= 0 ? argv[i + 1] : dflt;
};
const now = () => performance.timeOrigin + performance.now(); // ms, comparable between processes of this machine
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const HOLD_MS = 1;
const TTL = 10_000;

// ---------------------------------------------------------------------------------------------
// Contenders: open(url) → { lock(key) → release(), close() }. `lock` waits for the key.
// ---------------------------------------------------------------------------------------------
const CAD = `if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end`;
const contenders = {
  leasehold: async (url) => {
    const locks = new Locks({ backend: redisBackend({ url }) });
    return {
      lock: async (key) => {
        const lease = await locks.acquire(key, { ttlMs: TTL, waitMs: 60_000 });
        return () => lease.release();
      },
      close: () => locks.close(),
    };
  },
  // The same, through a client of your own with ioredis's automatic pipelining turned on.
  'leasehold-autopipe': async (url) => {
    const client = new Redis(url, { ...CLIENT_DEFAULTS, enableAutoPipelining: true });
    client.on('error', () => {});
    const locks = new Locks({ backend: redisBackend({ client }) });
    return {
      lock: async (key) => {
        const lease = await locks.acquire(key, { ttlMs: TTL, waitMs: 60_000 });
        return () => lease.release();
      },
      close: async () => {
        await locks.close();
        await client.quit();
      },
    };
  },
  // leasehold's two Redis calls alone: the backend's acquire and release functions (FCALL, the
  // arguments it sends for a waiting caller with a session), straight from one ioredis client, with
  // no leasehold code in Node. Uncontended runs only (a busy answer is an error here): what the
  // server-side work caps any client at.
  'leasehold-calls': async (url) => {
    const client = new Redis(url);
    await client.call('FUNCTION', 'LOAD', 'REPLACE', REDIS_LIBRARY.source);
    const acquire = REDIS_LIBRARY.functionName('acquire');
    const release = REDIS_LIBRARY.functionName('release');
    const retain = String(REDIS_DEFAULTS.retainMs);
    const session = `calls${process.pid}`;
    const sessionKey = `${REDIS_DEFAULTS.prefix}session:${session}`;
    await client.call('FCALL', REDIS_LIBRARY.functionName('session_open'), 1, sessionKey, String(TTL));
    const label = `${hostname()}:${process.pid}`;
    let n = 0;
    return {
      lock: async (key) => {
        const lockKey = `${REDIS_DEFAULTS.prefix}{${key}}`;
        const owner = `calls-${process.pid}-${++n}`;
        const token = await client.call('FCALL', acquire, 2, lockKey, sessionKey, owner, 'e', String(TTL), '0', label, session, retain, '2000', '');
        if (typeof token !== 'string') throw new Error(`leasehold-calls: ${key} not granted: ${JSON.stringify(token)}`);
        return () => client.call('FCALL', release, 1, lockKey, owner, token, retain);
      },
      close: async () => client.quit(),
    };
  },
  redlock: async (url) => redlockContender(url, {}),
  'redlock-1ms': async (url) => redlockContender(url, { retryDelay: 1, retryJitter: 1, retryCount: -1 }),
  'redis-semaphore': async (url) => {
    const client = new Redis(url);
    return {
      lock: async (key) => {
        const m = new Mutex(client, key, { lockTimeout: TTL, acquireTimeout: 60_000 });
        await m.acquire();
        return () => m.release();
      },
      close: async () => client.quit(),
    };
  },
  floor: async (url) => {
    const client = new Redis(url);
    client.defineCommand('cad', { numberOfKeys: 1, lua: CAD });
    let n = 0;
    return {
      lock: async (key) => {
        const token = `${process.pid}:${++n}`;
        while ((await client.set(key, token, 'PX', TTL, 'NX')) === null) await sleep(1);
        return () => client.cad(key, token);
      },
      close: async () => client.quit(),
    };
  },
};

async function redlockContender(url, settings) {
  const client = new Redis(url);
  const redlock = new Redlock([client], settings);
  redlock.on('error', () => {}); // ResourceLockedError on every refused attempt
  return {
    lock: async (key) => {
      for (;;) {
        try {
          const l = await redlock.acquire([key], TTL);
          return () => l.release();
        } catch (error) {
          if (error?.name !== 'ExecutionError') throw error;
          gaveUp++; // redlock gave up after retryCount attempts; the caller tries again
        }
      }
    },
    close: async () => client.quit(),
  };
}
let gaveUp = 0;

// ---------------------------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------------------------
async function uncontended(name, url, loops, seconds) {
  const c = await contenders[name](url);
  const tag = `u:${name}:${process.pid}:${Math.random().toString(36).slice(2)}`;
  // warm-up: scripts loaded, sessions opened
  for (let i = 0; i < loops; i++) await (await c.lock(`${tag}:${i}`))();
  let pairs = 0;
  const end = performance.now() + seconds * 1000;
  await Promise.all(
    Array.from({ length: loops }, async (_, i) => {
      while (performance.now() < end) {
        await (await c.lock(`${tag}:${i}`))();
        pairs++;
      }
    }),
  );
  const elapsed = (performance.now() - end + seconds * 1000) / 1000;
  await c.close();
  return pairs / elapsed;
}

/** Workers of one process on one key; returns the sections (worker id, times) for the merge. */
async function contendedWorkers(name, url, key, workers, seconds, startAt, idBase) {
  const cs = await Promise.all(Array.from({ length: workers }, () => contenders[name](url)));
  for (let i = 0; i < workers; i++) await (await cs[i].lock(`${key}:warm:${idBase + i}`))();
  while (now() < startAt) await sleep(1);
  const stopAt = startAt + seconds * 1000;
  const sections = [];
  gaveUp = 0;
  await Promise.all(
    cs.map(async (c, i) => {
      while (now() < stopAt) {
        const asked = now();
        const release = await c.lock(key);
        const got = now();
        await sleep(HOLD_MS);
        const releasing = now();
        await release();
        sections.push({ w: idBase + i, asked, got, releasing });
      }
    }),
  );
  await Promise.all(cs.map((c) => c.close()));
  return { sections, gaveUp };
}

function summarize(sections, workers, seconds) {
  sections.sort((a, b) => a.got - b.got);
  const handoffs = [];
  let same = 0;
  for (let i = 1; i < sections.length; i++) {
    if (sections[i].w === sections[i - 1].w) same++;
    else handoffs.push(sections[i].got - sections[i - 1].releasing);
  }
  handoffs.sort((a, b) => a - b);
  const q = (p) => (handoffs.length ? handoffs[Math.min(handoffs.length - 1, Math.floor(p * handoffs.length))] : NaN);
  const counts = Array.from({ length: workers }, (_, w) => sections.filter((s) => s.w === w).length);
  const sum = counts.reduce((a, b) => a + b, 0);
  const jain = (sum * sum) / (workers * counts.reduce((a, b) => a + b * b, 0));
  return {
    perSecond: sections.length / seconds,
    p50: q(0.5),
    p99: q(0.99),
    longestWait: Math.max(...sections.map((s) => s.got - s.asked)),
    jain,
    barge: sections.length > 1 ? same / (sections.length - 1) : NaN,
  };
}

async function contendedOneProcess(name, url, seconds) {
  const key = `c1:${name}:${Math.random().toString(36).slice(2)}`;
  const { sections, gaveUp: g } = await contendedWorkers(name, url, key, 8, seconds, now() + 300, 0);
  return { ...summarize(sections, 8, seconds), gaveUp: g };
}

async function contendedProcesses(name, url, seconds) {
  const key = `c4:${name}:${Math.random().toString(36).slice(2)}`;
  const startAt = now() + 1_500;
  const children = Array.from(
    { length: 4 },
    (_, p) =>
      new Promise((resolve, reject) => {
        const child = spawn(
          process.execPath,
          [
            fileURLToPath(import.meta.url),
            '--child',
            name,
            '--url',
            url,
            '--key',
            key,
            '--seconds',
            String(seconds),
            '--start',
            String(startAt),
            '--base',
            String(p * 2),
          ],
          { stdio: ['ignore', 'pipe', 'inherit'] },
        );
        let out = '';
        child.stdout.on('data', (d) => (out += d));
        child.on('exit', (code) => (code === 0 ? resolve(JSON.parse(out)) : reject(new Error(`child exited ${code}`))));
      }),
  );
  const results = await Promise.all(children);
  const sections = results.flatMap((r) => r.sections);
  return { ...summarize(sections, 8, seconds), gaveUp: results.reduce((a, r) => a + r.gaveUp, 0) };
}

/** Client commands (and commands run inside scripts) per critical section, counted with MONITOR. */
async function commandsPerSection(name, url, sectionsWanted = 400) {
  const monitor = await new Redis(url).monitor();
  let client = 0;
  let inScripts = 0;
  let counting = false;
  monitor.on('monitor', (_time, args, source) => {
    if (!counting) return;
    if (source === 'lua') inScripts++;
    else if (!['info', 'monitor'].includes(String(args[0]).toLowerCase())) client++;
  });
  const key = `m:${name}:${Math.random().toString(36).slice(2)}`;
  const cs = await Promise.all(Array.from({ length: 8 }, () => contenders[name](url)));
  for (let i = 0; i < 8; i++) await (await cs[i].lock(`${key}:warm:${i}`))();
  await sleep(100);
  counting = true;
  let done = 0;
  await Promise.all(
    cs.map(async (c) => {
      while (done < sectionsWanted) {
        const release = await c.lock(key);
        await sleep(HOLD_MS);
        await release();
        done++;
      }
    }),
  );
  await sleep(100);
  counting = false;
  await Promise.all(cs.map((c) => c.close()));
  monitor.disconnect();
  return { client: client / done, inScripts: inScripts / done };
}

/**
 * Renewal commands for one client holding 10,000 leases of ttl 3 s, each library renewing its own
 * way. Counted under MONITOR, which shows each command a client sends once (the commands a script
 * runs inside the server are marked `lua` and not counted), over a window of whole renewal
 * intervals of that library; reported per interval (count / intervals in the window) and per second.
 */
async function renewals(name, url) {
  const N = 10_000;
  const ttl = 3_000;
  const tag = `r:${name}:${Math.random().toString(36).slice(2)}`;
  let stop;
  let cadence;
  let intervalMs;
  if (name === 'leasehold') {
    const locks = new Locks({ backend: redisBackend({ url }) });
    for (let i = 0; i < N; i += 500) await Promise.all(Array.from({ length: 500 }, (_, j) => locks.acquire(`${tag}:${i + j}`, { ttlMs: ttl })));
    stop = () => locks.close();
    cadence = 'one session keep-alive every ttl/3';
    intervalMs = ttl / 3;
  } else if (name === 'redlock') {
    const client = new Redis(url);
    const redlock = new Redlock([client]);
    redlock.on('error', () => {});
    let release;
    const hold = new Promise((r) => (release = r));
    const started = [];
    const usings = [];
    for (let i = 0; i < N; i++) {
      started.push(
        new Promise((ok) =>
          usings.push(
            redlock
              .using([`${tag}:${i}`], ttl, async () => {
                ok();
                await hold;
              })
              .catch(() => {}),
          ),
        ),
      );
      if (i % 500 === 499) await Promise.all(started.slice(-500));
    }
    await Promise.all(started);
    // quit only once every using() has released its lock (a command still in flight would fail unhandled inside redlock)
    stop = async () => {
      release();
      await Promise.all(usings);
      await client.quit();
    };
    cadence = 'using(): each lock extended when < 500 ms remain (every ttl − 500 ms)';
    intervalMs = ttl - 500;
  } else if (name === 'redis-semaphore') {
    const client = new Redis(url);
    const mutexes = [];
    for (let i = 0; i < N; i += 500) {
      const batch = Array.from({ length: 500 }, (_, j) => new Mutex(client, `${tag}:${i + j}`, { lockTimeout: ttl, onLockLost: () => {} }));
      await Promise.all(batch.map((m) => m.acquire()));
      mutexes.push(...batch);
    }
    stop = async () => {
      await Promise.all(mutexes.map((m) => m.release()));
      await client.quit();
    };
    cadence = 'each mutex refreshed every 0.8 × lockTimeout';
    intervalMs = Math.round(ttl * 0.8);
  } else {
    const client = new Redis(url);
    client.defineCommand('renew', {
      numberOfKeys: 1,
      lua: `if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end`,
    });
    for (let i = 0; i < N; i += 500) await Promise.all(Array.from({ length: 500 }, (_, j) => client.set(`${tag}:${i + j}`, 'me', 'PX', ttl, 'NX')));
    const timer = setInterval(() => {
      for (let i = 0; i < N; i++) void client.renew(`${tag}:${i}`, 'me', ttl);
    }, ttl / 3);
    stop = async () => {
      clearInterval(timer);
      await client.quit();
    };
    cadence = 'each key renewed every ttl/3 (compare-and-pexpire script)';
    intervalMs = ttl / 3;
  }
  const monitor = await new Redis(url).monitor();
  let commands = 0;
  let counting = false;
  monitor.on('monitor', (_time, args, source) => {
    if (counting && source !== 'lua' && String(args[0]).toLowerCase() !== 'monitor') commands++;
  });
  await sleep(500); // the acquires' replies are in; the first renewals are scheduled
  const intervals = Math.ceil(6_000 / intervalMs); // at least 6 s, in whole intervals of this library
  counting = true;
  await sleep(intervals * intervalMs);
  counting = false;
  monitor.disconnect();
  await stop();
  return { perInterval: commands / intervals, perSecond: commands / ((intervals * intervalMs) / 1000), cadence };
}

/**
 * Server time per acquire+release pair, from INFO commandstats: the usec Redis spent in each command
 * the client sent (a script's redis.calls included), as differences of two readings, so a --url
 * server's own stats are left alone. Four pairs, sequential on one client: leasehold's two functions
 * as its backend calls them on a free key; two functions making the same 8 redis.calls with
 * constant arguments and none of the logic around them; two empty functions taking the same
 * arguments; the floor's SET NX PX and compare-and-delete script.
 */
async function serverCost(url, pairs = 20_000) {
  const client = new Redis(url);
  const minimal = `#!lua name=leasehold_bench_min
redis.register_function('bench_min_acquire', function(KEYS, ARGV)
  local t = redis.call('TIME')
  redis.call('HGET', KEYS[2], 'e')
  redis.call('HMGET', KEYS[1], 't', 's')
  redis.call('HSET', KEYS[1], 't', t[1], 's', '1', 'h:' .. ARGV[1], ARGV[2])
  redis.call('PERSIST', KEYS[1])
  return t[1]
end)
redis.register_function('bench_min_release', function(KEYS, ARGV)
  redis.call('HMGET', KEYS[1], 'h:' .. ARGV[1], 's')
  redis.call('HDEL', KEYS[1], 'h:' .. ARGV[1], 's')
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end)
redis.register_function('bench_min_empty', function() return 1 end)`;
  await client.call('FUNCTION', 'LOAD', 'REPLACE', REDIS_LIBRARY.source);
  await client.call('FUNCTION', 'LOAD', 'REPLACE', minimal);
  client.defineCommand('cad', { numberOfKeys: 1, lua: CAD });
  const retain = String(REDIS_DEFAULTS.retainMs);
  const session = `cost${process.pid}`;
  const sessionKey = `${REDIS_DEFAULTS.prefix}session:${session}`;
  await client.call('FCALL', REDIS_LIBRARY.functionName('session_open'), 1, sessionKey, String(TTL));
  const label = `${hostname()}:${process.pid}`;
  const usec = async () => {
    let total = 0;
    for (const line of (await client.info('commandstats')).split('\n')) {
      // the commands the client sent: a script's own usec already holds the redis.calls inside it
      const m = /^cmdstat_(?:fcall|evalsha|set):calls=\d+,usec=(\d+)/.exec(line);
      if (m) total += Number(m[1]);
    }
    return total;
  };
  const pair = {
    functions: async (i) => {
      const k = `${REDIS_DEFAULTS.prefix}{cost:${i % 64}}`;
      const owner = `cost-${i}`;
      const token = await client.call(
        'FCALL',
        REDIS_LIBRARY.functionName('acquire'),
        2,
        k,
        sessionKey,
        owner,
        'e',
        String(TTL),
        '0',
        label,
        session,
        retain,
        '2000',
        '',
      );
      await client.call('FCALL', REDIS_LIBRARY.functionName('release'), 1, k, owner, token, retain);
    },
    'same redis.calls': async (i) => {
      const k = `bench:{min:${i % 64}}`;
      const record = `e|1|0|0|${session}|${label}`;
      await client.call('FCALL', 'bench_min_acquire', 2, k, sessionKey, `cost-${i}`, record, String(TTL), '0', label, session, retain, '2000', '');
      await client.call('FCALL', 'bench_min_release', 1, k, `cost-${i}`, '1', retain);
    },
    'empty functions': async (i) => {
      await client.call('FCALL', 'bench_min_empty', 2, 'bench:{empty}', sessionKey, `cost-${i}`, 'e', String(TTL), '0', label, session, retain, '2000', '');
      await client.call('FCALL', 'bench_min_empty', 1, 'bench:{empty}', `cost-${i}`, '1', retain);
    },
    floor: async (i) => {
      const token = `cost-${i}`;
      await client.set(`bench:floor:${i % 64}`, token, 'PX', TTL, 'NX');
      await client.cad(`bench:floor:${i % 64}`, token);
    },
  };
  const out = {};
  for (const [name, run] of Object.entries(pair)) {
    for (let i = 0; i < 200; i++) await run(i); // warm-up
    const before = await usec();
    for (let i = 0; i < pairs; i++) await run(i);
    out[name] = ((await usec()) - before) / pairs;
  }
  await client.call('FUNCTION', 'DELETE', 'leasehold_bench_min');
  await client.quit();
  return out;
}

// ---------------------------------------------------------------------------------------------
// Child process of the 4-process contended run
// ---------------------------------------------------------------------------------------------
if (argv.includes('--child')) {
  const r = await contendedWorkers(opt('child'), opt('url'), opt('key'), 2, Number(opt('seconds')), Number(opt('start')), Number(opt('base')));
  process.stdout.write(JSON.stringify(r));
  process.exit(0);
}

// ---------------------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------------------
async function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

let server;
let dir;
let url = opt('url');
if (!url) {
  const port = await freePort();
  dir = mkdtempSync(join(tmpdir(), 'leasehold-bench-'));
  server = spawn(
    process.env.LEASEHOLD_TEST_REDIS_SERVER ?? 'redis-server',
    ['--port', String(port), '--bind', '127.0.0.1', '--dir', dir, '--save', '', '--appendonly', 'no', '--loglevel', 'warning'],
    { stdio: 'ignore' },
  );
  url = `redis://127.0.0.1:${port}`;
}
const cleanup = () => {
  server?.kill('SIGKILL');
  if (dir) rmSync(dir, { recursive: true, force: true });
};
process.on('exit', cleanup);
const admin = new Redis(url, { retryStrategy: (n) => (n > 50 ? null : 100) });
admin.on('error', () => {}); // refused until the server we just started listens; ioredis retries
await admin.ping();
const version = /redis_version:(\S+)/.exec(await admin.info('server'))[1];

const seconds = Number(opt('seconds', '2'));
// --only runs some parts (default all): quicker runs while tuning; the recorded figures come from full runs.
const only = new Set(opt('only', 'uncontended,contended,commands,renewals,server').split(','));
const rounds = Number(opt('rounds', '3'));
const names = ['leasehold', 'redlock', 'redlock-1ms', 'redis-semaphore', 'floor'];
const uncontendedNames = ['leasehold', 'leasehold-autopipe', 'leasehold-calls', 'redlock', 'redis-semaphore', 'floor'];
const renewalNames = ['leasehold', 'redlock', 'redis-semaphore', 'floor'];
const results = {};
const add = (figure, name, value) => ((results[figure] ??= {})[name] ??= []).push(value);

console.log(
  `leasehold Redis benchmark — Redis ${version} at ${url}, Node ${process.version}, ${cpus().length} × ${cpus()[0]?.model ?? 'cpu'}, ${Math.round(totalmem() / 2 ** 30)} GB`,
);
console.log(`${rounds} interleaved rounds, ${seconds} s per scenario per library per round; hold ${HOLD_MS} ms in contended runs\n`);
for (let round = 1; round <= rounds; round++) {
  process.stderr.write(`round ${round}/${rounds}:`);
  for (const name of only.has('uncontended') ? uncontendedNames : []) {
    process.stderr.write(` ${name}`);
    add('uncontended, 1 client in sequence (pairs/s)', name, await uncontended(name, url, 1, seconds));
    add('uncontended, 64 concurrent loops on distinct keys (pairs/s)', name, await uncontended(name, url, 64, seconds));
  }
  for (const name of only.has('contended') ? names : []) {
    process.stderr.write(` ${name}*`);
    const one = await contendedOneProcess(name, url, seconds);
    add('contended, 8 workers in 1 process: sections/s', name, one.perSecond);
    add('contended, 1 process: hand-off p50 (ms)', name, one.p50);
    add('contended, 1 process: hand-off p99 (ms)', name, one.p99);
    add('contended, 1 process: longest wait (ms)', name, one.longestWait);
    add("contended, 1 process: Jain's index", name, one.jain);
    add('contended, 1 process: releaser barges back (share)', name, one.barge);
    add('contended, 1 process: waits given up', name, one.gaveUp);
    const four = await contendedProcesses(name, url, seconds);
    add('contended, 8 workers in 4 processes: sections/s', name, four.perSecond);
    add('contended, 4 processes: hand-off p50 (ms)', name, four.p50);
    add('contended, 4 processes: hand-off p99 (ms)', name, four.p99);
    add('contended, 4 processes: longest wait (ms)', name, four.longestWait);
    add("contended, 4 processes: Jain's index", name, four.jain);
    add('contended, 4 processes: releaser barges back (share)', name, four.barge);
  }
  process.stderr.write('\n');
}
process.stderr.write('commands per section (MONITOR):');
for (const name of only.has('commands') ? names : []) {
  process.stderr.write(` ${name}`);
  const c = await commandsPerSection(name, url);
  add('contended: client commands per critical section', name, c.client);
  add('contended: + commands inside scripts', name, c.inScripts);
}
process.stderr.write('\nrenewals (10,000 leases):');
const cadences = {};
for (const name of only.has('renewals') ? renewalNames : []) {
  process.stderr.write(` ${name}`);
  const r = await renewals(name, url);
  add('renewal commands per renewal interval, 1 client, 10,000 leases of ttl 3 s', name, r.perInterval);
  add('renewal commands per second, same run', name, r.perSecond);
  cadences[name] = r.cadence;
}
process.stderr.write('\nserver time per pair (INFO commandstats):');
const serverRounds = [];
for (let round = 0; round < (only.has('server') ? rounds : 0); round++) {
  process.stderr.write(` ${round + 1}`);
  serverRounds.push(await serverCost(url));
}
process.stderr.write('\n\n');

// Median of the rounds; ratios of leasehold to each peer.
const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
};
const fmt = (v) =>
  v === undefined || Number.isNaN(v)
    ? '—'
    : Math.abs(v) >= 100
      ? Math.round(v).toLocaleString('en-US')
      : Math.abs(v) >= 10
        ? v.toFixed(1)
        : v.toFixed(v < 1 ? 3 : 2);
const columns = ['leasehold', 'leasehold-autopipe', 'leasehold-calls', 'redlock', 'redlock-1ms', 'redis-semaphore', 'floor'];
const peers = ['redlock', 'redlock-1ms', 'redis-semaphore', 'floor'];
const header = ['figure', ...columns, ...peers.map((n) => `lh / ${n}`)];
const rows = [header, header.map(() => '---')];
for (const [figure, byName] of Object.entries(results)) {
  const m = Object.fromEntries(Object.entries(byName).map(([k, v]) => [k, median(v)]));
  const lh = m.leasehold;
  rows.push([
    figure,
    ...columns.map((n) => fmt(m[n])),
    ...peers.map((n) => (m[n] && lh !== undefined && m[n] !== 0 ? `${lh / m[n] < 0.01 ? `1/${fmt(m[n] / lh)}` : (lh / m[n]).toFixed(2)}×` : '—')),
  ]);
}
console.log(rows.map((r) => `| ${r.join(' | ')} |`).join('\n'));
const calls = Object.entries(results).filter(([f, by]) => f.startsWith('uncontended') && by['leasehold-calls'] && by.floor);
if (calls.length > 0) {
  console.log(
    `\nleasehold-calls / floor (what the two functions' server-side work leaves to any client): ${calls.map(([f, by]) => `${f.replace('uncontended, ', '').replace(' (pairs/s)', '')} ${(median(by['leasehold-calls']) / median(by.floor)).toFixed(2)}×`).join('; ')}`,
  );
}
if (serverRounds.length > 0) {
  const names = Object.keys(serverRounds[0]);
  console.log(
    `\nserver µs per acquire+release pair, sequential (INFO commandstats, median of ${serverRounds.length}): ${names.map((n) => `${n} ${median(serverRounds.map((r) => r[n])).toFixed(1)}`).join('; ')}`,
  );
  console.log(
    "  functions = leasehold's acquire and release on a free key; same redis.calls = the 8 calls they make there, without the logic around them; empty functions = the same arguments, no calls; floor = SET NX PX + compare-and-delete script",
  );
}
console.log(
  `\nrenewal cadence: ${Object.entries(cadences)
    .map(([k, v]) => `${k}: ${v}`)
    .join('; ')}`,
);
console.log(
  `redlock = defaults (retryCount 10, retryDelay 200 ms, retryJitter 100 ms); redlock-1ms = retryDelay 1, retryJitter 1, retryCount -1; floor polls every 1 ms when busy.`,
);
admin.disconnect();
cleanup();
process.exit(0);

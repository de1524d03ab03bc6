#!/usr/bin/env node
/**
 * `npm run check:pack`: packs leasehold as `npm publish` would and installs the tarball in an empty
 * project, to check what a user gets (.ci/run runs it before the tests):
 *
 * 1. the tarball holds LICENSE, README.md, CHANGELOG.md and dist/, no src/ or test/, and no source
 *    map whose sources are neither packed nor inlined;
 * 2. `npm i ./leasehold-*.tgz` installs none of the optional peers (pg, mysql2, ioredis, etcd3 and so
 *    no gRPC or protobufjs; prom-client, @opentelemetry/*, fastify, node-cron);
 * 3. the README's SQLite example runs there and prints what it should, and so does `leasehold run`;
 * 4. each entry point whose optional peer is missing (pg, mysql2, ioredis, etcd3, @opentelemetry/api) says
 *    which package to install (InvalidArgumentError, argument `dependency`) when used, and so does
 *    createLocks({ url }) for each backend: never a raw ERR_MODULE_NOT_FOUND; leasehold/node-cron,
 *    which loads nothing of node-cron (its RunCoordinator is an interface), works without it;
 *    leasehold/http, which needs no package (Node's http), loads, and an unreachable service is a
 *    BackendUnavailableError naming `http`, through httpBackend and through createLocks({ url }).
 *
 * The package is built in a copy of the sources (never in ./dist, which tests may be reading). The
 * project installs from npm's cache where it can; better-sqlite3 is installed without its install
 * script and given this checkout's compiled addon when the versions match (building it from source
 * takes about two minutes on a 2-core machine), else rebuilt.
 */
import { spawnSync } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, posix } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const keep = process.argv.includes('--keep');
const started = performance.now();
const work = mkdtempSync(join(tmpdir(), 'leasehold-pack-'));
const failures = [];

/**
 * Each entry point whose package is an optional peer, used without it: `use` (the body of an async
 * function given the imported module `m` and `createLocks`) must throw an InvalidArgumentError
 * naming the package; `url` (where there is one) must make createLocks({ url }) reject the same way.
 */
const OPTIONAL = [
  { entry: 'leasehold/postgres', pkg: 'pg', use: "m.postgresBackend({ connectionString: 'postgres://127.0.0.1:1/none' })", url: 'postgres://127.0.0.1:1/none' },
  { entry: 'leasehold/mysql', pkg: 'mysql2', use: "m.mysqlBackend({ uri: 'mysql://127.0.0.1:1/none' })", url: 'mysql://127.0.0.1:1/none' },
  { entry: 'leasehold/redis', pkg: 'ioredis', use: "m.redisBackend({ url: 'redis://127.0.0.1:1' })", url: 'redis://127.0.0.1:1' },
  { entry: 'leasehold/etcd', pkg: 'etcd3', use: "m.etcdBackend({ hosts: ['http://127.0.0.1:1'] })", url: 'etcd://127.0.0.1:1' },
  { entry: 'leasehold/metrics', pkg: '@opentelemetry/api', use: "m.traceLocks(createLocks({ url: 'memory:' }))" },
];
/** Packages that only the optional entry points need: none may be installed by `npm i leasehold`. */
const FORBIDDEN = ['pg', 'mysql2', 'ioredis', 'etcd3', '@grpc', 'protobufjs', 'prom-client', '@opentelemetry', 'fastify', 'node-cron'];

function step(name) {
  console.log(`check-pack: ${name} (${((performance.now() - started) / 1000).toFixed(1)} s)`);
}

function check(ok, message) {
  if (!ok) {
    failures.push(message);
    console.error(`check-pack: FAIL ${message}`);
  }
}

function run(command, args, cwd, env = {}) {
  const r = spawnSync(command, args, { cwd, encoding: 'utf8', env: { ...process.env, ...env }, maxBuffer: 64 * 1024 * 1024 });
  if (r.error) throw r.error;
  return r;
}

function runOk(command, args, cwd, env) {
  const r = run(command, args, cwd, env);
  if (r.status !== 0) {
    throw new Error(`${command} ${args.join(' ')} (in ${cwd}) exited ${r.status}:\n${r.stdout}\n${r.stderr}`);
  }
  return r.stdout;
}

try {
  // 1. Stage the files the package is built from, and pack it the way `npm publish` does (prepare
  //    and prepack build dist/ from scratch there).
  step('building and packing a copy of the package');
  const stage = join(work, 'package');
  mkdirSync(stage);
  for (const f of ['package.json', 'README.md', 'LICENSE', 'CHANGELOG.md', 'tsconfig.json', 'tsconfig.build.json']) {
    if (existsSync(join(root, f))) cpSync(join(root, f), join(stage, f));
  }
  cpSync(join(root, 'src'), join(stage, 'src'), { recursive: true });
  symlinkSync(join(root, 'node_modules'), join(stage, 'node_modules'), 'dir');
  const packed = JSON.parse(runOk('npm', ['pack', '--json', '--pack-destination', work], stage))[0];
  const tarball = join(work, packed.filename);
  const files = new Set(packed.files.map((f) => f.path));

  for (const f of ['LICENSE', 'README.md', 'CHANGELOG.md', 'package.json', 'dist/index.js', 'dist/index.d.ts', 'dist/cli/main.js']) {
    check(files.has(f), `the tarball lacks ${f}`);
  }
  const stray = [...files].filter((f) => !f.startsWith('dist/') && !['LICENSE', 'README.md', 'CHANGELOG.md', 'package.json'].includes(f));
  check(stray.length === 0, `the tarball holds files outside dist/: ${stray.join(', ')}`);
  for (const map of [...files].filter((f) => f.endsWith('.map'))) {
    const { sources = [], sourcesContent = [] } = JSON.parse(readFileSync(join(stage, map), 'utf8'));
    sources.forEach((source, i) => {
      const target = posix.normalize(posix.join(posix.dirname(map), source));
      check(files.has(target) || typeof sourcesContent[i] === 'string', `${map} points at ${source}, which is neither packed nor inlined`);
    });
  }
  console.log(`check-pack: ${packed.filename}: ${files.size} files, ${(packed.size / 1024).toFixed(0)} kB packed`);

  // 2. Install it in an empty project.
  step('installing the tarball in an empty project');
  const app = join(work, 'app');
  mkdirSync(app);
  writeFileSync(join(app, 'package.json'), `${JSON.stringify({ name: 'leasehold-pack-check', private: true, type: 'module' }, null, 2)}\n`);
  const ourSqlite = join(root, 'node_modules', 'better-sqlite3');
  const sqliteVersion = JSON.parse(readFileSync(join(ourSqlite, 'package.json'), 'utf8')).version;
  const npmInstall = ['install', '--no-audit', '--no-fund', '--prefer-offline', '--ignore-scripts'];
  runOk('npm', [...npmInstall, tarball, `better-sqlite3@${sqliteVersion}`], app);
  const theirSqlite = join(app, 'node_modules', 'better-sqlite3');
  const addon = join('build', 'Release', 'better_sqlite3.node');
  if (existsSync(join(ourSqlite, addon)) && JSON.parse(readFileSync(join(theirSqlite, 'package.json'), 'utf8')).version === sqliteVersion) {
    mkdirSync(dirname(join(theirSqlite, addon)), { recursive: true });
    cpSync(join(ourSqlite, addon), join(theirSqlite, addon));
  } else {
    step('building better-sqlite3 from source (no compiled addon of the same version here)');
    runOk('npm', ['rebuild', 'better-sqlite3'], app);
  }

  const installed = [];
  const walk = (dir) => {
    for (const name of readdirSync(dir)) {
      if (name.startsWith('.')) continue;
      if (FORBIDDEN.includes(name)) installed.push(join(dir, name).slice(app.length + 1));
      const nested = name.startsWith('@') ? readdirSync(join(dir, name)).map((n) => join(dir, name, n)) : [join(dir, name)];
      for (const pkg of nested) if (existsSync(join(pkg, 'node_modules'))) walk(join(pkg, 'node_modules'));
    }
  };
  walk(join(app, 'node_modules'));
  check(installed.length === 0, `npm i leasehold installed optional drivers: ${installed.join(', ')}`);

  // 3. The README's SQLite example and the command line, with no driver installed.
  step("running the README's SQLite example and `leasehold run`");
  const readme = readFileSync(join(root, 'README.md'), 'utf8');
  const example = [...readme.matchAll(/```js\n([\s\S]*?)```/g)].map((m) => m[1]).find((code) => code.includes('sqliteFence(db)'));
  check(example !== undefined, 'README.md has no ```js example with sqliteFence(db)');
  if (example !== undefined) {
    writeFileSync(join(app, 'example.mjs'), example);
    const r = run(process.execPath, ['example.mjs'], app, { LEASEHOLD_URL: '' });
    check(
      r.status === 0 && r.stdout === 'document 42, recomputed\n',
      `the README's SQLite example printed ${JSON.stringify(r.stdout)} (exit ${r.status}): ${r.stderr}`,
    );
  }
  const bin = join(app, 'node_modules', '.bin', 'leasehold');
  const cli = run(bin, ['run', 'pack-check', '--url', 'sqlite:./cli.db', '--', process.execPath, '-e', 'console.log(process.env.LEASEHOLD_TOKEN)'], app);
  check(cli.status === 0 && cli.stdout === '1\n', `leasehold run printed ${JSON.stringify(cli.stdout)} (exit ${cli.status}): ${cli.stderr}`);

  // 4. Each backend without its driver names the package to install.
  step('using each optional entry point without its package');
  const probe = `
    import { createLocks } from 'leasehold';
    const seen = (error) => ({ name: error?.name, code: error?.code, argument: error?.argument, message: String(error?.message) });
    const none = { name: 'none', message: 'no error' };
    const out = [];
    ${OPTIONAL.map(
      (o) => `
    {
      const result = { entry: ${JSON.stringify(o.entry)}, pkg: ${JSON.stringify(o.pkg)}, url: ${JSON.stringify(o.url ?? null)} };
      try {
        const m = await import(result.entry);
        await (async () => { ${o.use}; })();
        result.viaImport = none;
      } catch (error) { result.viaImport = seen(error); }
      if (result.url !== null) {
        const locks = createLocks({ url: result.url });
        try {
          await locks.tryAcquire('pack-check', { ttlMs: 5_000 });
          result.viaUrl = none;
        } catch (error) { result.viaUrl = seen(error); }
        await locks.close().catch(() => {});
      }
      out.push(result);
    }`,
    ).join('')}
    console.log(JSON.stringify(out));
  `;
  writeFileSync(join(app, 'probe.mjs'), probe);
  const r = run(process.execPath, ['probe.mjs'], app);
  check(r.status === 0, `the missing-driver probe exited ${r.status}: ${r.stderr}`);
  if (r.status === 0) {
    for (const d of JSON.parse(r.stdout)) {
      const ways = [[`import('${d.entry}') and use it`, d.viaImport]];
      if (d.url !== null) ways.push([`createLocks({ url: '${d.url}' })`, d.viaUrl]);
      for (const [how, e] of ways) {
        const ok =
          e.name === 'InvalidArgumentError' &&
          e.code === 'INVALID_ARGUMENT' &&
          e.argument === 'dependency' &&
          // the package's own name, as `npm install` takes it (not a subpath such as mysql2/promise)
          new RegExp(`npm install ${d.pkg.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')}(?![\\w/@-])`).test(e.message);
        check(ok, `${how} without ${d.pkg}: expected InvalidArgumentError naming ${d.pkg}, got ${e.name}: ${e.message}`);
        if (ok) console.log(`check-pack: ${how}: ${e.message}`);
      }
    }
  }
  // leasehold/node-cron needs no node-cron to load: a coordinator over the memory backend answers.
  const cronProbe = `
    import { createLocks } from 'leasehold';
    import { cronCoordinator } from 'leasehold/node-cron';
    const locks = createLocks({ url: 'memory:' });
    const coordinator = cronCoordinator(locks);
    const key = 'pack-check:2030-01-01T00:00:00.000Z';
    console.log(await coordinator.shouldRun(key, 5_000), coordinator.lease(key)?.token);
    await coordinator.onComplete(key);
    await locks.close();
  `;
  writeFileSync(join(app, 'cron-probe.mjs'), cronProbe);
  const cron = run(process.execPath, ['cron-probe.mjs'], app);
  const cronOk = cron.status === 0 && cron.stdout === 'true 1n\n';
  check(cronOk, `leasehold/node-cron without node-cron printed ${JSON.stringify(cron.stdout)} (exit ${cron.status}): ${cron.stderr}`);
  if (cronOk) console.log('check-pack: leasehold/node-cron without node-cron: a coordinator took a slot (token 1)');
  // leasehold/http needs no package at all: it loads, and a service that does not answer is BackendUnavailableError('http').
  const httpProbe = `
    import { createLocks } from 'leasehold';
    import { httpBackend } from 'leasehold/http';
    const out = [];
    for (const locks of [createLocks({ backend: httpBackend({ url: 'http://127.0.0.1:1' }) }), createLocks({ url: 'http://127.0.0.1:1' })]) {
      try {
        await locks.tryAcquire('pack-check', { ttlMs: 5_000 });
        out.push('no error');
      } catch (error) { out.push(\`\${error?.code} \${error?.backend}\`); }
      await locks.close().catch(() => {});
    }
    console.log(out.join(','));
  `;
  writeFileSync(join(app, 'http-probe.mjs'), httpProbe);
  const http = run(process.execPath, ['http-probe.mjs'], app);
  const httpOk = http.status === 0 && http.stdout === 'BACKEND_UNAVAILABLE http,BACKEND_UNAVAILABLE http\n';
  check(httpOk, `leasehold/http against a closed port printed ${JSON.stringify(http.stdout)} (exit ${http.status}): ${http.stderr}`);
  if (httpOk) console.log('check-pack: leasehold/http (no package needed): an unreachable service is BackendUnavailableError(http)');
} catch (error) {
  failures.push(error instanceof Error ? error.message : String(error));
  console.error(`check-pack: FAIL ${error instanceof Error ? error.stack : error}`);
} finally {
  if (keep) console.log(`check-pack: kept ${work}`);
  else rmSync(work, { recursive: true, force: true });
}

step(failures.length === 0 ? 'ok' : `${failures.length} problem(s)`);
process.exit(failures.length === 0 ? 0 : 1);

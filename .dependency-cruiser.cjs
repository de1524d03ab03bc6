// The layers of src/, as rules that fail `npm run lint` (CONTRIBUTING.md, "Layers").
//
//   src/core/       the contract and the client: imports only itself and Node's built-ins
//   src/<backend>/  one coordinator (and its fence): imports core, itself and its own driver
//   src/util/       small helpers of the command line and of verify: imports core and built-ins
//   src/verify/     the Jepsen-style check; src/cli/ the command. cli reaches verify through
//                   src/verify/index.ts only, verify never imports cli
//   src/index.ts, src/connect.ts   the composition roots: the only files that import every backend
//
// Type-only imports count too (tsPreCompilationDeps): a type from another layer is a dependency.

/**
 * Each backend folder, the npm packages it may import, and its driver when that is an optional peer
 * dependency (loaded only by src/<backend>/driver.ts, so that a missing driver is a clear error).
 */
const BACKENDS = {
  memory: { packages: [] },
  sqlite: { packages: ['better-sqlite3', '@types/better-sqlite3'] }, // a dependency: the embedded default
  postgres: { packages: ['pg', '@types/pg'], peer: 'pg' },
  redis: { packages: ['ioredis'], peer: 'ioredis' },
  etcd: { packages: ['etcd3'], peer: 'etcd3' },
  mysql: { packages: ['mysql2'], peer: 'mysql2' },
  http: { packages: [] },
};
const backendNames = Object.keys(BACKENDS).join('|');
const peers = Object.values(BACKENDS).flatMap((b) => (b.peer ? [b.peer] : []));
const escapeRegExp = (name) => name.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&');

/** @type {import('dependency-cruiser').IConfiguration} */
module.exports = {
  forbidden: [
    {
      name: 'no-circular',
      severity: 'error',
      comment: 'A cycle makes two modules one: split what both need into a third, lower module.',
      from: {},
      to: { circular: true },
    },
    {
      name: 'core-imports-core-only',
      severity: 'error',
      comment: 'src/core is the contract every backend implements: no I/O library, no backend, no command line.',
      from: { path: '^src/core/' },
      to: { pathNot: ['^src/core/'], dependencyTypesNot: ['core'] },
    },
    {
      name: 'backend-imports-core-and-itself',
      severity: 'error',
      comment: `A backend folder imports src/core and itself, never another backend, src/util, verify, cli or the entry points (${backendNames}).`,
      from: { path: `^src/(${backendNames})/` },
      to: { path: '^src/', pathNot: ['^src/core/', '^src/$1/'] },
    },
    ...Object.entries(BACKENDS).map(([backend, { packages }]) => ({
      name: `${backend}-imports-its-own-driver-only`,
      severity: 'error',
      comment:
        packages.length === 0
          ? `src/${backend} needs no npm package.`
          : `src/${backend} may import ${packages.join(', ')} and Node's built-ins, no other npm package: a user of one backend installs only its driver.`,
      from: { path: `^src/${backend}/` },
      to: {
        dependencyTypesNot: ['core', 'local'],
        ...(packages.length > 0 ? { pathNot: `node_modules/(${packages.map(escapeRegExp).join('|')})/` } : {}),
      },
    })),
    {
      name: 'peer-driver-through-driver-ts',
      severity: 'error',
      comment: `Optional peer drivers (${peers.join(', ')}) are loaded by src/<backend>/driver.ts only, which turns a missing package into an InvalidArgumentError naming it; elsewhere import the driver's values from ./driver.js (type-only imports are erased and fine).`,
      from: { path: '^src/', pathNot: `^src/(${backendNames})/driver\\.ts$` },
      to: { path: `node_modules/(${peers.map(escapeRegExp).join('|')})/`, dependencyTypesNot: ['type-only'] },
    },
    {
      name: 'util-imports-core-only',
      severity: 'error',
      comment: 'src/util holds what verify and the command line share: it depends on neither.',
      from: { path: '^src/util/' },
      to: { path: '^src/', pathNot: ['^src/util/', '^src/core/'] },
    },
    {
      name: 'testing-imports-core-and-vitest-only',
      severity: 'error',
      comment: "leasehold/testing runs the conformance suites for any backend, a third party's too: it imports core, itself and vitest.",
      from: { path: '^src/testing/' },
      to: { pathNot: ['^src/core/', '^src/testing/', 'node_modules/vitest/'], dependencyTypesNot: ['core'] },
    },
    {
      name: 'node-cron-imports-core-only',
      severity: 'error',
      comment:
        "leasehold/node-cron is a RunCoordinator over Locks: it imports core, itself and Node's built-ins; node-cron's interface is written out (structural), so no package is loaded.",
      from: { path: '^src/node-cron/' },
      to: { pathNot: ['^src/core/', '^src/node-cron/'], dependencyTypesNot: ['core'] },
    },
    {
      name: 'fastify-imports-core-and-fastify-only',
      severity: 'error',
      comment:
        "leasehold/fastify is a plugin over core's idempotency: it imports core, itself, fastify (its optional peer; types only, the plugin is a function with fastify-plugin's markers) and Node's built-ins.",
      from: { path: '^src/fastify/' },
      to: { pathNot: ['^src/core/', '^src/fastify/', 'node_modules/fastify/'], dependencyTypesNot: ['core'] },
    },
    {
      name: 'serve-imports-core-connect-and-fastify',
      severity: 'error',
      comment:
        "src/serve (the lock service) imports core, src/connect.ts (coordinator URLs), src/dashboard, src/metrics, src/util, itself, fastify and @fastify/* (optional peers, loaded through requirePeer) and Node's built-ins.",
      from: { path: '^src/serve/' },
      to: {
        pathNot: ['^src/(core|dashboard|metrics|util|serve)/', '^src/connect\\.ts$', 'node_modules/(fastify|@fastify/[^/]+)/'],
        dependencyTypesNot: ['core'],
      },
    },
    {
      name: 'only-cli-imports-serve',
      severity: 'error',
      comment: 'The lock service is a command (leasehold serve): only src/cli reaches it, and the library never loads fastify through it.',
      from: { path: '^src/', pathNot: ['^src/serve/', '^src/cli/'] },
      to: { path: '^src/serve/' },
    },
    {
      name: 'verify-imports-no-cli',
      severity: 'error',
      comment: "verify returns results; mapping them to exit codes and output is the command line's job (shared helpers live in src/util).",
      from: { path: '^src/verify/' },
      to: { path: '^src/cli/' },
    },
    {
      name: 'cli-imports-verify-entry-only',
      severity: 'error',
      comment: 'The command line reaches verify through src/verify/index.ts, never its internals.',
      from: { path: '^src/cli/' },
      to: { path: '^src/verify/', pathNot: '^src/verify/index\\.ts$' },
    },
    {
      name: 'backend-internals-stay-inside',
      severity: 'error',
      comment: 'Outside its folder (and the composition roots), a backend is used through its public entry, src/<backend>/index.ts.',
      from: { path: '^src/', pathNot: [`^src/(${backendNames})/`, '^src/(index|connect)\\.ts$'] },
      to: { path: `^src/(${backendNames})/`, pathNot: `^src/(${backendNames})/index\\.ts$` },
    },
    {
      name: 'src-imports-no-tests',
      severity: 'error',
      comment: 'The package ships src/ only: it cannot import test/ or bench/.',
      from: { path: '^src/' },
      to: { path: '^(test|bench)/' },
    },
    {
      name: 'src-imports-no-dev-dependency',
      severity: 'error',
      comment: 'A package in devDependencies only is not installed for users (drivers are optional peers, listed in both).',
      from: { path: '^src/' },
      to: { dependencyTypes: ['npm-dev'], dependencyTypesNot: ['npm', 'npm-peer', 'type-only'], pathNot: 'node_modules/@types/' },
    },
    {
      name: 'not-to-unresolvable',
      severity: 'error',
      comment: 'An import that does not resolve fails at run time.',
      from: {},
      to: { couldNotResolve: true },
    },
    {
      name: 'no-undeclared-package',
      severity: 'error',
      comment: 'Every npm package src/ imports is in package.json.',
      from: { path: '^src/' },
      to: { dependencyTypes: ['npm-no-pkg', 'npm-unknown'], dependencyTypesNot: ['npm', 'npm-dev', 'npm-peer', 'npm-optional'] },
    },
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    tsPreCompilationDeps: true,
    tsConfig: { fileName: 'tsconfig.json' },
    enhancedResolveOptions: {
      exportsFields: ['exports'],
      conditionNames: ['import', 'require', 'node', 'default', 'types'],
      mainFields: ['module', 'main', 'types', 'typings'],
    },
    reporterOptions: { text: { highlightFocused: true } },
  },
};

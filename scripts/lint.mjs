#!/usr/bin/env node
// `npm run lint`: Biome (lint rules + the formatter's check) over the tree, then dependency-cruiser
// (the import layers of src/, .dependency-cruiser.cjs). Both always run, so one run shows every
// problem; the exit code is non-zero if either found one. `npm run lint:fix` applies Biome's safe fixes
// and the formatter.
import { spawnSync } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const bin = (name) => join(root, 'node_modules', '.bin', name);
const steps = [
  ['biome', [bin('biome'), 'check', '--error-on-warnings', '--max-diagnostics=200', '.']],
  ['dependency-cruiser', [bin('depcruise'), 'src', '--config', '.dependency-cruiser.cjs']],
];

const failed = [];
for (const [name, [command, ...args]] of steps) {
  console.log(`lint: ${name}`);
  const { status, error } = spawnSync(command, args, { cwd: root, stdio: 'inherit' });
  if (error || status !== 0) failed.push(name);
}
if (failed.length > 0) {
  console.error(`lint: failed: ${failed.join(', ')}`);
  process.exit(1);
}
console.log('lint: ok');

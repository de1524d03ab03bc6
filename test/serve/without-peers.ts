// Runs a script against the built server (dist/) as an install without some optional peers would:
// a copy of dist/ beside a node_modules of links to this repository's packages, less the ones named.
// (`npm run build` first: the tests that use it say so when dist/ is missing.)
import { spawnSync } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, readdirSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { tempDir } from '../helpers/env.js';

const root = fileURLToPath(new URL('../../', import.meta.url));

/** Runs `script` (an ES module, at the copy's root: import './dist/…') with Node; returns its stdout, or throws with its stderr. */
export function runWithout(missing: readonly string[], script: string): string {
  if (!existsSync(join(root, 'dist/serve/index.js'))) throw new Error('dist/ is missing: run `npm run build` first');
  const dir = tempDir('leasehold-no-peers-');
  try {
    cpSync(join(root, 'dist'), join(dir.path, 'dist'), { recursive: true });
    writeFileSync(join(dir.path, 'package.json'), JSON.stringify({ name: 'no-peers', type: 'module', private: true }));
    const modules = join(dir.path, 'node_modules');
    mkdirSync(modules);
    const from = join(root, 'node_modules');
    for (const name of readdirSync(from)) {
      if (name.startsWith('.')) continue;
      if (name.startsWith('@')) {
        mkdirSync(join(modules, name));
        for (const sub of readdirSync(join(from, name))) if (!missing.includes(`${name}/${sub}`)) symlinkSync(join(from, name, sub), join(modules, name, sub));
      } else if (!missing.includes(name)) symlinkSync(join(from, name), join(modules, name));
    }
    writeFileSync(join(dir.path, 'script.mjs'), script);
    const run = spawnSync(process.execPath, ['script.mjs'], { cwd: dir.path, encoding: 'utf8', timeout: 60_000 });
    if (run.status !== 0) throw new Error(`script failed (${run.status}): ${run.stderr}`);
    return run.stdout;
  } finally {
    dir.cleanup();
  }
}

/** A script that starts the built server over the memory backend, asks `paths` (GET), and prints { path: [status, body] } as JSON. */
export function askScript(paths: readonly string[]): string {
  return `
import { startLockServer } from './dist/serve/index.js';
import { memoryBackend } from './dist/memory/index.js';
const server = await startLockServer({ backend: memoryBackend(), host: '127.0.0.1', port: 0 });
const answers = {};
const acquire = await fetch(server.url + '/v1/locks/k/acquire', { method: 'POST' });
answers.acquire = [acquire.status, await acquire.json()];
for (const path of ${JSON.stringify(paths)}) {
  const res = await fetch(server.url + path);
  answers[path] = [res.status, await res.text()];
}
await server.close();
console.log(JSON.stringify(answers));
`;
}

#!/usr/bin/env node
// `npm run bench -- NAME [ARGS…]` runs bench/NAME.mjs against the built package (dist/).
import { readdirSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const dir = fileURLToPath(new URL('.', import.meta.url));
const available = readdirSync(dir)
  .filter((f) => f.endsWith('.mjs') && f !== 'run.mjs')
  .map((f) => f.slice(0, -4));
const [name, ...args] = process.argv.slice(2);
if (!name || !available.includes(name)) {
  console.error(`usage: npm run bench -- <${available.join('|')}> [options]`);
  process.exit(64);
}
const r = spawnSync(process.execPath, [`${dir}${name}.mjs`, ...args], { stdio: 'inherit' });
process.exit(r.status ?? 1);

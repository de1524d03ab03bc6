// Shared test set-up: the service URLs found by scripts/test-services.mjs (run by `npm pretest`).
import { existsSync, readFileSync } from 'node:fs';

const envFile = new URL('../.test-env.json', import.meta.url);
if (existsSync(envFile)) {
  const found = JSON.parse(readFileSync(envFile, 'utf8')) as Record<string, string>;
  for (const [name, value] of Object.entries(found)) process.env[name] ??= value;
}

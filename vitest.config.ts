import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    setupFiles: ['test/setup.ts'],
    testTimeout: 30_000,
    hookTimeout: 60_000,
    // Tests that start servers or spawn processes are heavy on a 2-core machine.
    maxWorkers: 2,
    pool: 'forks',
    // The JSON results feed the one-line summary that .ci/run prints ("N passed, N failed").
    reporters: ['default', 'json'],
    outputFile: { json: '.test-results.json' },
  },
});

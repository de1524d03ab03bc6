import { startDashboard } from '../dashboard/server.js';
import { createLocks } from '../index.js';
import { onStopSignals, signalExitCode } from '../util/process.js';
import { CliExit, EXIT } from './exit.js';

export interface DashboardCommandOptions {
  url: string | undefined;
  host: string;
  port: number;
  prefix: string;
}

/**
 * `leasehold dashboard`: serves the live page of the coordinator at `url` until SIGINT/SIGTERM.
 * The coordinator is read once before the server starts: an unreachable one exits 69 at once
 * rather than serving a page that can show nothing; later outages show on the page. A port in
 * use exits 69 too.
 */
export async function runDashboardCommand(o: DashboardCommandOptions, write: (line: string) => void): Promise<number> {
  const locks = createLocks({ url: o.url, holderName: 'leasehold dashboard' });
  try {
    await locks.inspect(o.prefix);
    let dashboard: { url: string; close(): Promise<void> };
    try {
      dashboard = await startDashboard({
        locks,
        host: o.host,
        port: o.port,
        prefix: o.prefix,
        title: `leasehold — ${o.prefix === '' ? 'all keys' : o.prefix}`,
      });
    } catch (error) {
      const code = (error as { code?: string }).code;
      if (code === 'EADDRINUSE' || code === 'EACCES' || code === 'EADDRNOTAVAIL') {
        throw new CliExit(EXIT.UNAVAILABLE, `cannot listen on ${o.host}:${o.port}: ${(error as Error).message}`);
      }
      throw error;
    }
    write(`dashboard: ${dashboard.url} (Ctrl-C to stop)`);
    const stopped = new Promise<NodeJS.Signals>((resolve) => {
      const off = onStopSignals((signal) => {
        off();
        resolve(signal);
      });
    });
    const signal = await stopped;
    await dashboard.close();
    return signal === 'SIGINT' || signal === 'SIGTERM' ? EXIT.OK : signalExitCode(signal);
  } finally {
    await locks.close().catch(() => {});
  }
}

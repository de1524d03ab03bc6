import { InvalidArgumentError } from '../core/errors.js';

/**
 * The database a redis:// URL selects, as ioredis reads it (the path `/N`, else `?db=N`, else 0),
 * checked to be a number: ioredis would send anything else to SELECT, which fails, and then carry on
 * in database 0 without a word. No driver is loaded here (`createLocks({ url })` checks the URL
 * before it loads one). Whether the server has that database is checked on first use (the
 * connection's first command, see `conn/ioredis.ts`).
 */
export function redisUrlDatabase(url: string, argument: string, shown: (url: string) => string = () => 'the URL'): number {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new InvalidArgumentError(argument, `${shown(url)} is not a valid URL`);
  }
  const path = parsed.pathname === '/' ? '' : parsed.pathname.slice(1);
  const fromQuery = parsed.searchParams.get('db');
  const text = path !== '' ? path : (fromQuery ?? '0');
  if (!/^\d{1,9}$/.test(text)) {
    const where = path !== '' ? `the path ${JSON.stringify(parsed.pathname)}` : `db=${JSON.stringify(fromQuery)}`;
    throw new InvalidArgumentError(argument, `a redis:// URL's path (or db=) is the database number, e.g. redis://127.0.0.1:6379/2; got ${where}`);
  }
  return Number(text);
}

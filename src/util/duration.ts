import { InvalidArgumentError } from '../core/errors.js';
import { MAX_DURATION_MS } from '../core/validate.js';

/** Milliseconds per unit. A bare number means seconds, as for sleep(1) and timeout(1). */
const UNIT_MS = Object.freeze({ ms: 1, s: 1_000, m: 60_000, h: 3_600_000 });
type Unit = keyof typeof UNIT_MS;

/** A decimal number (no sign, no exponent) and an optional unit, nothing else: `500ms`, `1.2s`, `2m`, `30`. */
const DURATION = /^(\d+(?:\.\d+)?|\.\d+)(ms|s|m|h)?$/;

/** Words `--wait` accepts for "wait as long as it takes". */
const FOREVER = new Set(['forever', 'inf', 'infinity']);

/**
 * Reads a command-line duration and returns whole milliseconds (rounded to the nearest one):
 * `500ms`, `10s`, `1.5m`, `2h`; a bare number means seconds (`30` is 30 s). Rejects negatives,
 * exponents, spaces, unknown units and anything longer than a timer can express (about 24.8
 * days). With `allowForever`, `forever` (or `inf`, `infinity`) returns `Infinity`.
 *
 * @throws InvalidArgumentError naming `argument`
 */
export function parseDuration(text: unknown, argument = 'duration', options?: { allowForever?: boolean }): number {
  if (typeof text !== 'string') throw new InvalidArgumentError(argument, `expected a duration string, got ${typeof text}`);
  if (options?.allowForever && FOREVER.has(text.toLowerCase())) return Infinity;
  if (text.startsWith('-')) throw new InvalidArgumentError(argument, `must not be negative, got ${JSON.stringify(text)}`);
  const m = DURATION.exec(text);
  if (!m) {
    const shown = text.length > 40 ? `${JSON.stringify(text.slice(0, 40))}…` : JSON.stringify(text);
    throw new InvalidArgumentError(
      argument,
      `expected a duration like 500ms, 10s, 2m or 1h (a bare number means seconds)${options?.allowForever ? ', or forever' : ''}, got ${shown}`,
    );
  }
  const [, amount, unit] = m as unknown as [string, string, Unit | undefined];
  const ms = Math.round(Number(amount) * UNIT_MS[unit ?? 's']);
  if (!Number.isFinite(ms) || ms > MAX_DURATION_MS) {
    throw new InvalidArgumentError(argument, `${text} is too long; at most ${formatDuration(MAX_DURATION_MS)} (${MAX_DURATION_MS} ms)`);
  }
  return ms;
}

/**
 * Formats milliseconds for people: `0ms`, `350ms`, `1.2s`, `45s`, `2m05s`, `3h07m`, `forever`.
 * Short and unambiguous rather than exact: below 10 s it keeps one decimal.
 */
export function formatDuration(ms: number): string {
  if (ms === Infinity) return 'forever';
  if (!Number.isFinite(ms) || ms < 0) return String(ms);
  const whole = Math.round(ms);
  if (whole < 1_000) return `${whole}ms`;
  if (whole < 10_000) return `${trimZero((whole / 1_000).toFixed(1))}s`;
  if (whole < 60_000) return `${Math.round(whole / 1_000)}s`;
  const totalSeconds = Math.round(whole / 1_000);
  if (totalSeconds < 3_600) return `${Math.floor(totalSeconds / 60)}m${pad2(totalSeconds % 60)}s`;
  const totalMinutes = Math.round(whole / 60_000);
  if (totalMinutes < 24 * 60) return `${Math.floor(totalMinutes / 60)}h${pad2(totalMinutes % 60)}m`;
  const hours = Math.round(whole / 3_600_000);
  return `${Math.floor(hours / 24)}d${pad2(hours % 24)}h`;
}

function trimZero(text: string): string {
  return text.endsWith('.0') ? text.slice(0, -2) : text;
}

function pad2(n: number): string {
  return n < 10 ? `0${n}` : String(n);
}

/**
 * The timeline of a verify run as a standalone SVG (hand-written, no dependency): one lane per
 * worker with its lease intervals (held, and "zombie" after the loss signal until it released),
 * its freezes (hatched), the windows in which its requests were held (orange), its clock skew
 * (purple strip), and each write as a mark: accepted (green dot), refused by the fence (red cross),
 * failed (orange triangle). Coordinator downtime is a red band across every lane. Every mark has a
 * <title> (a tooltip in browsers) with the operation, token and times.
 */
import type { HistoryEvent } from './protocol.js';

export interface TimelineInput {
  title: string;
  subtitle: string;
  events: readonly HistoryEvent[];
  /** 1-based worker indexes, in lane order. */
  workers: readonly number[];
  /** End of the time axis (ms); defaults to the last event. */
  endMs?: number;
  /** Operations the checker found at fault (their write mark gets a red ring). */
  flagged?: readonly string[];
}

const W = 1200;
const LEFT = 110;
const RIGHT = 24;
const TOP = 92;
const LANE_H = 34;
const LANE_GAP = 10;
const BOTTOM = 56;
const COLORS = Object.freeze({
  lane: '#f4f5f7',
  held: '#1e88e5',
  zombie: '#bbdefb',
  lost: '#c62828',
  accepted: '#2e7d32',
  refused: '#d32f2f',
  failed: '#ef6c00',
  delay: '#ff9800',
  clock: '#8e24aa',
  crash: '#e53935',
  pause: '#616161',
  text: '#212121',
  axis: '#757575',
});

/** Escapes text for XML content and attribute values. */
export function esc(text: string): string {
  return text.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&apos;' })[c]!);
}

const n2 = (x: number): string => (Math.round(x * 100) / 100).toString();
const sec = (ms: number): string => `${(ms / 1000).toFixed(3)}s`;

export function timelineSvg(input: TimelineInput): string {
  const events = [...input.events].sort((a, b) => a.t - b.t);
  const end = Math.max(input.endMs ?? 0, events.at(-1)?.t ?? 0, 1);
  const lanes = input.workers;
  const height = TOP + lanes.length * (LANE_H + LANE_GAP) + BOTTOM;
  const x = (t: number): number => LEFT + (Math.max(0, Math.min(t, end)) / end) * (W - LEFT - RIGHT);
  const laneY = (w: number): number => TOP + Math.max(0, lanes.indexOf(w)) * (LANE_H + LANE_GAP);
  const out: string[] = [];
  const rect = (x1: number, y: number, x2: number, h: number, attrs: string, title?: string): void => {
    const width = Math.max(1, x2 - x1);
    out.push(`<rect x="${n2(x1)}" y="${n2(y)}" width="${n2(width)}" height="${n2(h)}" ${attrs}>${title ? `<title>${esc(title)}</title>` : ''}</rect>`);
  };

  out.push(`<?xml version="1.0" encoding="UTF-8"?>`);
  out.push(
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${height}" viewBox="0 0 ${W} ${height}" font-family="system-ui, sans-serif" font-size="12">`,
  );
  out.push(
    `<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="6" height="6" fill="${COLORS.pause}" fill-opacity="0.15"/><line x1="0" y1="0" x2="0" y2="6" stroke="${COLORS.pause}" stroke-width="2.5"/></pattern></defs>`,
  );
  out.push(`<rect width="${W}" height="${height}" fill="#ffffff"/>`);
  out.push(`<text x="${LEFT}" y="22" font-size="15" font-weight="bold" fill="${COLORS.text}">${esc(input.title)}</text>`);
  out.push(`<text x="${LEFT}" y="40" fill="${COLORS.axis}">${esc(input.subtitle)}</text>`);
  legend(out);

  // Coordinator downtime: a band across every lane.
  const laneTop = TOP - 4;
  const laneBottom = TOP + lanes.length * (LANE_H + LANE_GAP) - LANE_GAP + 4;
  let down: number | undefined;
  const downs: [number, number][] = [];
  for (const e of events) {
    if (e.type === 'crash') down = e.t;
    if (e.type === 'restart' && down !== undefined) {
      downs.push([down, e.t]);
      down = undefined;
    }
  }
  if (down !== undefined) downs.push([down, end]);
  out.push('<g class="crashes">');
  for (const [from, to] of downs)
    rect(x(from), laneTop, x(to), laneBottom - laneTop, `fill="${COLORS.crash}" fill-opacity="0.14"`, `coordinator down ${sec(from)} – ${sec(to)}`);
  out.push('</g>');

  const flagged = new Set(input.flagged ?? []);
  for (const w of lanes)
    lane(
      out,
      w,
      events.filter((e) => 'w' in e && e.w === w),
      laneY(w),
      x,
      end,
      rect,
      flagged,
    );

  // Time axis.
  const axisY = laneBottom + 8;
  out.push(`<g class="axis" stroke="${COLORS.axis}" fill="${COLORS.axis}">`);
  out.push(`<line x1="${LEFT}" y1="${axisY}" x2="${W - RIGHT}" y2="${axisY}"/>`);
  const step = niceStep(end);
  for (let t = 0; t <= end + 1e-6; t += step) {
    out.push(`<line x1="${n2(x(t))}" y1="${axisY}" x2="${n2(x(t))}" y2="${axisY + 5}"/>`);
    out.push(
      `<text x="${n2(x(t))}" y="${axisY + 18}" text-anchor="middle" stroke="none">${esc(step < 1000 ? `${(t / 1000).toFixed(1)}s` : `${Math.round(t / 1000)}s`)}</text>`,
    );
  }
  out.push(`<text x="${W - RIGHT}" y="${axisY + 36}" text-anchor="end" stroke="none">time since start (CLOCK_MONOTONIC of this machine)</text>`);
  out.push('</g>');
  out.push('</svg>');
  return `${out.join('\n')}\n`;
}

function legend(out: string[]): void {
  const items: [string, string][] = [
    [`<rect width="18" height="10" fill="${COLORS.held}"/>`, 'lease held'],
    [`<rect width="18" height="10" fill="${COLORS.zombie}" stroke="${COLORS.held}" stroke-dasharray="2,2"/>`, 'no longer valid, not released'],
    [`<line x1="9" y1="-2" x2="9" y2="12" stroke="${COLORS.lost}" stroke-width="2"/>`, 'signal aborted'],
    [`<rect width="18" height="10" fill="url(#hatch)"/>`, 'frozen (SIGSTOP)'],
    [`<rect width="18" height="10" fill="${COLORS.delay}" fill-opacity="0.35"/>`, 'requests held'],
    [`<rect y="6" width="18" height="4" fill="${COLORS.clock}"/>`, 'clock skewed'],
    [`<rect width="18" height="10" fill="${COLORS.crash}" fill-opacity="0.2"/>`, 'coordinator down'],
    [`<circle cx="9" cy="5" r="4" fill="${COLORS.accepted}"/>`, 'write accepted'],
    [`<path d="M5 1 L13 9 M13 1 L5 9" stroke="${COLORS.refused}" stroke-width="2"/>`, 'write refused'],
    [`<path d="M9 0 L14 10 L4 10 Z" fill="${COLORS.failed}"/>`, 'write failed'],
    [`<circle cx="9" cy="5" r="6" fill="none" stroke="${COLORS.lost}" stroke-width="2"/>`, 'stale write committed'],
  ];
  out.push('<g class="legend">');
  let lx = LEFT;
  let ly = 56;
  for (const [swatch, label] of items) {
    const width = 26 + label.length * 6.2 + 16;
    if (lx + width > W - RIGHT) {
      lx = LEFT;
      ly += 18;
    }
    out.push(`<g transform="translate(${n2(lx)},${ly})">${swatch}<text x="24" y="9" fill="${COLORS.text}">${esc(label)}</text></g>`);
    lx += width;
  }
  out.push('</g>');
}

type Rect = (x1: number, y: number, x2: number, h: number, attrs: string, title?: string) => void;

function lane(
  out: string[],
  w: number,
  events: readonly HistoryEvent[],
  y: number,
  x: (t: number) => number,
  end: number,
  rect: Rect,
  flagged: ReadonlySet<string>,
): void {
  const pid = events.find((e): e is Extract<HistoryEvent, { type: 'ready' }> => e.type === 'ready')?.pid;
  out.push(`<g class="lane" data-worker="${w}">`);
  rect(LEFT, y, x(end), LANE_H, `fill="${COLORS.lane}"`);
  out.push(`<text x="${LEFT - 10}" y="${n2(y + 15)}" text-anchor="end" font-weight="bold" fill="${COLORS.text}">w${w}</text>`);
  if (pid !== undefined) out.push(`<text x="${LEFT - 10}" y="${n2(y + 29)}" text-anchor="end" font-size="10" fill="${COLORS.axis}">pid ${pid}</text>`);

  // Freezes and held requests (under the lease bars).
  let paused: { t: number; plannedMs: number } | undefined;
  let delayed: { t: number } | undefined;
  for (const e of events) {
    if (e.type === 'pause') paused = e;
    if (e.type === 'resume' && paused) {
      rect(x(paused.t), y, x(e.t), LANE_H, 'fill="url(#hatch)"', `frozen (SIGSTOP) ${sec(paused.t)} – ${sec(e.t)}: ${Math.round(e.t - paused.t)} ms`);
      paused = undefined;
    }
    if (e.type === 'delay') delayed = e;
    if (e.type === 'delay-end' && delayed) {
      rect(
        x(delayed.t),
        y,
        x(e.t),
        LANE_H,
        `fill="${COLORS.delay}" fill-opacity="0.35"`,
        `requests held ${sec(delayed.t)} – ${sec(e.t)} (${e.heldBytes} bytes), then delivered in order`,
      );
      delayed = undefined;
    }
  }
  if (paused) rect(x(paused.t), y, x(end), LANE_H, 'fill="url(#hatch)"', `frozen from ${sec(paused.t)}`);
  if (delayed) rect(x(delayed.t), y, x(end), LANE_H, `fill="${COLORS.delay}" fill-opacity="0.35"`, `requests held from ${sec(delayed.t)}`);

  // Clock skew: a strip at the bottom of the lane while the rate is not 1.
  let skew: { t: number; rate: number } | undefined;
  const strip = (from: number, to: number, rate: number): void =>
    rect(x(from), y + LANE_H - 4, x(to), 4, `fill="${COLORS.clock}"`, `clock rate ×${rate} ${sec(from)} – ${sec(to)}`);
  for (const e of events) {
    if (e.type !== 'clock') continue;
    if (skew && skew.rate !== 1) strip(skew.t, e.t, skew.rate);
    skew = { t: e.t, rate: e.rate };
  }
  if (skew && skew.rate !== 1) strip(skew.t, end, skew.rate);

  // Leases: valid from the grant until the loss signal or local validity ran out, whichever came
  // first; from there to the release the worker ran on a lease it no longer had (a zombie).
  type Bar = { t: number; op: string; lostAt?: number; reason?: string; validUntil?: number };
  const open = new Map<string, Bar>();
  const bar = (token: string, l: Bar, until: number): void => {
    const heldUntil = Math.min(l.lostAt ?? until, l.validUntil ?? until, until);
    rect(x(l.t), y + 8, x(heldUntil), LANE_H - 16, `fill="${COLORS.held}"`, `${l.op}: token ${token}, valid ${sec(l.t)} – ${sec(heldUntil)}`);
    if (until > heldUntil + 0.5)
      rect(
        x(heldUntil),
        y + 8,
        x(until),
        LANE_H - 16,
        `fill="${COLORS.zombie}" stroke="${COLORS.held}" stroke-dasharray="2,2"`,
        `${l.op}: token ${token} no longer valid (${sec(heldUntil)}), released ${sec(until)}`,
      );
    if (l.lostAt !== undefined) {
      out.push(
        `<line x1="${n2(x(l.lostAt))}" y1="${n2(y + 2)}" x2="${n2(x(l.lostAt))}" y2="${n2(y + LANE_H - 2)}" stroke="${COLORS.lost}" stroke-width="2"><title>${esc(`token ${token}: lease.signal aborted (${l.reason}) at ${sec(l.lostAt)}`)}</title></line>`,
      );
    }
  };
  for (const e of events) {
    if (e.type === 'granted') open.set(e.token, { t: e.t, op: e.op });
    if (e.type === 'validity') {
      const l = open.get(e.token);
      if (l) l.validUntil = e.until;
    }
    if (e.type === 'lost') {
      const l = open.get(e.token);
      if (l) Object.assign(l, { lostAt: e.t, reason: e.reason });
    }
    if (e.type === 'release') {
      const l = open.get(e.token);
      if (l) {
        bar(e.token, l, e.t);
        open.delete(e.token);
      }
    }
  }
  for (const [token, l] of open) bar(token, l, end);

  // Writes, at the moment the worker learned the outcome.
  const started = new Map<string, number>();
  for (const e of events) {
    if (e.type === 'write') started.set(e.op, e.t);
    const cx = n2(x(e.t));
    const cy = y + LANE_H / 2;
    const since = (op: string): string => (started.has(op) ? `, sent ${sec(started.get(op)!)}` : '');
    if ((e.type === 'accepted' || e.type === 'write-failed') && flagged.has(e.op)) {
      out.push(
        `<circle class="flagged" cx="${cx}" cy="${n2(cy)}" r="8" fill="none" stroke="${COLORS.lost}" stroke-width="2"><title>${esc(`${e.op}: this write broke the token order or lost an update (see the checks)`)}</title></circle>`,
      );
    }
    if (e.type === 'accepted') {
      out.push(
        `<circle class="write accepted" cx="${cx}" cy="${n2(cy)}" r="4" fill="${COLORS.accepted}" stroke="#fff" stroke-width="1"><title>${esc(`${e.op}: write with token ${e.token} accepted at ${sec(e.t)}${since(e.op)}${e.value === undefined ? '' : `; counter = ${e.value}`}`)}</title></circle>`,
      );
    } else if (e.type === 'refused') {
      out.push(
        `<path class="write refused" d="M${n2(x(e.t) - 4)} ${n2(cy - 4)} L${n2(x(e.t) + 4)} ${n2(cy + 4)} M${n2(x(e.t) + 4)} ${n2(cy - 4)} L${n2(x(e.t) - 4)} ${n2(cy + 4)}" stroke="${COLORS.refused}" stroke-width="2.5"><title>${esc(`${e.op}: token ${e.token} refused by the fence at ${sec(e.t)}${since(e.op)} (highest ${e.highest})`)}</title></path>`,
      );
    } else if (e.type === 'write-failed') {
      out.push(
        `<path class="write failed" d="M${cx} ${n2(cy - 5)} L${n2(x(e.t) + 5)} ${n2(cy + 5)} L${n2(x(e.t) - 5)} ${n2(cy + 5)} Z" fill="${COLORS.failed}"><title>${esc(`${e.op}: write with token ${e.token} failed at ${sec(e.t)}${since(e.op)}: ${e.error}`)}</title></path>`,
      );
    }
  }
  out.push('</g>');
}

/** An axis step giving about 10–20 ticks: 100 ms, 200 ms, 500 ms, 1 s, 2 s, 5 s, 10 s… */
function niceStep(span: number): number {
  for (const s of [100, 200, 500, 1_000, 2_000, 5_000, 10_000, 15_000, 30_000, 60_000, 120_000, 300_000, 600_000]) if (span / s <= 20) return s;
  return Math.ceil(span / 20 / 600_000) * 600_000;
}

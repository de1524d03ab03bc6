import { describe, expect, it } from 'vitest';
import type { HistoryEvent } from '../../src/verify/protocol.js';
import { timelineSvg } from '../../src/verify/svg.js';
import { checkXml } from './xml.js';

const events: HistoryEvent[] = [
  { type: 'ready', t: 0, w: 1, pid: 101 },
  { type: 'ready', t: 0, w: 2, pid: 102 },
  { type: 'start', t: 0 },
  { type: 'clock', t: 1, w: 2, rate: 0.93, offsetMs: 1e9 },
  { type: 'granted', t: 10, w: 1, op: 'w1.1', token: '1', ttlMs: 300 },
  { type: 'validity', t: 10, w: 1, token: '1', until: 305 },
  { type: 'pause', t: 11, w: 1, pid: 101, plannedMs: 600 },
  { type: 'granted', t: 320, w: 2, op: 'w2.1', token: '2', ttlMs: 300 },
  { type: 'write', t: 380, w: 2, op: 'w2.1', token: '2' },
  { type: 'accepted', t: 381, w: 2, op: 'w2.1', token: '2', value: 1 },
  { type: 'release', t: 382, w: 2, op: 'w2.1', token: '2' },
  { type: 'crash', t: 400, what: 'redis-server :1' },
  { type: 'restart', t: 500, what: 'redis-server :1' },
  { type: 'resume', t: 611, w: 1, pid: 101 },
  { type: 'write', t: 612, w: 1, op: 'w1.1', token: '1' },
  { type: 'lost', t: 613, w: 1, token: '1', reason: 'expired', due: 305, running: false },
  { type: 'refused', t: 614, w: 1, op: 'w1.1', token: '1', highest: '2' },
  { type: 'release', t: 615, w: 1, op: 'w1.1', token: '1' },
  { type: 'delay', t: 700, w: 2, plannedMs: 400 },
  { type: 'granted', t: 701, w: 2, op: 'w2.2', token: '3', ttlMs: 300 },
  { type: 'write', t: 760, w: 2, op: 'w2.2', token: '3' },
  { type: 'write-failed', t: 1_100, w: 2, op: 'w2.2', token: '3', error: 'Error: <no answer> & "timeout" in \'pool\'' },
  { type: 'delay-end', t: 1_100, w: 2, heldBytes: 42 },
  { type: 'release', t: 1_101, w: 2, op: 'w2.2', token: '3' },
];

describe('verify: the SVG timeline', () => {
  it('is well-formed XML with one lane per worker, and escapes what it quotes', () => {
    const svg = timelineSvg({ title: 'verify <run> & "seed"', subtitle: 'x', events, workers: [1, 2], flagged: ['w2.1'] });
    const { problems, elements } = checkXml(svg);
    expect(problems).toEqual([]);
    expect(elements[0]!.name).toBe('svg');
    const lanes = elements.filter((e) => e.name === 'g' && e.attributes.class === 'lane');
    expect(lanes.map((l) => l.attributes['data-worker'])).toEqual(['1', '2']);
    expect(svg).toContain('verify &lt;run&gt; &amp; &quot;seed&quot;');
    expect(svg).toContain('&lt;no answer&gt; &amp; &quot;timeout&quot; in &apos;pool&apos;');
    // the marks: one accepted, one refused, one failed, one flagged; a freeze, a held window, a crash band, a skew strip
    expect(elements.filter((e) => e.attributes.class === 'write accepted')).toHaveLength(1);
    expect(elements.filter((e) => e.attributes.class === 'write refused')).toHaveLength(1);
    expect(elements.filter((e) => e.attributes.class === 'write failed')).toHaveLength(1);
    expect(elements.filter((e) => e.attributes.class === 'flagged')).toHaveLength(1);
    expect(svg).toMatch(/frozen \(SIGSTOP\) 0\.011s – 0\.611s: 600 ms/);
    expect(svg).toMatch(/requests held 0\.700s – 1\.100s \(42 bytes\)/);
    expect(svg).toMatch(/coordinator down 0\.400s – 0\.500s/);
    expect(svg).toMatch(/clock rate ×0\.93/);
    expect(svg).toMatch(/lease\.signal aborted \(expired\) at 0\.613s/);
  });

  it('the well-formedness check itself catches broken XML', () => {
    expect(checkXml('<svg><g></svg>').problems).not.toEqual([]);
    expect(checkXml('<svg a="1" a="2"/>').problems).not.toEqual([]);
    expect(checkXml('<svg><text>a & b</text></svg>').problems).not.toEqual([]);
    expect(checkXml('<svg/><svg/>').problems).not.toEqual([]);
    expect(checkXml('<svg t="<"/>').problems).not.toEqual([]);
    expect(checkXml('<?xml version="1.0"?>\n<svg><text>a &amp; b</text></svg>\n').problems).toEqual([]);
  });
});

/**
 * The dashboard page: one HTML document with its style and script inline (no build step, nothing
 * fetched from elsewhere). It connects to `events` (Server-Sent Events, relative to the page) and
 * renders each snapshot: a row per key (mode, holders with label, token and a bar of time left that
 * runs down between updates, waiters, lock-delay, last token) and the timeline of changes. Keys and
 * labels are set as text, never as HTML.
 */
export function dashboardPage(title = 'leasehold'): string {
  const safeTitle = title.replace(/[<>&"]/g, (c) => `&#${c.charCodeAt(0)};`);
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>${safeTitle}</title>
<style>
  :root { color-scheme: light dark; --fg: #1b1f24; --muted: #6a737d; --line: #d8dee4; --bg: #ffffff; --bar: #2da44e; --low: #d29922; --gone: #cf222e; --card: #f6f8fa; }
  @media (prefers-color-scheme: dark) { :root { --fg: #e6edf3; --muted: #8b949e; --line: #30363d; --bg: #0d1117; --card: #161b22; } }
  body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); background: var(--bg); margin: 0; padding: 20px 28px; }
  h1 { font-size: 18px; margin: 0 0 2px; } h2 { font-size: 15px; margin: 22px 0 8px; }
  .sub { color: var(--muted); margin-bottom: 14px; } .sub b { color: var(--fg); font-weight: 600; }
  #status.bad { color: var(--gone); }
  table { border-collapse: collapse; width: 100%; }
  th, td { text-align: left; padding: 6px 10px; border-bottom: 1px solid var(--line); vertical-align: top; }
  th { color: var(--muted); font-weight: 500; font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
  td.key { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; word-break: break-all; }
  .holder { display: grid; grid-template-columns: minmax(120px, 1fr) 70px 160px; gap: 10px; align-items: center; }
  .token { font-family: ui-monospace, monospace; }
  .bar { position: relative; height: 8px; background: var(--card); border: 1px solid var(--line); border-radius: 4px; overflow: hidden; }
  .bar > i { position: absolute; inset: 0 auto 0 0; background: var(--bar); }
  .bar.low > i { background: var(--low); }
  .left { color: var(--muted); font-size: 12px; }
  .none { color: var(--muted); }
  ol#timeline { list-style: none; padding: 0; margin: 0; max-height: 320px; overflow: auto; }
  ol#timeline li { padding: 4px 0; border-bottom: 1px dashed var(--line); font-family: ui-monospace, monospace; font-size: 13px; }
  .kind { display: inline-block; min-width: 88px; font-weight: 600; }
  .granted { color: var(--bar); } .released { color: var(--muted); } .expired { color: var(--low); } .taken-over { color: var(--gone); }
  .empty { color: var(--muted); padding: 10px 0; }
</style>
</head>
<body>
<h1>${safeTitle}</h1>
<div class="sub">prefix <b id="prefix">—</b> · <span id="count">0</span> keys · <span id="status">connecting…</span></div>
<table>
  <thead><tr><th>Key</th><th>Mode</th><th>Holders (label · token · time left)</th><th>Waiters</th><th>Lock-delay</th><th>Last token</th></tr></thead>
  <tbody id="keys"></tbody>
</table>
<div id="nokeys" class="empty">No leases under this prefix.</div>
<h2>Timeline</h2>
<ol id="timeline"></ol>
<div id="nochanges" class="empty">No changes yet.</div>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const el = (tag, cls, text) => { const e = document.createElement(tag); if (cls) e.className = cls; if (text !== undefined) e.textContent = String(text); return e; };
const fmt = (ms) => ms >= 60000 ? (ms / 60000).toFixed(1) + ' min' : ms >= 1000 ? (ms / 1000).toFixed(1) + ' s' : Math.max(0, Math.round(ms)) + ' ms';
let snapshot = null, receivedAt = 0;
const bars = [];
/** The longest time left seen per grant: about its ttl, the bar's full length. */
const longest = new Map();
function render() {
  const tbody = $('keys');
  tbody.replaceChildren();
  bars.length = 0;
  $('prefix').textContent = snapshot.prefix === '' ? '(all keys)' : snapshot.prefix;
  $('count').textContent = snapshot.keys.length;
  $('nokeys').style.display = snapshot.keys.length ? 'none' : '';
  for (const k of snapshot.keys) {
    const tr = el('tr');
    tr.dataset.key = k.key;
    tr.append(el('td', 'key', k.key));
    const mode = k.holders.length ? (k.limit ? k.holders.length + ' of ' + k.limit + ' permits' : k.holders[0].mode) : '—';
    tr.append(el('td', '', mode));
    const td = el('td');
    if (!k.holders.length) td.append(el('span', 'none', '(none)'));
    for (const h of k.holders) {
      const row = el('div', 'holder');
      row.dataset.token = h.token;
      row.append(el('span', '', h.holder), el('span', 'token', '#' + h.token));
      const wrap = el('div');
      const bar = el('div', 'bar'); const fill = el('i'); bar.append(fill);
      const left = el('div', 'left');
      wrap.append(bar, left); row.append(wrap); td.append(row);
      const id = k.key + '\u0000' + h.token;
      const total = Math.max(longest.get(id) || 1, h.expiresInMs);
      longest.set(id, total);
      bars.push({ bar, fill, left, expiresInMs: h.expiresInMs, total });
    }
    tr.append(td, el('td', '', k.waiters), el('td', '', k.lockDelayRemainingMs ? fmt(k.lockDelayRemainingMs) : '—'), el('td', 'token', k.lastToken));
    tbody.append(tr);
  }
  const current = new Set(snapshot.keys.flatMap((k) => k.holders.map((h) => k.key + '\u0000' + h.token)));
  for (const id of longest.keys()) if (!current.has(id)) longest.delete(id);
  tick();
}
function tick() {
  const since = performance.now() - receivedAt;
  for (const b of bars) {
    const left = Math.max(0, b.expiresInMs - since);
    b.fill.style.width = (100 * left / b.total).toFixed(1) + '%';
    b.bar.classList.toggle('low', left < b.total / 3);
    b.left.textContent = fmt(left) + ' left';
  }
}
function addChanges(changes) {
  const list = $('timeline');
  for (const c of changes) {
    const li = el('li');
    li.dataset.kind = c.kind; li.dataset.key = c.key; li.dataset.token = c.token;
    const when = new Date(c.at).toLocaleTimeString();
    li.append(el('span', '', when + '  '), el('span', 'kind ' + c.kind, c.kind), document.createTextNode(' ' + c.key + '  #' + c.token + '  ' + c.holder));
    if (c.previous) li.append(document.createTextNode('  (after #' + c.previous.token + ' ' + c.previous.holder + ' expired)'));
    list.prepend(li);
  }
  while (list.children.length > 200) list.lastChild.remove();
  $('nochanges').style.display = list.children.length ? 'none' : '';
}
const events = new EventSource('events');
events.addEventListener('snapshot', (e) => {
  const data = JSON.parse(e.data);
  snapshot = data.snapshot; receivedAt = performance.now();
  $('timeline').replaceChildren();
  addChanges(data.history);
  $('status').textContent = 'live'; $('status').className = '';
  render();
});
events.addEventListener('update', (e) => {
  const data = JSON.parse(e.data);
  if (data.error) { $('status').textContent = 'coordinator unavailable: ' + data.error; $('status').className = 'bad'; return; }
  $('status').textContent = 'live'; $('status').className = '';
  snapshot = data.snapshot; receivedAt = performance.now();
  addChanges(data.changes);
  render();
});
events.onerror = () => { $('status').textContent = 'reconnecting…'; $('status').className = 'bad'; };
setInterval(tick, 100);
</script>
</body>
</html>
`;
}

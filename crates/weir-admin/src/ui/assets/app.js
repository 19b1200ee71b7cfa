// Weir dashboard: polls GET /api/v1/stats (incrementally, with ?since=SEQ) every sample
// interval and renders listeners, routes, upstreams and servers with their rates, latency
// percentiles and trends; drains and undrains servers through the object API with
// If-Match; shows certificates (GET /certs) and the config history with the keys each
// version changed (GET /history). Plain DOM: every value is set as text, never as HTML.
// The token the user types stays in this tab's sessionStorage and goes out only as an
// Authorization header to this listener.
'use strict';

const SVG_NS = 'http://www.w3.org/2000/svg';
const TOKEN_KEY = 'weir.admin.token';
const CERTS_EVERY_MS = 60000;
const DASH = '–';

const state = {
  token: sessionStorage.getItem(TOKEN_KEY),
  seq: 0,
  version: null,
  points: 150,
  intervalMs: 2000,
  series: new Map(),
  http2Before: new Map(),
  paused: false,
  timer: null,
  inflight: null,
  certsAt: 0,
};

const $ = (id) => document.getElementById(id);

/// An element with attributes (`text`: its text, `class`) and children.
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'text') e.textContent = v;
    else if (k === 'class') e.className = v;
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c);
  return e;
}

// ------------------------------------------------------------------------------ the API

class Unauthorized extends Error {}

async function api(path, options = {}) {
  const headers = Object.assign({ Accept: 'application/json' }, options.headers);
  if (state.token) headers.Authorization = 'Bearer ' + state.token;
  const response = await fetch('/api/v1' + path, Object.assign({}, options, {
    headers, cache: 'no-store', credentials: 'omit', redirect: 'error',
  }));
  let body = null;
  try { body = await response.json(); } catch (_) { body = null; }
  if (response.status === 401) throw new Unauthorized(body && body.error);
  if (!response.ok) {
    const text = body && body.error ? body.error + (body.fix ? ' (fix: ' + body.fix + ')' : '') : 'HTTP ' + response.status;
    const e = new Error(text);
    e.status = response.status;
    throw e;
  }
  const etag = response.headers.get('ETag');
  return { body, version: etag ? etag.replace(/"/g, '') : null };
}

// ------------------------------------------------------------------------------ polling

/// Fetches and shows the latest numbers (`force`: even while paused, after an action).
function poll(force) {
  if (!state.inflight) state.inflight = pollOnce(force === true).finally(() => { state.inflight = null; });
  return state.inflight;
}

async function pollOnce(force) {
  clearTimeout(state.timer);
  if ((state.paused && !force) || document.hidden) return;
  try {
    const { body, version } = await api('/stats?since=' + state.seq);
    if (body.data.seq < state.seq) {
      // Weir restarted: its samples start again from 1.
      state.seq = 0;
      state.series.clear();
      return schedule(0);
    }
    showDashboard();
    merge(body.data);
    render(body.data);
    const changed = version !== state.version;
    state.version = version;
    showStatus(body.data);
    if (changed) loadHistory();
    if (changed || Date.now() - state.certsAt > CERTS_EVERY_MS) loadCerts();
  } catch (e) {
    if (e instanceof Unauthorized) return signedOut(state.token ? 'That token was not accepted.' : '');
    $('status').textContent = 'Cannot reach Weir: ' + e.message + '. Retrying.';
  }
  schedule(state.intervalMs);
}

function schedule(ms) {
  clearTimeout(state.timer);
  if (!state.paused && !document.hidden) state.timer = setTimeout(poll, ms);
}

function showStatus(data) {
  const at = data.at_ms ? new Date(data.at_ms).toLocaleTimeString() : null;
  const parts = [
    state.paused ? 'Paused' : 'Live',
    at ? 'sampled at ' + at : 'waiting for the first sample',
    'config version ' + (state.version || '?'),
    'every ' + data.interval_ms / 1000 + ' s',
  ];
  $('status').textContent = parts.join(' · ');
}

/// A stable key for an object of the stats.
function key(kind, a, b) {
  return [kind, a, b === undefined || b === null ? '' : b].join('\u0000');
}

/// Calls `f(key, object)` for every object of a stats response.
function eachObject(data, f) {
  for (const l of data.listeners) {
    f(key('l', l.name), l);
    for (const r of l.routes) f(key('r', l.name, r.name), r);
  }
  for (const u of data.upstreams) {
    f(key('u', u.name), u);
    for (const s of u.servers) f(key('s', u.name, s.addr), s);
  }
}

/// Adds the response's new points to each object's series (or starts over when the
/// response does not follow on from the last one), keeping the last `points`.
function merge(data) {
  state.points = data.points;
  state.intervalMs = data.interval_ms;
  const follows = state.seq > 0 && data.from === state.seq + 1;
  if (!follows) state.series.clear();
  const seen = new Set();
  eachObject(data, (k, obj) => {
    seen.add(k);
    const series = state.series.get(k) || {};
    for (const [name, values] of Object.entries(obj.series || {})) {
      series[name] = (series[name] || []).concat(values).slice(-state.points);
    }
    state.series.set(k, series);
  });
  for (const k of [...state.series.keys()]) if (!seen.has(k)) state.series.delete(k);
  state.seq = data.seq;
}

// ------------------------------------------------------------------------------ formatting

function fmtInt(n) { return n === null || n === undefined ? DASH : n.toLocaleString('en'); }

function fmtRate(x) {
  if (x === null || x === undefined) return DASH;
  return x >= 100 ? x.toFixed(0) : x >= 10 ? x.toFixed(1) : x.toFixed(2);
}

function fmtPct(x) {
  if (x === null || x === undefined) return DASH;
  const p = x * 100;
  if (p === 0) return '0 %';
  return (p < 0.1 ? '<0.1' : p.toFixed(p < 10 ? 1 : 0)) + ' %';
}

function fmtMs(x) {
  if (x === null || x === undefined) return DASH;
  if (x >= 1000) return (x / 1000).toFixed(2) + ' s';
  return (x >= 100 ? x.toFixed(0) : x >= 10 ? x.toFixed(1) : x.toFixed(2)) + ' ms';
}

function historySpan() {
  const secs = Math.round(state.points * state.intervalMs / 1000);
  return secs >= 120 ? Math.round(secs / 60) + ' minutes' : secs + ' seconds';
}

// ------------------------------------------------------------------------------ rendering helpers

/// Keeps one child of `parent` per item, in order: existing ones (by `data-key`) are
/// updated in place (so focus and open details stay), new ones made, old ones removed.
function keyed(parent, items, keyOf, make, update) {
  const existing = new Map();
  for (const child of parent.children) existing.set(child.dataset.key, child);
  let before = parent.firstElementChild;
  for (const item of items) {
    const k = keyOf(item);
    let node = existing.get(k);
    if (node) existing.delete(k);
    else { node = make(item); node.dataset.key = k; }
    if (update) update(node, item);
    if (node !== before) parent.insertBefore(node, before);
    before = node.nextElementSibling;
  }
  for (const node of existing.values()) node.remove();
}

/// A small line chart of `values` (newest last) over the history kept, `null` a gap.
function sparkline(values, label, format, cls) {
  const w = 120, h = 28, n = Math.max(state.points, 2);
  const svg = document.createElementNS(SVG_NS, 'svg');
  svg.setAttribute('viewBox', `0 0 ${w} ${h}`);
  svg.setAttribute('preserveAspectRatio', 'none');
  svg.setAttribute('class', 'spark');
  svg.setAttribute('role', 'img');
  const known = values.filter((v) => v !== null && v !== undefined);
  const max = Math.max(0, ...known);
  const last = known.length ? known[known.length - 1] : null;
  svg.setAttribute('aria-label', `${label} over the last ${historySpan()}: now ${format(last)}, highest ${format(known.length ? max : null)}`);
  const base = document.createElementNS(SVG_NS, 'line');
  for (const [a, v] of [['x1', 0], ['x2', w], ['y1', h - 1], ['y2', h - 1]]) base.setAttribute(a, v);
  svg.append(base);
  let run = [];
  const flush = () => {
    if (run.length) {
      const line = document.createElementNS(SVG_NS, 'polyline');
      line.setAttribute('points', (run.length === 1 ? [run[0], run[0]] : run).join(' '));
      if (cls) line.setAttribute('class', cls);
      svg.append(line);
    }
    run = [];
  };
  values.forEach((v, i) => {
    if (v === null || v === undefined) return flush();
    const x = w - (values.length - 1 - i) * (w / (n - 1));
    const y = max > 0 ? h - 2 - (v / max) * (h - 4) : h - 2;
    run.push(x.toFixed(1) + ',' + y.toFixed(1));
  });
  flush();
  return svg;
}

/// Sets the text of the cell of class `cls` in `row`.
function cell(row, cls, text) {
  const c = row.querySelector('.' + cls);
  if (c.textContent !== text) c.textContent = text;
}

const NUMERIC = new Set(['Requests', 'Req/s', '5xx', 'p50', 'p99', 'In flight']);
const ROUTE_HEADS = ['Route', 'Req/s', '5xx', 'p50', 'p99', 'Requests', 'Req/s trend', 'p99 trend', 'Goes to'];
const SERVER_HEADS = ['Server', 'State', 'In flight', 'Req/s', '5xx', 'p50', 'p99', 'Requests', 'Req/s trend', 'p99 trend', 'Action'];
let tables = 0;

/// A table of `heads` (in a box that scrolls sideways on narrow screens, and as one card
/// per row on phones) named by a heading whose `.name` and `.sub` parts are set later.
function tableBlock(heads) {
  const id = 'table-' + ++tables;
  const title = el('h3', { id, class: 'table-title' }, el('span', { class: 'name' }), el('span', { class: 'sub' }));
  const head = el('tr', {}, ...heads.map((h) => el('th', { scope: 'col', class: NUMERIC.has(h) ? 'num' : null, text: h })));
  const table = el('table', { class: 'cards', 'aria-labelledby': id }, el('thead', {}, head), el('tbody'));
  return el('div', { class: 'block' }, title, el('div', { class: 'scroll' }, table));
}

/// A body row: its header cell, then `cells`, each labelled with its column's head (the
/// phone layout shows the labels).
function tableRow(attrs, heads, header, cells) {
  cells.forEach((c, i) => c.setAttribute('data-label', heads[i + 1]));
  return el('tr', attrs, el('th', { scope: 'row' }, ...header), ...cells);
}

/// The cells of an object's traffic: rates now, total, two trends.
function trafficCells() {
  return [
    el('td', { class: 'num rps' }), el('td', { class: 'num err' }), el('td', { class: 'num p50' }),
    el('td', { class: 'num p99' }), el('td', { class: 'num requests' }),
    el('td', { class: 'trend-rps' }), el('td', { class: 'trend-p99' }),
  ];
}

function fillTraffic(row, obj, k, what) {
  const now = obj.now || {};
  cell(row, 'requests', fmtInt(obj.requests));
  cell(row, 'rps', fmtRate(now.rps));
  cell(row, 'err', fmtPct(now.error_rate));
  cell(row, 'p50', fmtMs(now.p50_ms));
  cell(row, 'p99', fmtMs(now.p99_ms));
  const s = state.series.get(k) || {};
  row.querySelector('.trend-rps').replaceChildren(sparkline(s.rps || [], 'Requests per second of ' + what, fmtRate));
  row.querySelector('.trend-p99').replaceChildren(sparkline(s.p99_ms || [], 'p99 latency of ' + what, fmtMs, 'latency'));
}

// ------------------------------------------------------------------------------ sections

function render(data) {
  keyed($('listeners-body'), data.listeners, (l) => l.name, () => tableBlock(ROUTE_HEADS), updateListener);
  keyed($('upstreams-body'), data.upstreams, (u) => u.name, () => tableBlock(SERVER_HEADS), updateUpstream);
  renderHttp2(data.listeners.filter((l) => l.http2));
}

function updateListener(block, l) {
  const kind = (l.kind === 'tcp' ? 'TCP' : 'HTTP') + (l.tls ? ' with TLS' : '');
  const conns = l.now ? ', ' + fmtRate(l.now.cps) + ' new/s' : '';
  cell(block, 'name', l.name);
  cell(block, 'sub', ` — ${kind} on ${l.addr || 'no address'} · ${fmtInt(l.open)} open connections${conns}`);
  const rows = [{ total: true, obj: l }, ...l.routes.map((r) => ({ obj: r }))];
  keyed(block.querySelector('tbody'), rows, (r) => (r.total ? '\u0000total' : 'r:' + r.obj.name), makeRouteRow, (row, r) => {
    const k = r.total ? key('l', l.name) : key('r', l.name, r.obj.name);
    const what = r.total ? 'listener ' + l.name : 'route ' + (r.obj.name || '(no route)') + ' of ' + l.name;
    fillTraffic(row, r.obj, k, what);
    cell(row, 'target', r.total ? '' : r.obj.target);
  });
}

function makeRouteRow(r) {
  const name = r.total ? 'All requests' : r.obj.name === null ? '(no route matched)' : r.obj.name;
  const route = r.total ? null : r.obj.name === null ? '' : r.obj.name;
  return tableRow({ class: r.total ? 'total' : 'sub-row', 'data-route': route }, ROUTE_HEADS, [name],
    [...trafficCells(), el('td', { class: 'target' })]);
}

function updateUpstream(block, u) {
  const now = u.now || {};
  cell(block, 'name', u.name);
  cell(block, 'sub', ` — ${u.lb} · ${fmtRate(now.rps)} req/s · ${fmtPct(now.error_rate)} 5xx · p99 ${fmtMs(now.p99_ms)}`);
  keyed(block.querySelector('tbody'), u.servers, (s) => s.addr, (s) => makeServerRow(u.name, s), (row, s) => {
    fillTraffic(row, s, key('s', u.name, s.addr), 'server ' + s.addr + ' of ' + u.name);
    const badge = row.querySelector('.state .badge');
    badge.className = 'badge st-' + s.state;
    badge.textContent = s.state;
    cell(row, 'inflight', fmtInt(s.in_flight));
    const extra = [s.backup ? 'backup' : null, s.weight !== 1 ? 'weight ' + s.weight : null].filter(Boolean).join(', ');
    cell(row, 'server-extra', extra ? ' (' + extra + ')' : '');
    row.dataset.drain = String(s.drain);
    const button = row.querySelector('button');
    const verb = s.drain ? 'Undrain' : 'Drain';
    if (button.textContent !== verb) button.textContent = verb;
    button.className = s.drain ? '' : 'danger';
    button.setAttribute('aria-label', `${verb} ${s.addr} of ${u.name}`);
  });
}

function makeServerRow(upstream, s) {
  const button = el('button', { type: 'button' });
  button.addEventListener('click', () => toggleDrain(button));
  const header = [el('span', { text: s.addr }), el('span', { class: 'server-extra' })];
  return tableRow({ 'data-upstream': upstream, 'data-server': s.addr }, SERVER_HEADS, header, [
    el('td', { class: 'state' }, el('span', { class: 'badge' })), el('td', { class: 'num inflight' }),
    ...trafficCells(), el('td', { class: 'action' }, button),
  ]);
}

const HTTP2_COLUMNS = [
  ['connections', 'Connections'], ['streams', 'Streams'], ['client_resets', 'Client resets'],
  ['calm_goaways', 'Calm GOAWAYs'], ['forced_resets', 'Forced resets'], ['glitches', 'Glitches'],
  ['stalled', 'Stalled'],
];
const HTTP2_HEADS = ['Listener', ...HTTP2_COLUMNS.map(([, label]) => label)];

function renderHttp2(listeners) {
  const body = $('http2-body');
  if (!body.firstChild) {
    const block = tableBlock(HTTP2_HEADS);
    block.querySelector('.name').textContent = 'HTTP/2 client connections, and what Weir did about misbehaving ones';
    body.append(block);
  }
  keyed(body.querySelector('tbody'), listeners, (l) => l.name, (l) => tableRow({ 'data-listener': l.name }, HTTP2_HEADS, [l.name],
    HTTP2_COLUMNS.map(([name]) => el('td', { class: 'num h2-' + name }))), (row, l) => {
    const before = state.http2Before.get(l.name) || {};
    for (const [name] of HTTP2_COLUMNS) {
      const v = l.http2[name];
      const rise = before[name] !== undefined && v > before[name] ? v - before[name] : 0;
      const c = row.querySelector('.h2-' + name);
      c.textContent = fmtInt(v) + (rise ? ' (+' + fmtInt(rise) + ')' : '');
      c.classList.toggle('rise', rise > 0);
    }
    state.http2Before.set(l.name, Object.assign({}, l.http2));
  });
}

async function loadCerts() {
  state.certsAt = Date.now();
  try {
    const { body } = await api('/certs');
    renderCerts(body.data);
  } catch (e) {
    if (!(e instanceof Unauthorized)) $('certs-body').replaceChildren(el('p', { class: 'error', text: 'Certificates: ' + e.message }));
  }
}

const CERT_HEADS = ['Listener', 'Names', 'Source', 'Issuer', 'Expires (UTC)', 'Days left', 'Renewal'];

function renderCerts(certs) {
  const body = $('certs-body');
  if (!certs.length) return body.replaceChildren(el('p', { class: 'hint', text: 'No listener terminates TLS.' }));
  const block = tableBlock(CERT_HEADS);
  block.querySelector('.name').textContent = 'Certificates in use';
  block.querySelector('tbody').append(...certs.map((c) => tableRow({}, CERT_HEADS, [c.listener], [
    el('td', { text: (c.names || []).join(', ') }), el('td', { text: c.source + (c.default ? ' (default)' : '') }),
    el('td', { text: c.issuer || DASH }), el('td', { text: c.not_after || DASH }),
    el('td', { class: 'num' }, daysLeft(c)), el('td', { text: renewal(c) }),
  ])));
  body.replaceChildren(block);
}

/// Days left, marked when it needs a person: a file certificate within 14 days of its
/// end, an automatic one whose renewal is failing, any that expired.
function daysLeft(c) {
  const days = c.days_left;
  if (days === null) return el('span', { text: 'not issued yet' });
  if (days < 0) return el('span', { class: 'badge st-expired', text: 'expired' });
  const soon = c.source === 'file' ? days < 14 : !!c.last_error;
  return el('span', { class: soon ? 'badge st-soon' : null, text: String(days) });
}

function renewal(c) {
  if (c.source === 'file') return 'from ' + c.file;
  const parts = [];
  if (c.renew_at) parts.push('renews at ' + c.renew_at);
  if (c.retry_at) parts.push('next try at ' + c.retry_at);
  if (c.last_error) parts.push('last error: ' + c.last_error);
  return parts.length ? parts.join('; ') : 'waiting for the first certificate';
}

async function loadHistory() {
  try {
    const { body } = await api('/history');
    const versions = body.data.slice().reverse();
    keyed($('history-body'), versions, (v) => String(v.version), makeVersion);
  } catch (e) {
    if (!(e instanceof Unauthorized)) $('history-body').replaceChildren(el('p', { class: 'error', text: 'History: ' + e.message }));
  }
}

const DIFF_HEADS = ['Key', 'Before', 'After'];

function makeVersion(v) {
  const what = v.version === 1 ? 'the config Weir started with' : (v.changes.length ? v.changes.join('; ') : 'no change in effect');
  const summary = el('summary', { text: `Version ${v.version} · ${v.at_utc} · ${v.by} · ${what}` });
  const diff = el('div', { class: 'diff' });
  if (v.fields.length) {
    const block = tableBlock(DIFF_HEADS);
    block.querySelector('.name').textContent = `Keys changed in version ${v.version}`;
    const shown = (x) => (x === null ? '(unset)' : x);
    block.querySelector('tbody').append(...v.fields.map((f) => tableRow({}, DIFF_HEADS, [el('code', { text: f.path })], [
      el('td', { class: 'old', text: shown(f.old) }), el('td', { class: 'new', text: shown(f.new) }),
    ])));
    diff.append(block);
    if (v.fields_omitted) diff.append(el('p', { class: 'hint', text: `and ${v.fields_omitted} more keys` }));
  } else {
    diff.append(el('p', { class: 'hint', text: v.version === 1 ? 'Nothing before it in this process.' : 'No key was edited (the file was applied as it was).' }));
  }
  return el('details', { 'data-version': v.version }, summary, diff);
}

// ------------------------------------------------------------------------------ actions

function say(text) { $('message').textContent = text; }

async function toggleDrain(button) {
  const row = button.closest('tr');
  const upstream = row.dataset.upstream;
  const addr = row.dataset.server;
  const drain = row.dataset.drain !== 'true';
  const headers = { 'Content-Type': 'application/json' };
  if (state.version) headers['If-Match'] = '"' + state.version + '"';
  button.disabled = true;
  try {
    const path = '/upstreams/' + encodeURIComponent(upstream) + '/servers/' + encodeURIComponent(addr);
    const { body } = await api(path, { method: 'PATCH', headers, body: JSON.stringify({ drain }) });
    say(`${addr} of ${upstream} ${drain ? 'is draining: it gets no new requests' : 'takes new requests again'} (config version ${body.version}).`);
  } catch (e) {
    if (e instanceof Unauthorized) return signedOut('The token was not accepted.');
    if (e.status === 409) say('The config changed since this page read it. The page now shows the running config: check the server and try again.');
    else say(`Could not ${drain ? 'drain' : 'undrain'} ${addr} of ${upstream}: ${e.message}`);
  } finally {
    button.disabled = false;
  }
  await state.inflight;
  await poll(true);
}

function showDashboard() {
  if ($('dashboard').hidden) {
    $('login').hidden = true;
    $('dashboard').hidden = false;
  }
  $('pause').hidden = false;
  $('signout').hidden = !state.token;
}

/// Shows the sign-in form (with `error`), forgetting the token and everything shown.
function signedOut(error) {
  clearTimeout(state.timer);
  state.token = null;
  sessionStorage.removeItem(TOKEN_KEY);
  Object.assign(state, { seq: 0, version: null, certsAt: 0 });
  state.series.clear();
  state.http2Before.clear();
  for (const id of ['listeners-body', 'upstreams-body', 'http2-body', 'certs-body', 'history-body', 'message']) $(id).replaceChildren();
  $('dashboard').hidden = true;
  $('pause').hidden = true;
  $('signout').hidden = true;
  $('login').hidden = false;
  $('login-error').textContent = error || '';
  $('status').textContent = 'Sign in to see the dashboard.';
  $('token').focus();
}

function signIn(event) {
  event.preventDefault();
  const input = $('token');
  const token = input.value.trim();
  if (!token) {
    $('login-error').textContent = 'Enter the token.';
    return input.focus();
  }
  input.value = '';
  state.token = token;
  sessionStorage.setItem(TOKEN_KEY, token);
  $('login-error').textContent = '';
  $('status').textContent = 'Signing in…';
  poll().then(() => { if (!$('dashboard').hidden) $('main').focus(); });
}

function togglePause() {
  state.paused = !state.paused;
  const button = $('pause');
  button.setAttribute('aria-pressed', String(state.paused));
  button.textContent = state.paused ? 'Resume updates' : 'Pause updates';
  if (state.paused) {
    clearTimeout(state.timer);
    $('status').textContent = 'Paused: the numbers shown are not updated.';
  } else {
    poll();
  }
}

$('login-form').addEventListener('submit', signIn);
$('signout').addEventListener('click', () => signedOut(''));
$('pause').addEventListener('click', togglePause);
document.addEventListener('visibilitychange', () => { if (!document.hidden) poll(); });
poll();

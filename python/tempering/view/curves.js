// The curves: the key charts first, the single-point metrics as a summary table, then every
// other metric in its group (collapsed; a group's charts are drawn when it is opened).
// One trace per run and metric (smoothed by an EMA, the raw points faint behind it).
const PENDING = [];  // Plotly draws in flight (init awaits them before marking curves-drawn)
const LOGY = {};     // metric -> the user's choice of a log y axis (else: automatic)
const OPEN = {};     // group -> opened by the user
const SMOOTH_MIN_POINTS = 20;  // shorter series (evaluations) are drawn as they are
const SMOOTH_POINTS = 500;     // the most points of a smoothed trace

function chartId(name) { return 'chart-' + name.replace(/[^A-Za-z0-9_-]/g, '_'); }

function seriesOf(m, name) {
  if (m.curves && m.curves[name]) return m.curves[name];
  for (const g of Object.values(m.groups || {})) if (g[name]) return g[name];
  return null;
}

function keyNames() {
  const out = [];
  for (const m of S.metrics) for (const n of m.key || []) if (!out.includes(n)) out.push(n);
  return out;
}

// TensorBoard's smoothing: an exponential moving average, debiased at the start.
function ema(y, weight) {
  let last = 0, norm = 0;
  return y.map(v => {
    if (v === null || !isFinite(v)) return null;
    last = weight * last + (1 - weight) * v; norm = weight * norm + (1 - weight);
    return last / norm;
  });
}

// Step -> wall seconds, linearly between the run's clock points.
function toTime(clock, xs) {
  const cx = clock.x, ct = clock.t;
  if (!cx.length) return xs.map(() => null);
  let j = 0;
  return xs.map(x => {
    while (j + 1 < cx.length && cx[j + 1] <= x) j++;
    if (x <= cx[0]) return ct[0];
    if (j + 1 >= cx.length) return ct[cx.length - 1];
    const f = (x - cx[j]) / (cx[j + 1] - cx[j]);
    return ct[j] + f * (ct[j + 1] - ct[j]);
  });
}

const LOG_NAMES = /(^|\/)(loss|nll|grad_norm|perplexity)/;  // metrics that may span decades

function autoLog(name) {
  if (name in LOGY) return LOGY[name];
  if (!LOG_NAMES.test(name)) return false;
  let lo = Infinity, hi = -Infinity;
  for (const m of S.metrics) {
    const s = seriesOf(m, name);
    if (!s) continue;
    for (const v of s.y) if (v !== null) { if (v <= 0) return false; lo = Math.min(lo, v); hi = Math.max(hi, v); }
  }
  return hi / lo > 100;  // positive and spanning more than two decades: loss, grad norm
}

function traces(name, byTime, weight) {
  const out = [];
  S.metrics.forEach((m, i) => {
    const s = seriesOf(m, name);
    if (!s) return;
    const x = byTime ? toTime(m.clock, s.x) : s.x, color = runColor(i), run = S.runs[i].name;
    if (s.lo && s.hi) {
      out.push({x, y: s.lo, mode: 'lines', line: {width: 0, color}, hoverinfo: 'skip', showlegend: false, meta: 'band'});
      out.push({x, y: s.hi, mode: 'lines', line: {width: 0, color}, fill: 'tonexty', fillcolor: color + '22',
        name: run + ' 95% interval', hoverinfo: 'skip', showlegend: false, meta: 'band'});
    }
    const smooth = weight > 0 && s.x.length >= SMOOTH_MIN_POINTS;
    const few = s.x.length <= 100;
    out.push({x, y: s.y, name: smooth ? run + ' (raw)' : run, mode: few ? 'lines+markers' : 'lines',
      line: {color, width: 1}, marker: {size: 5}, opacity: smooth ? 0.25 : 1, showlegend: false, meta: smooth ? 'raw' : 'series'});
    if (smooth) {
      // The average is smooth: every k-th point of it (at most ~SMOOTH_POINTS) draws the same line.
      const y = ema(s.y, weight), k = Math.ceil(x.length / SMOOTH_POINTS);
      const keep = (_, i) => i % k === 0 || i === x.length - 1;
      out.push({x: x.filter(keep), y: y.filter(keep), name: run, mode: 'lines', line: {color, width: 2}, showlegend: false, meta: 'series'});
    }
  });
  return out;
}

// The stages a chart's data spans: a dotted line where each begins, its name at the bottom.
function stageMarks(byTime, lo, hi) {
  const shapes = [], annotations = [];
  S.metrics.forEach((m, i) => (m.stages || []).forEach(st => {
    if (st.end < lo || st.start > hi) return;
    const at = Math.max(st.start - 0.5, lo), x = byTime ? toTime(m.clock, [at])[0] : at;
    if (st.start > lo) shapes.push({type: 'line', xref: 'x', yref: 'paper', x0: x, x1: x, y0: 0, y1: 1, line: {color: runColor(i), width: 1, dash: 'dot'}});
    annotations.push({x, y: 0, xref: 'x', yref: 'paper', text: esc(st.name), showarrow: false, xanchor: 'left', yanchor: 'bottom', font: {size: 11, color: '#666'}});
  }));
  return {shapes, annotations};
}

function extent(name) {
  let lo = Infinity, hi = -Infinity;
  for (const m of S.metrics) { const s = seriesOf(m, name); if (s && s.x.length) { lo = Math.min(lo, s.x[0]); hi = Math.max(hi, s.x[s.x.length - 1]); } }
  return [lo, hi];
}

// A constant series (a fixed learning rate) gets 0 to twice its value, not plotly's value ± 1.
function constantRange(name, logy) {
  const ys = new Set();
  for (const m of S.metrics) { const s = seriesOf(m, name); if (s) for (const v of s.y) if (v !== null) ys.add(v); }
  if (logy || ys.size !== 1) return {};
  const [v] = ys;
  return v === 0 ? {} : {range: v > 0 ? [0, 2 * v] : [2 * v, 0]};
}

function card(parent, name) {
  const id = chartId(name);
  let div = byId(id);
  if (!div) {
    div = document.createElement('div'); div.id = id; div.className = 'card';
    div.innerHTML = `<div class=chead><span class=ctitle title="${esc(name)}">${esc(name)}</span><label><input type=checkbox> log y</label></div><div class=plot></div>`;
    div.querySelector('input').onchange = e => { LOGY[name] = e.target.checked; drawChart(div, name); };
    parent.appendChild(div);
  }
  return div;
}

function drawChart(div, name) {
  const byTime = byId('xaxis').value === 'time', weight = +byId('smooth').value, logy = autoLog(name);
  div.querySelector('input').checked = logy;
  const layout = {margin: {l: 55, r: 12, t: 8, b: 36}, showlegend: false, hovermode: 'x',
    xaxis: {title: {text: byTime ? 'wall time (s)' : 'step', font: {size: 11}}}, yaxis: {type: logy ? 'log' : 'linear', ...constantRange(name, logy)},
    ...stageMarks(byTime, ...extent(name))};
  PENDING.push(Plotly.react(div.querySelector('.plot'), traces(name, byTime, weight), layout,
    {displaylogo: false, responsive: true, modeBarButtonsToRemove: ['lasso2d', 'select2d']}));
}

function drawSummary(skip) {
  const rows = new Map();
  S.metrics.forEach((m, i) => {
    for (const [k, v] of Object.entries(S.runs[i].figures || {})) (rows.get(k) || rows.set(k, {}).get(k))[i] = {y: v, x: 'final'};
    for (const [k, v] of Object.entries(m.scalars || {})) if (!skip.has(k)) (rows.get(k) || rows.set(k, {}).get(k))[i] = v;
  });
  if (!rows.size) { byId('summary').innerHTML = '<p>no single-point metrics</p>'; return; }
  const head = '<tr><th>metric</th>' + S.runs.map(r => `<th>${esc(r.name)}</th>`).join('') + '</tr>';
  const body = [...rows.keys()].sort().map(k => `<tr><td>${esc(k)}</td>` + S.runs.map((_, i) => {
    const c = rows.get(k)[i];
    return c ? `<td class=num title="step ${esc(c.x)}">${fmt(c.y)}</td>` : '<td></td>';
  }).join('') + '</tr>').join('');
  byId('summary').innerHTML = `<table id=summary-table>${head}${body}</table>`;
}

let GROUPS = {};  // group -> its metrics (not key ones), as last read

function drawGroups(skip) {
  const groups = GROUPS = {};
  S.metrics.forEach(m => { for (const [g, ms] of Object.entries(m.groups || {}))
    for (const n of Object.keys(ms)) if (!skip.has(n)) (groups[g] ??= new Set()).add(n); });
  const root = byId('groups');
  for (const g of Object.keys(groups).sort()) {
    let sec = byId('group-' + g);
    if (!sec) {
      sec = document.createElement('details'); sec.id = 'group-' + g; sec.className = 'group';
      sec.innerHTML = `<summary></summary><div class=grid></div>`;
      sec.ontoggle = () => { OPEN[g] = sec.open; if (sec.open && !sec.dataset.drawn) drawGroupCharts(sec, GROUPS[g]); };
      root.appendChild(sec);
      sec.open = OPEN[g] ?? OPEN.all ?? false;  // #open=all or #open=env,optim opens groups at load
    }
    sec.querySelector('summary').textContent = `${g} (${groups[g].size})`;
    if (sec.open) drawGroupCharts(sec, groups[g]);
  }
}

function drawGroupCharts(sec, names) {
  sec.dataset.drawn = '1';
  const grid = sec.querySelector('.grid');
  for (const n of [...names].sort()) drawChart(card(grid, n), n);
}

function drawCurves() {
  const key = keyNames(), keySet = new Set(key);
  if (key.length) byId('key').querySelectorAll(':scope > p').forEach(p => p.remove());
  for (const n of key) drawChart(card(byId('key'), n), n);
  if (!key.length) byId('key').innerHTML = '<p>no reward, accuracy, evaluation, KL, loss or learning-rate curve yet (every metric is under All metrics)</p>';
  drawSummary(keySet);
  drawGroups(keySet);
}

// tempering view: the page's core (data access, shared state, start-up, live polling).
// curves.js draws the charts and the summary, rollouts.js the rollouts, compare.js the
// evaluation comparison; page.py inlines the four files in that order.
const STATIC = (typeof DATA !== 'undefined') && DATA !== null;
const PALETTE = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd', '#ff7f0e', '#17becf', '#8c564b', '#e377c2'];
const S = {runs: [], metrics: [], steps: []};  // what the page last read of each run

function esc(s) { return String(s ?? '').replace(/[&<>"]/g, c => ({'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;'}[c])); }
function runColor(i) { return PALETTE[i % PALETTE.length]; }
function fmt(v) {
  if (v === null || v === undefined) return 'n/a';
  if (typeof v !== 'number') return String(v);
  if (Number.isInteger(v)) return String(v);
  const a = Math.abs(v);
  return a !== 0 && (a < 1e-3 || a >= 1e5) ? v.toExponential(3) : v.toPrecision(4);
}
function byId(id) { return document.getElementById(id); }

// A static page answers from the embedded DATA as the server would.
function staticRollouts(params) {
  const page = DATA.rollouts[`${params.run}:${params.stage}:${params.step}`] || {groups: [], total: 0, notes: []};
  const keep = e => (!params.tag || e.tags.includes(params.tag)) && (!params.end_reason || e.end_reason === params.end_reason);
  const every = page.groups.flatMap(g => g.members);
  const groups = page.groups.map(g => ({...g, members: g.members.filter(keep)})).filter(g => g.members.length);
  const mean = g => g.members.reduce((a, e) => a + (e.total_reward ?? 0), 0) / g.members.length;
  if (params.sort === 'worst') groups.sort((a, b) => mean(a) - mean(b));
  else if (params.sort === 'order') groups.sort((a, b) => a.group - b.group);
  else groups.sort((a, b) => mean(b) - mean(a));
  const shown = groups.find(g => String(g.group) === String(params.group)) || groups[0];
  const notes = [...(page.notes || [])];
  if (page.total > every.length) notes.push(`this static page holds ${every.length} of the step's ${page.total} episodes (the best groups); tempering view RUN_DIR serves them all`);
  return {
    total: groups.reduce((a, g) => a + g.members.length, 0), notes,
    tags: [...new Set(every.flatMap(e => e.tags))].sort(),
    end_reasons: [...new Set(every.map(e => String(e.end_reason)))].sort(),
    groups: groups.map(g => ({group: g.group, size: g.members.length, mean_reward: mean(g), prompt: g.prompt, tags: g.tags})),
    group: shown ? shown.group : null, episodes: shown ? shown.members : [],
  };
}

async function api(path, params) {
  if (STATIC) {
    if (path === 'runs') return DATA.runs;
    if (path === 'metrics') return DATA.metrics[params.run];
    if (path === 'steps') return DATA.steps[params.run];
    if (path === 'compare') return DATA.compare[params.run];
    return staticRollouts(params);
  }
  const q = new URLSearchParams(params).toString();
  const r = await fetch('/api/' + path + '?' + q);
  return r.json();
}

function drawLegend() {
  byId('legend').innerHTML = S.runs.map((r, i) => `<span class=run-name><span class=swatch style="background:${runColor(i)}"></span>${esc(r.name)}`
    + (r.stages.length ? ` <small>(${r.stages.map(esc).join(' → ')})</small>` : '') + '</span>').join('');
  byId('status').textContent = S.metrics.map((m, i) => `${S.runs[i].name}: ${m.steps} steps`).join(' | ');
}

function drawConfig() {
  byId('config').innerHTML = S.runs.flatMap(r => [r, ...(r.stage_runs || [])]).map(r => `<h3>${esc(r.name)}</h3><p class=notes>${esc(r.notes.join('; '))}</p>`
    + `<details><summary>config.json</summary><pre>${esc(JSON.stringify(r.config, null, 2))}</pre></details>`
    + '<table><tr><th>checkpoint</th><th>step</th><th>state</th><th>sampler</th></tr>'
    + r.checkpoints.map(c => `<tr><td>${esc(c.name)}</td><td>${c.step}</td><td>${esc(c.state_path)}</td><td>${esc(c.sampler_path)}</td></tr>`).join('')
    + '</table>').join('');
}

async function readMetrics() {
  S.metrics = await Promise.all(S.runs.map((_, i) => api('metrics', {run: i})));
}

async function init() {
  S.runs = await api('runs', {});
  drawConfig();
  const want = new URLSearchParams(location.hash.slice(1));
  for (const g of (want.get('open') || '').split(',')) if (g) OPEN[g] = true;
  // The rollouts' data is fetched while the curves are drawn, and shown after them.
  const rolloutsReady = prepareRollouts(want);
  await readMetrics();
  drawLegend();
  drawCurves();
  await Promise.all(PENDING.splice(0));
  performance.mark('curves-drawn');  // timed by tests/benchmarks/test_bench_view_browser.py
  await rolloutsReady;
  await showRollouts();
  performance.mark('rollouts-shown');
  await initCompare();
  performance.mark('page-ready');  // the layout tests (tests/view/test_browser.py) read the page after it
  byId('smooth').oninput = () => { byId('smoothv').textContent = (+byId('smooth').value).toFixed(2); drawCurves(); };
  byId('xaxis').onchange = () => drawCurves();
  if (!STATIC) setInterval(async () => { await readMetrics(); drawLegend(); drawCurves(); await refreshSteps(); }, 3000);
}
window.addEventListener('load', init);

const STATIC = (typeof DATA !== 'undefined') && DATA !== null;
async function api(path, params) {
  if (STATIC) {
    if (path === 'runs') return DATA.runs;
    if (path === 'metrics') return DATA.metrics[params.run];
    if (path === 'steps') return DATA.steps[params.run];
    const page = DATA.rollouts[params.run + ':' + params.step] || {episodes: [], total: 0, notes: []};
    const eps = (page.episodes || []).filter(e => (!params.tag || e.tags.includes(params.tag))
      && (!params.end_reason || e.end_reason === params.end_reason));
    return {...page, episodes: eps, total: eps.length};
  }
  const q = new URLSearchParams(params).toString();
  const r = await fetch('/api/' + path + '?' + q);
  return r.json();
}
let RUNS = [], hidden = {}, logy = {};
function esc(s) { return String(s ?? '').replace(/[&<>]/g, c => ({'&':'&amp;','<':'&lt;','>':'&gt;'}[c])); }
function color(adv) {
  const a = Math.max(-1, Math.min(1, adv || 0));
  return a >= 0 ? `rgba(0,160,0,${0.15 + 0.5*a})` : `rgba(200,0,0,${0.15 - 0.5*a})`;
}
async function drawCurves() {
  const all = await Promise.all(RUNS.map((_, i) => api('metrics', {run: i})));
  const groups = {};
  all.forEach((m, i) => { for (const [g, ms] of Object.entries(m.groups || {}))
    for (const [name, s] of Object.entries(ms)) ((groups[g] ??= {})[name] ??= []).push({run: i, s}); });
  const root = document.getElementById('curves'), drawn = [];
  for (const g of Object.keys(groups).sort()) {
    let sec = document.getElementById('group-' + g);
    if (!sec) {
      sec = document.createElement('div'); sec.id = 'group-' + g;
      sec.innerHTML = `<h3><label><input type=checkbox checked> ${esc(g)}</label></h3><div class=charts></div>`;
      sec.querySelector('input').onchange = e => { sec.querySelector('.charts').style.display = e.target.checked ? '' : 'none'; };
      root.appendChild(sec);
    }
    for (const name of Object.keys(groups[g]).sort()) {
      const id = 'chart-' + name.replace(/[^A-Za-z0-9_-]/g, '_');
      let div = document.getElementById(id);
      if (!div) { div = document.createElement('div'); div.id = id; div.className = 'chart'; sec.querySelector('.charts').appendChild(div); }
      const traces = groups[g][name].map(({run, s}) => ({x: s.x, y: s.y, name: RUNS[run].name, mode: s.x.length > 100 ? 'lines' : s.x.length > 1 ? 'lines+markers' : 'markers', type: 'scatter'}));
      const layout = {title: {text: name, font: {size: 13}}, margin: {l: 50, r: 10, t: 30, b: 30}, showlegend: RUNS.length > 1,
        yaxis: {type: logy[name] ? 'log' : 'linear'}, xaxis: {title: {text: 'step'}}};
      drawn.push(Plotly.react(div, traces, layout, {displaylogo: false, modeBarButtonsToAdd: [{name: 'log y', icon: Plotly.Icons.zoombox,
        click: () => { logy[name] = !logy[name]; drawCurves(); }}]}));
    }
  }
  await Promise.all(drawn);
  document.getElementById('status').textContent = all.map((m, i) => `${RUNS[i].name}: ${m.steps} steps`).join(' | ');
}
async function loadSteps() {
  const sel = document.getElementById('step'), run = +document.getElementById('run').value;
  const steps = await api('steps', {run});
  const cur = sel.value;
  sel.innerHTML = steps.map(s => `<option>${s}</option>`).join('');
  if (cur !== '' && steps.includes(+cur)) sel.value = cur; else if (steps.length) sel.value = steps[steps.length - 1];
  if (!steps.length) document.getElementById('episodes').innerHTML = '<p>no trajectory log in this run</p>';
  return steps;
}
let offset = 0;
function fillSelect(id, values, current) {
  const sel = document.getElementById(id);
  sel.innerHTML = '<option value="">all</option>' + values.map(v => `<option>${esc(v)}</option>`).join('');
  sel.value = values.includes(current) ? current : '';
}
async function loadRollouts(more) {
  const run = +document.getElementById('run').value, step = document.getElementById('step').value;
  if (step === '') return;
  if (!more) offset = 0;
  const sort = document.getElementById('sort').value, minr = parseFloat(document.getElementById('minr').value);
  const tag = document.getElementById('tag').value, end_reason = document.getElementById('end').value;
  const page = await api('rollouts', {run, step, offset, limit: 20, sort, tag, end_reason});
  fillSelect('tag', page.tags || [], tag);
  fillSelect('end', page.end_reasons || [], end_reason);
  const tbody = document.getElementById('episodes');
  if (!more) tbody.innerHTML = '';
  document.getElementById('rnotes').textContent = (page.notes || []).join('; ');
  for (const ep of page.episodes || []) {
    if (!isNaN(minr) && (ep.total_reward ?? 0) < minr) continue;
    const turns = ep.turns.map(t => {
      const toks = t.ac_tokens.map((tok, k) => `<span class=tok style="background:${color(ep.advantage)}" title="token ${tok}, logprob ${t.ac_logprobs ? t.ac_logprobs[k].toFixed(3) : 'n/a'}">${t.ac_pieces ? esc(t.ac_pieces[k]) : tok}</span>`).join(' ');
      const act = t.action != null ? `<pre style="background:${color(ep.advantage)}">${esc(t.action)}</pre>` : '';
      return `<div><b>turn ${t.turn}</b> reward ${t.reward}<pre>${esc(t.observation)}</pre>${act}<details><summary>tokens</summary>${toks}</details></div>`;
    }).join('');
    tbody.insertAdjacentHTML('beforeend', `<tr><td>${esc(ep.episode_id)}${ep.note ? '<br>' + esc(ep.note) : ''}</td><td>${ep.total_reward}</td><td>${(ep.advantage ?? 0).toFixed(3)}</td><td>${esc((ep.tags || []).join(','))}</td><td>${esc(ep.end_reason)}</td><td>${turns}</td></tr>`);
  }
  offset += (page.episodes || []).length;
  document.getElementById('more').style.display = offset < page.total ? '' : 'none';
}
async function init() {
  RUNS = await api('runs', {});
  document.getElementById('run').innerHTML = RUNS.map((r, i) => `<option value=${i}>${esc(r.name)}</option>`).join('');
  document.getElementById('config').innerHTML = RUNS.map(r => `<h3>${esc(r.name)}</h3><p class=notes>${esc(r.notes.join('; '))}</p>`
    + `<details><summary>config.json</summary><pre>${esc(JSON.stringify(r.config, null, 2))}</pre></details>`
    + `<table><tr><th>checkpoint</th><th>step</th><th>state</th><th>sampler</th></tr>` + r.checkpoints.map(c => `<tr><td>${esc(c.name)}</td><td>${c.step}</td><td>${esc(c.state_path)}</td><td>${esc(c.sampler_path)}</td></tr>`).join('') + '</table>').join('');
  await drawCurves();
  performance.mark('curves-drawn');  // timed by tests/benchmarks/test_bench_view_browser.py
  // #run=NAME&step=S (a link to a run's step) picks the rollouts shown first; otherwise the
  // last step of the first run that logged any.
  const want = new URLSearchParams(location.hash.slice(1));
  const named = RUNS.findIndex(r => r.name === want.get('run'));
  if (named >= 0) document.getElementById('run').value = named;
  else for (let i = 0; i < RUNS.length; i++)
    if ((await api('steps', {run: i})).length) { document.getElementById('run').value = i; break; }
  const steps = await loadSteps();
  if (want.has('step') && steps.includes(+want.get('step'))) document.getElementById('step').value = want.get('step');
  if (steps.length) await loadRollouts(false);
  performance.mark('rollouts-shown');
  if (!STATIC) setInterval(async () => { await drawCurves(); await loadSteps(); }, 3000);
}
window.addEventListener('load', init);

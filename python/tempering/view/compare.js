// The evaluation comparison: the same held-out items at two evaluations (by default the run's
// first and last), side by side; items whose mean reward rose are green, fell red, first.
function evalOptions(run) {
  return (S.steps[run] || []).filter(s => s.kinds.includes('eval'));
}

async function initCompare() {
  const run = +byId('run').value, evals = evalOptions(run);
  const opts = evals.map(s => `<option value="${esc(s.stage)}:${s.step}">${esc(stepLabel(s))}</option>`).join('');
  byId('before').innerHTML = opts; byId('after').innerHTML = opts;
  if (evals.length) { byId('before').selectedIndex = 0; byId('after').selectedIndex = evals.length - 1; }
  byId('before').disabled = byId('after').disabled = STATIC;  // a static page holds the default pair only
  byId('before').onchange = byId('after').onchange = () => loadCompare();
  await loadCompare(true);
}

async function loadCompare(first) {
  const run = +byId('run').value;
  let cmp;
  if (first || STATIC) cmp = await api('compare', {run});
  else {
    const [bs, b] = byId('before').value.split(/:(?=[^:]*$)/), [as, a] = byId('after').value.split(/:(?=[^:]*$)/);
    cmp = await api('compare', {run, before_stage: bs, before: b, after_stage: as, after: a});
  }
  drawCompare(cmp);
}

function answers(list) {
  return list.map(a => `<span class="ans ${a.reward > 0 ? 'ok' : 'bad'}" title="reward ${fmt(a.reward)}">${esc(a.text) || '&nbsp;'}</span>`).join('');
}

function drawCompare(cmp) {
  const root = byId('compare');
  if (!cmp || cmp.error) {
    root.innerHTML = `<p>${cmp && cmp.error ? esc(cmp.error) : 'fewer than two evaluations with kept answers in this run (tempering demo writes them)'}</p>`;
    return;
  }
  const where = s => s.stage ? `${s.stage} step ${s.step}` : `step ${s.step}`;
  const head = `<p>${cmp.items.length} held-out items at both ${esc(where(cmp.before))} and ${esc(where(cmp.after))}: `
    + `mean reward ${fmt(cmp.before_mean)} → ${fmt(cmp.after_mean)}; <b>${cmp.fixed} fixed</b>, <b>${cmp.broken} broken</b>`
    + (cmp.only_before || cmp.only_after ? ` (${cmp.only_before} only before, ${cmp.only_after} only after)` : '') + '</p>';
  const rows = cmp.items.map(it => `<tr class=${it.change}><td><pre>${esc(it.prompt)}</pre>${it.note ? `<small>${esc(it.note)}</small>` : ''}`
    + `<br><small>${it.change}</small></td><td>${answers(it.before)}<small>mean ${fmt(it.before_mean)}</small></td>`
    + `<td>${answers(it.after)}<small>mean ${fmt(it.after_mean)}</small></td></tr>`).join('');
  root.innerHTML = head + `<table class=cmp id=compare-table><tr><th>item</th><th>before: ${esc(where(cmp.before))}</th><th>after: ${esc(where(cmp.after))}</th></tr>${rows}</table>`;
}

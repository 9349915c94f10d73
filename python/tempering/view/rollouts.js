// The rollouts: one group at a time (its prompt once, its members below, each action's tokens
// shaded by the episode's advantage, the sampler's logprob on hover), picked from the list of
// the step's groups (best, worst or in order; by tag and end reason).
let ROLL = null;  // the last rollouts answer

function color(adv) {
  const a = Math.max(-1, Math.min(1, adv || 0));
  return a >= 0 ? `rgba(0,160,0,${0.12 + 0.45 * a})` : `rgba(200,0,0,${0.12 - 0.45 * a})`;
}

function stepLabel(s) {
  const where = s.stage ? `${s.stage} step ${s.step} (global ${s.global})` : `step ${s.step}`;
  return `${where} · ${s.kinds.join('+')}`;
}

async function fillSteps(keep) {
  const run = +byId('run').value, sel = byId('step');
  const steps = await api('steps', {run});
  S.steps[run] = steps;
  const cur = keep ?? sel.value;
  sel.innerHTML = steps.map(s => `<option value="${esc(s.stage)}:${s.step}">${esc(stepLabel(s))}</option>`).join('');
  const values = steps.map(s => `${s.stage}:${s.step}`);
  if (cur && values.includes(cur)) sel.value = cur; else if (steps.length) sel.value = values[values.length - 1];
  return steps;
}

function rolloutParams(group) {
  const [stage, step] = byId('step').value.split(/:(?=[^:]*$)/);
  const params = {run: +byId('run').value, stage, step, sort: byId('sort').value, tag: byId('tag').value, end_reason: byId('end').value};
  if (group !== undefined && group !== null) params.group = group;
  return params;
}

async function fetchRollouts(group) {
  if (!byId('step').value) { ROLL = null; return; }
  ROLL = await api('rollouts', rolloutParams(group));
}

async function prepareRollouts(want) {
  byId('run').innerHTML = S.runs.map((r, i) => `<option value=${i}>${esc(r.name)}</option>`).join('');
  const named = S.runs.findIndex(r => r.name === want.get('run'));
  let keep = want.has('step') ? `${want.get('stage') || ''}:${want.get('step')}` : null;
  if (named >= 0) byId('run').value = named;
  else for (let i = 0; i < S.runs.length; i++) {
    byId('run').value = i;
    if ((await fillSteps(null)).length) break;
  }
  await fillSteps(keep);
  for (const id of ['step', 'sort', 'tag', 'end']) byId(id).onchange = () => loadRollouts();
  byId('run').onchange = async () => { await fillSteps(null); await loadRollouts(); await initCompare(); };
  byId('minr').onchange = () => showRollouts();
  await fetchRollouts();
}

async function refreshSteps() { await fillSteps(byId('step').value); }

async function loadRollouts(group) { await fetchRollouts(group); await showRollouts(); }

function fillSelect(id, values, current) {
  const sel = byId(id);
  sel.innerHTML = '<option value="">all</option>' + values.map(v => `<option>${esc(v)}</option>`).join('');
  sel.value = values.includes(current) ? current : '';
}

function tokens(turn, adv) {
  const bg = color(adv), lp = turn.ac_logprobs;
  if (turn.ac_pieces && turn.ac_pieces.length === turn.ac_tokens.length) {
    const toks = '<div class=resp>' + turn.ac_tokens.map((t, k) => `<span class=tok style="background:${bg}" title="token ${t}, logprob ${lp ? lp[k].toFixed(3) : 'n/a'}">${esc(turn.ac_pieces[k])}</span>`).join('') + '</div>';
    // A character split across tokens decodes to U+FFFD piece by piece: the logged text too.
    const split = turn.ac_pieces.some(p => p.includes('\uFFFD'));
    const whole = turn.action != null && split ? `<pre class=text title="the decoded text">${esc(turn.action)}</pre>` : '';
    return toks + whole;
  }
  const ids = turn.ac_tokens.map((t, k) => `<span class=tok title="logprob ${lp ? lp[k].toFixed(3) : 'n/a'}">${t}</span>`).join(' ');
  const text = turn.action != null ? `<pre class=resp style="background:${bg}">${esc(turn.action)}</pre>` : '';
  return `${text}<details><summary>${turn.ac_tokens.length} tokens</summary>${ids}</details>`;
}

function member(ep) {
  const head = `<div class=mhead><b>${esc(ep.episode_id)}</b> · reward <b>${fmt(ep.total_reward)}</b> · advantage ${fmt(ep.advantage ?? 0)}`
    + ` · ${esc(ep.end_reason)}${ep.tags.length ? ' · ' + esc(ep.tags.join(', ')) : ''}${ep.note ? ' · ' + esc(ep.note) : ''}</div>`;
  const turns = ep.turns.map((t, k) => {
    const ob = k > 0 && t.observation != null ? `<pre class=obs>${esc(t.observation)}</pre>` : '';
    const label = ep.turns.length > 1 ? `<div class=mhead>turn ${t.turn} · reward ${fmt(t.reward)}</div>` : '';
    return label + ob + tokens(t, ep.advantage);
  }).join('');
  return `<div class=member data-episode="${esc(ep.episode_id)}">${head}${turns}</div>`;
}

async function showRollouts() {
  const page = ROLL;
  byId('rnotes').textContent = page ? (page.notes || []).join('; ') : 'no rollouts logged in this run (RL with --log-trajectories, or evaluation rollouts)';
  if (!page) { byId('group-list').innerHTML = ''; byId('group-detail').innerHTML = ''; return; }
  fillSelect('tag', page.tags || [], byId('tag').value);
  fillSelect('end', page.end_reasons || [], byId('end').value);
  byId('group-list').innerHTML = `<div class=gitem><b>${page.groups.length} groups, ${page.total} episodes</b></div>` + page.groups.map(g =>
    `<div class="gitem${g.group === page.group ? ' sel' : ''}" data-group="${esc(g.group)}"><b>group ${esc(g.group)}</b> · mean reward ${fmt(g.mean_reward)} · ${g.size}×`
    + `<div class=p>${esc(g.prompt)}</div></div>`).join('');
  byId('group-list').querySelectorAll('[data-group]').forEach(el => { el.onclick = () => loadRollouts(el.dataset.group); });
  const minr = parseFloat(byId('minr').value);
  const eps = (page.episodes || []).filter(e => isNaN(minr) || (e.total_reward ?? 0) >= minr);
  const first = eps.length ? eps[0].turns[0] : null;
  const prompt = first && first.observation != null ? `<pre class=prompt>${esc(first.observation)}</pre>` : '';
  byId('group-detail').innerHTML = eps.length ? prompt + eps.map(member).join('') : '<p>no episode in this group passes the filters</p>';
}

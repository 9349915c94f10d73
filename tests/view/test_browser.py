"""The ``tempering view`` page in a real headless Chromium (Debian's ``chromium``): driven by its
command line (``--dump-dom`` for the DOM after the page's scripts ran, ``--screenshot``), and
through the DevTools protocol (``cdp.py``) for the layout tests, which read the laid-out page at
two window widths: no chart title under its toolbar, each series once, the key charts first.
With ``TEMPERING_VIEW_SHOTS=DIR`` the layout tests also save their screenshots there (the ones in
docs/view.md). Skipped when chromium is not installed: ``make test-browser`` installs it and runs
these tests."""

from __future__ import annotations

import contextlib
import html
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import attrs
import pytest
import uvicorn
from cdp import Browser, Tab
from PIL import Image

from tempering.training import RunDir
from tempering.view import build_app, find_runs, write_static

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed (make test-browser installs it: apt-get install chromium)",
)
_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--virtual-time-budget=15000"]


@attrs.frozen
class _Config:
    lr: float = 1e-3


def _chromium(*args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run([CHROMIUM, *_FLAGS, *args], capture_output=True, text=True, timeout=120, check=True)


def _chart(dom: str, name: str) -> str:
    """The DOM of metric ``name``'s chart (up to the next chart)."""
    chart = dom[dom.index(f'id="chart-{re.sub(r"[^A-Za-z0-9_-]", "_", name)}"') :]
    end = chart.find('id="chart-', 1)
    return chart if end < 0 else chart[:end]


def _trace_points(chart: str) -> list[int]:
    """The number of markers drawn by each trace of a chart (curves of up to 100 points are
    drawn with markers: one per logged point, even where a line through them is straight)."""
    return [t.count('class="point"') for t in chart.split('class="trace scatter')[1:]]


def _rollouts(dom: str) -> str:
    """The text of the rollouts shown (one group: its prompt once, then its members)."""
    part = dom[dom.index('<div id="group-detail">') : dom.index('<h2 id="compare-title">')]
    return html.unescape(re.sub(r"<[^>]+>", "", part))


def _group_list(dom: str) -> str:
    return dom[dom.index('<div id="group-list">') : dom.index('<div id="group-detail">')]


@contextlib.contextmanager
def _served(app: Any) -> Generator[str]:
    """Serve the ASGI ``app`` on a free loopback port in a thread; yields its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(100):
            if server.started:
                break
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _page(rl_dir: Path, tmp_path: Path) -> Path:
    run, _ = RunDir.open(tmp_path / "sft", _Config())
    for s in range(7):
        run.append_metrics({"step": s, "loss": 2.0 / (1 + s * s)})  # no 3 points collinear
    return write_static([tmp_path / "sft", rl_dir], tmp_path / "page.html")


@pytest.mark.timeout(300)
def test_static_page_draws_curves_and_rollouts(rl_dir: Path, tmp_path: Path) -> None:
    dom = _chromium("--dump-dom", _page(rl_dir, tmp_path).as_uri()).stdout
    # The loss chart (a key chart, drawn at once): one SVG line through the 7 logged points
    # (fewer than 20 points: drawn as they are, not smoothed).
    chart = _chart(dom, "loss")
    lines = re.findall(r'<path class="js-line" d="M([^"]+)"', chart)
    assert lines, "no curve drawn for loss"
    assert len(lines[0].split("L")) == 7
    # The RL run's key curve is drawn; its other metrics are listed in their (collapsed) groups.
    assert 'id="chart-env_reward_mean"' in dom
    assert re.search(r'<details id="group-time" class="group"><summary>time \(\d+\)</summary>', dom)
    # The rollouts show the last step's best group: its logged prompt once and its members'
    # logged action text.
    body = _rollouts(dom)
    last = sorted((rl_dir / "trajectories/text").glob("step-*.jsonl"))[-1]
    logged = [json.loads(x) for x in last.read_text().splitlines()]
    shown = [r for r in logged if r["episode_id"] in body]
    assert shown, "no logged episode in the rollouts"
    assert body.count(shown[0]["turns"][0]["observation"].strip()) == 1, "the group's prompt is shown once"
    for r in shown:
        assert r["turns"][0]["action"] in body


@pytest.mark.timeout(300)
def test_screenshot_is_not_blank(rl_dir: Path, tmp_path: Path) -> None:
    shot = tmp_path / "shot.png"
    _chromium(f"--screenshot={shot}", "--window-size=1280,1600", _page(rl_dir, tmp_path).as_uri())
    image = Image.open(shot).convert("L")
    extrema: Any = image.getextrema()  # (min, max) of a one-band image
    lo, hi = int(extrema[0]), int(extrema[1])
    assert hi - lo > 100
    histogram = image.histogram()
    assert max(histogram) < 0.98 * sum(histogram), "the screenshot is (nearly) one colour"


@pytest.mark.timeout(300)
def test_served_page_shows_a_new_step_without_a_reload(tmp_path: Path) -> None:
    """The trainer writes step 5 right after the page's first metrics request; the page's poll
    draws it (the DOM is read once, after the page has run ~15 s of virtual time)."""
    run, _ = RunDir.open(tmp_path / "live", _Config())
    for s in range(5):
        run.append_metrics({"step": s, "loss": 2.0 / (1 + s * s)})
    app = build_app(find_runs([tmp_path / "live"]))
    served: list[str] = []

    async def trainer_writes_after_first_load(scope: Any, receive: Any, send: Any) -> None:
        await app(scope, receive, send)
        if scope["type"] == "http" and scope["path"] == "/api/metrics" and not served:
            served.append("first")
            run.append_metrics({"step": 5, "loss": 0.5})  # no 3 points collinear

    with _served(trainer_writes_after_first_load) as url:
        dom = _chromium("--dump-dom", url).stdout
    assert served == ["first"]
    assert "live: 6 steps" in dom
    chart = _chart(dom, "loss")
    (line,) = re.findall(r'<path class="js-line" d="M([^"]+)"', chart)
    assert len(line.split("L")) == 6


# The demo at the tiny budget of tests/recipes/test_demo.py: SFT 40 steps (evaluated at 0, 20,
# 40), RL 4 steps (checkpoints evaluated at global steps 42 and 44).
_DEMO = [
    "--model", "tiny", "--sft-steps", "40", "--sft-eval-every", "20", "--sft-batch-size", "16",
    "--rl-steps", "4", "--rl-eval-every", "2", "--rl-batch-size", "4", "--group-size", "8",
    "--n-test", "24", "--eval-samples", "2", "--eval-seeds", "1", "--no-progress",
]  # fmt: skip


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("demo")
    out = root / "demo"
    env = {**os.environ, "TEMPERING_HOME": str(root / "home"), "TEMPERING_NUM_THREADS": "1"}
    env.pop("TINKER_API_KEY", None)
    proc = subprocess.run(
        [sys.executable, "-m", "tempering.cli", "demo", *_DEMO, "--out", str(out)],
        capture_output=True, text=True, timeout=400, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def _eval_episodes(demo_dir: Path, step: int) -> list[dict[str, Any]]:
    path = demo_dir / "trajectories" / "eval" / f"step-{step:06d}.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()]


def _shows_a_group(dom: str, episodes: list[dict[str, Any]], *, every_group: bool = True) -> None:
    """The rollouts list every group of ``episodes`` (or some: a static page holds the best
    groups of a big step) and show one of them whole: its prompt once, then each member's id
    and answer."""
    groups = {ep["group"] for ep in episodes}
    listed = {int(g) for g in re.findall(r'data-group="(\d+)"', _group_list(dom))}
    assert listed == groups if every_group else listed and listed <= groups
    body = _rollouts(dom)
    shown = [ep for ep in episodes if ep["episode_id"] in body]
    assert shown
    (group,) = {ep["group"] for ep in shown}
    assert len(shown) == sum(ep["group"] == group for ep in episodes)
    assert body.count(shown[0]["turns"][0]["observation"]) == 1
    for ep in shown:
        assert ep["turns"][0]["action"] in body


@pytest.mark.timeout(600)
def test_demo_page_shows_both_stages(demo_dir: Path) -> None:
    """The demo's own page (``view.html``, written by ``tempering view --static``'s code) and
    ``tempering view`` serving the demo's directory: one run with both stages on one step axis,
    the held-out answers of an SFT and an RL evaluation, and the RL stage's training rollouts."""
    name = demo_dir.name
    page = demo_dir / "view.html"
    dom = _chromium("--dump-dom", f"{page.as_uri()}#run={name}&step=40").stdout
    assert f"{name}: 44 steps" in dom
    assert f"{name}/sft:" not in dom  # no stage is a run of its own: nothing drawn twice
    # Held-out accuracy over both stages (by global step): SFT's evaluations at 20 and 40, RL's
    # checkpoints at 42 and 44, one marker each; RL's reward (4 steps); SFT's loss (40 steps).
    assert _trace_points(_chart(dom, "test/accuracy")).count(4) == 1
    assert _trace_points(_chart(dom, "env/reward/mean")).count(4) == 1
    assert _trace_points(_chart(dom, "loss")).count(40) == 1
    # The SFT stage's last evaluation: its kept answers, prompt and response text.
    sft = _eval_episodes(demo_dir, 40)
    assert sft
    assert all(ep["tags"] == ["sft", "eval"] for ep in sft)
    _shows_a_group(dom, sft)

    with _served(build_app(find_runs([demo_dir]))) as url:
        rl_eval = _chromium("--dump-dom", f"{url}#run={name}&step=44").stdout
        rl_train = _chromium("--dump-dom", f"{url}#run={name}&stage=rl&step=3").stdout
    assert _trace_points(_chart(rl_eval, "test/accuracy")).count(4) == 1
    rl = _eval_episodes(demo_dir, 44)
    assert rl
    assert all(ep["tags"] == ["rl", "eval"] for ep in rl)
    _shows_a_group(rl_eval, rl)
    # The RL stage's training rollouts of its last step, with their logged text.
    text = demo_dir / "rl" / "trajectories" / "text" / "step-000003.jsonl"
    logged = [json.loads(x) for x in text.read_text().splitlines()]
    body = _rollouts(rl_train)
    shown = [r for r in logged if r["episode_id"] in body]
    assert shown
    for r in shown:
        assert r["turns"][0]["action"] in body
    # The evaluation comparison: the first (untrained) and the last evaluation, side by side.
    assert "held-out items at both step 0 and step 44" in html.unescape(re.sub(r"<[^>]+>", "", rl_eval))


@pytest.mark.timeout(300)
@pytest.mark.skipif(
    not os.environ.get("TEMPERING_VIEW_DEMO_DIR"),
    reason="set TEMPERING_VIEW_DEMO_DIR to a full `tempering demo` run directory",
)
def test_full_demo_page() -> None:
    """The ``view.html`` of a demo run at any budget (``make demo``'s defaults included): its step
    count, one held-out accuracy marker per evaluation logged in ``metrics.jsonl``, and the last
    evaluation's kept answers in the rollouts."""
    demo_dir = Path(os.environ["TEMPERING_VIEW_DEMO_DIR"])
    name = demo_dir.name
    lines = [json.loads(x) for x in (demo_dir / "metrics.jsonl").read_text().splitlines()]
    n_sft = sum(line["stage"] == "sft" for line in lines)
    n_rl = len(lines) - n_sft
    last = max(
        int(p.stem.removeprefix("step-")) for p in (demo_dir / "trajectories" / "eval").glob("step-*.jsonl")
    )
    dom = _chromium("--dump-dom", f"{(demo_dir / 'view.html').as_uri()}#run={name}&step={last}").stdout
    assert f"{name}: {n_sft + n_rl} steps" in dom
    assert sum("test/accuracy" in line for line in lines) in _trace_points(_chart(dom, "test/accuracy"))
    episodes = _eval_episodes(demo_dir, last)
    assert episodes
    _shows_a_group(dom, episodes, every_group=False)


# The layout tests: the demo's page and a two-stage recipe's page (math-rl on the tiny model:
# SFT, then RL), each at two window widths, read through the DevTools protocol once laid out.

_MATH_RL = [
    "--sft-steps", "6", "--sft-batch-size", "8", "--rl-steps", "4", "--rl-batch-size", "2",
    "--group-size", "4", "--n-test", "4", "--eval-seeds", "1", "--eval-samples", "2",
    "--max-tokens", "12", "--n-train", "64", "--no-progress",
]  # fmt: skip


@pytest.fixture(scope="module")
def recipe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("recipe")
    out = root / "math-rl"
    env = {**os.environ, "TEMPERING_HOME": str(root / "home"), "TEMPERING_NUM_THREADS": "1"}
    env.pop("TINKER_API_KEY", None)
    proc = subprocess.run(
        [sys.executable, "-m", "tempering.cli", "recipe", "math-rl", *_MATH_RL, "--out", str(out)],
        capture_output=True, text=True, timeout=400, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Generator[Browser]:
    b = Browser(tmp_path_factory.mktemp("profile"))
    try:
        yield b
    finally:
        b.close()


_FACTS = """(() => {
  const box = e => { if (!e) return null; const r = e.getBoundingClientRect();
    return {l: r.left, t: r.top + scrollY, r: r.right, b: r.bottom + scrollY, w: r.width, h: r.height}; };
  return {
    width: innerWidth, scrollWidth: document.documentElement.scrollWidth, runs: S.runs.map(r => r.name),
    charts: [...document.querySelectorAll('.card')].map(c => {
      const data = c.querySelector('.plot').data || [];
      return {id: c.id, name: c.querySelector('.ctitle').textContent, key: !!c.closest('#key'),
        title: box(c.querySelector('.ctitle')), toolbar: box(c.querySelector('.modebar')),
        plot: box(c.querySelector('.plot')),
        series: data.filter(t => t.meta === 'series').map(t => ({name: t.name, points: t.x.length}))};
    }),
    sections: Object.fromEntries(['key', 'summary', 'groups', 'rollouts', 'compare']
      .map(id => [id, box(document.getElementById(id)).t])),
    summary: [...document.querySelectorAll('#summary-table tr td:first-child')].map(td => td.textContent),
  };
})()"""

_OPEN_GROUPS = """(async () => {
  document.querySelectorAll('details.group').forEach(d => { d.open = true; });
  await new Promise(r => setTimeout(r, 200));
  await Promise.all(PENDING.splice(0));
  return true;
})()"""


def _overlap(a: dict[str, float], b: dict[str, float]) -> float:
    return max(0.0, min(a["r"], b["r"]) - max(a["l"], b["l"])) * max(
        0.0, min(a["b"], b["b"]) - max(a["t"], b["t"])
    )


def _metric_names(run_dir: Path) -> set[str]:
    """Every numeric metric the run (or its stages, without a combined file) logged, less the
    interval bounds (drawn as a band around their metric)."""
    files = (
        [run_dir / "metrics.jsonl"]
        if (run_dir / "metrics.jsonl").is_file()
        else list(run_dir.glob("*/metrics.jsonl"))
    )
    names: set[str] = set()
    for f in files:
        for line in f.read_text().splitlines():
            names |= {
                k
                for k, v in json.loads(line).items()
                if isinstance(v, float | int) and not isinstance(v, bool)
            }
    return {n for n in names - {"step", "global_step"} if not re.search(r"/ci95_(low|high)$", n)}


def _check_layout(tab: Tab, run_dir: Path, first_key: str) -> dict[str, Any]:
    tab.wait_mark("page-ready")
    facts: dict[str, Any] = tab.eval(_FACTS)
    assert facts["runs"] == [run_dir.name], "a recipe's directory is one run: its stages are not drawn again"
    assert facts["scrollWidth"] <= facts["width"], "the page scrolls sideways"
    charts = facts["charts"]
    key = [c for c in charts if c["key"]]
    assert key, "no key chart"
    # The key charts come first: above everything else, the reward or accuracy leading.
    assert re.search(first_key, key[0]["name"]), key[0]["name"]
    sec = facts["sections"]
    assert sec["key"] < sec["summary"] < sec["groups"] < sec["rollouts"] < sec["compare"]
    assert max(c["plot"]["b"] for c in key) <= sec["summary"]
    for c in charts:
        # Each chart's title is above its plot, never under the plotting toolbar.
        assert c["toolbar"] is not None, f"{c['name']}: no toolbar"
        assert _overlap(c["title"], c["toolbar"]) == 0, f"{c['name']}: the title is under the toolbar"
        assert c["title"]["b"] <= c["plot"]["t"], f"{c['name']}: the title overlaps the plot"
        assert c["plot"]["w"] >= 480, f"{c['name']}: a chart {c['plot']['w']:.0f} px wide"
        # Each series once: one trace per run, and no chart of a single point.
        assert [s["name"] for s in c["series"]] == [run_dir.name], c
        assert all(s["points"] >= 2 for s in c["series"]), c
    return facts


@pytest.mark.timeout(900)
@pytest.mark.parametrize("width", [1280, 800])
@pytest.mark.parametrize("which", ["demo", "recipe"])
def test_layout(
    which: str, width: int, request: pytest.FixtureRequest, browser: Browser, tmp_path: Path
) -> None:
    """The demo's page (its ``view.html``) and a two-stage recipe's (math-rl: SFT then RL), at two
    window widths: one run, each metric once (a chart with one trace, or a row of the summary
    table when it has one point), the key charts first, titles clear of the toolbar, charts wide
    enough to read, no sideways scrolling; and a screenshot that is not blank."""
    run_dir: Path = request.getfixturevalue("demo_dir" if which == "demo" else "recipe_dir")
    page = run_dir / "view.html" if which == "demo" else write_static([run_dir], tmp_path / "view.html")
    tab = Tab(browser, page.as_uri(), width)
    try:
        facts = _check_layout(tab, run_dir, r"reward|accuracy")
        if width == 1280:
            assert sum(c["plot"]["t"] == facts["charts"][0]["plot"]["t"] for c in facts["charts"]) == 2, (
                "two per row"
            )
        assert tab.eval(_OPEN_GROUPS)
        facts = _check_layout(tab, run_dir, r"reward|accuracy")  # every group open: the same facts
        names = [c["name"] for c in facts["charts"]]
        assert len(names) == len(set(names)), "a metric charted twice"
        assert not set(names) & set(facts["summary"]), "a metric both charted and in the summary"
        assert _metric_names(run_dir) <= set(names) | set(facts["summary"]), "a metric not shown"
        shot = tab.screenshot(tmp_path / f"view-{which}-{width}.png")
    finally:
        tab.close()
    image = Image.open(shot).convert("L")
    assert image.width == width
    histogram = image.histogram()
    assert max(histogram) < 0.98 * sum(histogram), "the screenshot is (nearly) one colour"
    if os.environ.get("TEMPERING_VIEW_SHOTS"):
        target = Path(os.environ["TEMPERING_VIEW_SHOTS"]) / shot.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, target)


_WALL_TIME = """(async () => {
  const x = byId('xaxis'); x.value = 'time'; x.onchange();
  await Promise.all(PENDING.splice(0));
  const plot = byId('chart-env_reward_mean').querySelector('.plot');
  return [plot.layout.xaxis.title.text, plot.data.filter(t => t.meta === 'series').map(t => [t.name, t.x])];
})()"""


@pytest.mark.timeout(300)
def test_overlay_legend_and_wall_time_axis(rl_dir: Path, tmp_path: Path, browser: Browser) -> None:
    """Two run directories overlaid: named once each in the legend, one colour each, one trace
    each per chart; the x axis switched to wall time puts the RL reward at its ``time/elapsed``."""
    tab = Tab(browser, _page(rl_dir, tmp_path).as_uri(), 1280)
    try:
        tab.wait_mark("page-ready")
        legend = tab.eval(
            "[...document.querySelectorAll('#legend .run-name')]"
            ".map(e => [e.textContent, e.querySelector('.swatch').style.background])"
        )
        assert [name for name, _ in legend] == ["sft", rl_dir.name]
        assert legend[0][1] != legend[1][1]
        facts = tab.eval(_FACTS)
        for chart in facts["charts"]:
            names = [s["name"] for s in chart["series"]]
            assert len(names) == len(set(names)) >= 1
            assert set(names) <= {"sft", rl_dir.name}
        title, traces = tab.eval(_WALL_TIME)
    finally:
        tab.close()
    assert title == "wall time (s)"
    elapsed = [json.loads(x)["time/elapsed"] for x in (rl_dir / "metrics.jsonl").read_text().splitlines()]
    assert traces == [[rl_dir.name, pytest.approx(elapsed)]]

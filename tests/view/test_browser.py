"""The static ``tempering view`` page in a real headless Chromium (Debian's ``chromium``,
driven by its command line: ``--dump-dom`` for the DOM after the page's scripts ran,
``--screenshot`` for the picture). Skipped when chromium is not installed: ``make test-browser``
installs it and runs these tests."""

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
    return dom[dom.index('<tbody id="episodes">') : dom.index("</tbody>")]


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
    # The loss chart: one SVG line, through the 7 logged points (both runs overlay other charts).
    chart = _chart(dom, "loss")
    lines = re.findall(r'<path class="js-line" d="M([^"]+)"', chart)
    assert lines, "no curve drawn for loss"
    assert len(lines[0].split("L")) == 7
    # Every metric of the RL run has its chart.
    metrics = [json.loads(x) for x in (rl_dir / "metrics.jsonl").read_text().splitlines()]
    for name in metrics[0]:
        if name != "step" and isinstance(metrics[0][name], float):
            assert 'id="chart-' + re.sub(r"[^A-Za-z0-9_-]", "_", name) + '"' in dom, name
    # The rollout table shows the logged text of the last step's episodes.
    body = _rollouts(dom)
    last = sorted((rl_dir / "trajectories/text").glob("step-*.jsonl"))[-1]
    actions = [json.loads(x)["turns"][0]["action"] for x in last.read_text().splitlines()]
    shown = [a for a in actions if a.strip() and html.escape(a, quote=False) in body]
    assert shown, "no logged action text in the rollout table"


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


def _shows_episodes(body: str, episodes: list[dict[str, Any]]) -> None:
    for ep in episodes:
        assert f"<td>{ep['episode_id']}<" in body, ep["episode_id"]
        (turn,) = ep["turns"]
        assert f"<pre>{html.escape(turn['observation'], quote=False)}</pre>" in body
        assert html.escape(turn["action"], quote=False) in body


@pytest.mark.timeout(600)
def test_demo_page_shows_both_stages(demo_dir: Path) -> None:
    """The demo's own page (``view.html``, written by ``tempering view --static``'s code) and
    ``tempering view`` serving the demo's directory: both stages' curves, the held-out answers of
    an SFT and an RL evaluation, and the RL stage's training rollouts."""
    name = demo_dir.name
    page = demo_dir / "view.html"
    dom = _chromium("--dump-dom", f"{page.as_uri()}#run={name}&step=40").stdout
    for run, steps in ((name, 44), (f"{name}/sft", 40), (f"{name}/rl", 4)):
        assert f"{run}: {steps} steps" in dom
    # Held-out accuracy over both stages (the combined run, by global step): SFT's evaluations
    # at 20 and 40, RL's checkpoints at 42 and 44, one marker each; and each stage's own run.
    assert 4 in _trace_points(_chart(dom, "test/accuracy"))
    assert 4 in _trace_points(_chart(dom, "env/reward/mean"))  # RL's 4 steps
    assert 40 in _trace_points(_chart(dom, "loss"))  # SFT's 40 steps
    # The SFT stage's last evaluation: its kept answers, prompt and response text.
    sft = _eval_episodes(demo_dir, 40)
    assert sft
    assert all(ep["tags"] == ["sft", "eval"] for ep in sft)
    _shows_episodes(_rollouts(dom), sft)

    with _served(build_app(find_runs([demo_dir]))) as url:
        rl_eval = _chromium("--dump-dom", f"{url}#run={name}&step=44").stdout
        rl_train = _chromium("--dump-dom", f"{url}#run={name}/rl&step=3").stdout
    assert 4 in _trace_points(_chart(rl_eval, "test/accuracy"))
    rl = _eval_episodes(demo_dir, 44)
    assert rl
    assert all(ep["tags"] == ["rl", "eval"] for ep in rl)
    _shows_episodes(_rollouts(rl_eval), rl)
    # The RL stage's training rollouts of its last step, with their logged text.
    body = _rollouts(rl_train)
    text = demo_dir / "rl" / "trajectories" / "text" / "step-000003.jsonl"
    logged = [json.loads(x) for x in text.read_text().splitlines()]
    shown = [r for r in logged if f"<td>{r['episode_id']}<" in body]
    assert len(shown) == min(20, len(logged)) > 0
    for r in shown:
        assert html.escape(r["turns"][0]["observation"], quote=False) in body


@pytest.mark.timeout(300)
@pytest.mark.skipif(
    not os.environ.get("TEMPERING_VIEW_DEMO_DIR"),
    reason="set TEMPERING_VIEW_DEMO_DIR to a full `tempering demo` run directory",
)
def test_full_demo_page() -> None:
    """The ``view.html`` of a demo run at any budget (``make demo``'s defaults included): each
    stage's step count, one held-out accuracy marker per evaluation logged in ``metrics.jsonl``,
    and the last evaluation's kept answers in the rollout table."""
    demo_dir = Path(os.environ["TEMPERING_VIEW_DEMO_DIR"])
    name = demo_dir.name
    lines = [json.loads(x) for x in (demo_dir / "metrics.jsonl").read_text().splitlines()]
    n_sft = sum(line["stage"] == "sft" for line in lines)
    n_rl = len(lines) - n_sft
    last = max(
        int(p.stem.removeprefix("step-")) for p in (demo_dir / "trajectories" / "eval").glob("step-*.jsonl")
    )
    dom = _chromium("--dump-dom", f"{(demo_dir / 'view.html').as_uri()}#run={name}&step={last}").stdout
    for run, steps in ((name, n_sft + n_rl), (f"{name}/sft", n_sft), (f"{name}/rl", n_rl)):
        assert f"{run}: {steps} steps" in dom
    assert sum("test/accuracy" in line for line in lines) in _trace_points(_chart(dom, "test/accuracy"))
    episodes = _eval_episodes(demo_dir, last)
    assert episodes
    _shows_episodes(_rollouts(dom), episodes[:20])

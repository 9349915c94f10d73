"""The static ``tempering view`` page in a real headless Chromium (Debian's ``chromium``,
driven by its command line: ``--dump-dom`` for the DOM after the page's scripts ran,
``--screenshot`` for the picture). Skipped when chromium is not installed: ``make test-browser``
installs it and runs these tests."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import attrs
import pytest
from PIL import Image

from tempering.training import RunDir
from tempering.view import write_static

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


def _page(rl_dir: Path, tmp_path: Path) -> Path:
    run, _ = RunDir.open(tmp_path / "sft", _Config())
    for s in range(7):
        run.append_metrics({"step": s, "loss": 2.0 / (1 + s * s)})  # no 3 points collinear
    return write_static([tmp_path / "sft", rl_dir], tmp_path / "page.html")


@pytest.mark.timeout(300)
def test_static_page_draws_curves_and_rollouts(rl_dir: Path, tmp_path: Path) -> None:
    dom = _chromium("--dump-dom", _page(rl_dir, tmp_path).as_uri()).stdout
    # The loss chart: one SVG line, through the 7 logged points (both runs overlay other charts).
    chart = dom[dom.index('id="chart-loss"') :]
    end = chart.find('id="chart-', 1)
    chart = chart if end < 0 else chart[:end]
    lines = re.findall(r'<path class="js-line" d="M([^"]+)"', chart)
    assert lines, "no curve drawn for loss"
    assert len(lines[0].split("L")) == 7
    # Every metric of the RL run has its chart.
    metrics = [json.loads(x) for x in (rl_dir / "metrics.jsonl").read_text().splitlines()]
    for name in metrics[0]:
        if name != "step" and isinstance(metrics[0][name], float):
            assert 'id="chart-' + re.sub(r"[^A-Za-z0-9_-]", "_", name) + '"' in dom, name
    # The rollout table shows the logged text of the last step's episodes.
    body = dom[dom.index('<tbody id="episodes">') : dom.index("</tbody>")]
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
    import socket
    import threading
    import time

    import uvicorn

    from tempering.view import build_app, find_runs

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

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(trainer_writes_after_first_load, host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(100):
            if server.started:
                break
            time.sleep(0.1)
        dom = _chromium("--dump-dom", f"http://127.0.0.1:{port}/").stdout
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    assert served == ["first"]
    assert "live: 6 steps" in dom
    chart = dom[dom.index('id="chart-loss"') :]
    end = chart.find('id="chart-', 1)
    chart = chart if end < 0 else chart[:end]
    (line,) = re.findall(r'<path class="js-line" d="M([^"]+)"', chart)
    assert len(line.split("L")) == 6

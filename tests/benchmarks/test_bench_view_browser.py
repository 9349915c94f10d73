"""The load time of ``tempering view``'s page on the synthetic big run (``view_workload.py``:
10,000 steps × 40 metrics, 1M transitions) in a real headless Chromium (Debian's ``chromium``).

The page is served by ``tempering view RUN_DIR --port 0`` in a child process; Chromium is
driven through the DevTools protocol by ``tests/cdp.py`` (``--remote-debugging-pipe``: no client library, no
browser download). Each round opens a fresh tab, navigates to the page and waits until the page
has set both of its marks: ``curves-drawn`` (every chart drawn, after ``/api/runs`` and
``/api/metrics``) and ``rollouts-shown`` (the first page of rollouts in the table, after
``/api/steps`` and ``/api/rollouts``). The benchmark's time is the wall time from the
navigation command to both marks; the marks' own times (from the navigation's start, by the
page's clock) are in ``extra_info``. Two loads: the page as it opens (the key charts drawn, the
metric groups collapsed; the synthetic run's metrics match no key name, so no chart is drawn
before ``curves-drawn``) and with ``#open=all`` (every group open: all 40 charts drawn before
``curves-drawn``). Run on demand: ``make bench``, or (docs/benchmarks.md)::

    .venv/bin/python -m pytest tests/benchmarks/test_bench_view_browser.py --benchmark-enable \
        --benchmark-only -p no:randomly -s

Skipped without chromium (``make test-browser`` installs it).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest
from cdp import CHROMIUM, Browser
from view_workload import big_run

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make test-browser)")


@contextlib.contextmanager
def _served(root: Path) -> Generator[str]:
    """``tempering view ROOT --port 0`` in a child process; yields the page's URL once it answers."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tempering.cli", "view", str(root), "--port", "0"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "tempering view: 1 run(s) at http://127.0.0.1:PORT/"
        url = line.rsplit(" ", 1)[-1].strip()
        assert url.startswith("http://127.0.0.1:"), f"tempering view said {line!r}"
        deadline = time.monotonic() + 60
        while True:  # the socket is bound before the server listens on it
            try:
                with urllib.request.urlopen(url, timeout=10) as r:
                    r.read()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


_MARKS = (
    "JSON.stringify(Object.fromEntries(performance.getEntriesByType('mark').map(m => [m.name, m.startTime])))"
)


def _load(browser: Browser, url: str) -> dict[str, float]:
    """Open a tab, navigate to ``url``, wait for both marks; the marks (ms from the navigation's
    start) and ``wall_ms`` (from the navigation command)."""
    target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    try:
        t0 = time.perf_counter()
        browser.send("Page.navigate", {"url": url}, session)
        deadline = t0 + 120
        while time.perf_counter() < deadline:
            result = browser.send("Runtime.evaluate", {"expression": _MARKS, "returnByValue": True}, session)
            marks: dict[str, float] = json.loads(result["result"].get("value") or "{}")
            if "rollouts-shown" in marks and "curves-drawn" in marks:
                return {**marks, "wall_ms": (time.perf_counter() - t0) * 1000}
            time.sleep(0.01)
        raise TimeoutError(f"{url}: the page set no rollouts-shown mark within 120 s")
    finally:
        browser.send("Target.closeTarget", {"targetId": target})


@pytest.mark.timeout(900)
@pytest.mark.benchmark(group="view-browser")
@pytest.mark.parametrize("groups", ["collapsed", "open"])
def test_page_load_big_run(benchmark: Any, tmp_path: Path, groups: str) -> None:
    root = big_run(tmp_path / "big")
    browser = Browser(tmp_path / "profile", window=(1280, 1600))
    rounds: list[dict[str, float]] = []
    try:
        with _served(root) as served:
            url = served + ("#open=all" if groups == "open" else "")
            _load(browser, url)  # warm-up: the server's first metrics read, plotly.js cached

            def once() -> None:
                rounds.append(_load(browser, url))

            benchmark.pedantic(once, rounds=5, iterations=1)
    finally:
        browser.close()
    for key in ("curves-drawn", "rollouts-shown", "wall_ms"):
        values = sorted(r[key] for r in rounds)
        benchmark.extra_info[f"{key}_median_ms"] = values[len(values) // 2]
        median = values[len(values) // 2]
        print(f"{groups}: {key}: median {median:.0f} ms, rounds {[round(v) for v in values]}")
    assert all(r["curves-drawn"] <= r["rollouts-shown"] for r in rounds)

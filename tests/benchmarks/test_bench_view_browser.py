"""The load time of ``tempering view``'s page on the synthetic big run (``view_workload.py``:
10,000 steps × 40 metrics, 1M transitions) in a real headless Chromium (Debian's ``chromium``).

The page is served by ``tempering view RUN_DIR --port 0`` in a child process; Chromium is
driven through the DevTools protocol over ``--remote-debugging-pipe`` (no client library, no
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
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest
from view_workload import big_run

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make test-browser)")


class _Browser:
    """Chromium over ``--remote-debugging-pipe``: commands on fd 3, answers and events on fd 4,
    each message JSON ended by a NUL byte."""

    def __init__(self, profile: Path) -> None:
        assert CHROMIUM is not None
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # The child gets the pipe's ends as fds 3 and 4 (dup2 in the child, after fork).
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
             f"--user-data-dir={profile}", "--window-size=1280,1600", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(3, 4), preexec_fn=lambda: (os.dup2(to_browser_r, 3), os.dup2(from_browser_w, 4)),
        )  # fmt: skip
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buf = b""
        self._next = 0

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> Any:
        self._next += 1
        msg: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session is not None:
            msg["sessionId"] = session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        while True:
            while b"\0" not in self._buf:
                chunk = os.read(self._from_browser, 1 << 16)
                if not chunk:
                    raise RuntimeError("chromium closed the DevTools pipe")
                self._buf += chunk
            raw, _, self._buf = self._buf.partition(b"\0")
            answer = json.loads(raw)
            if answer.get("id") == self._next:  # events (no id) are skipped
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer["result"]

    def close(self) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            self.send("Browser.close")
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)


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


def _load(browser: _Browser, url: str) -> dict[str, float]:
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
    browser = _Browser(tmp_path / "profile")
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

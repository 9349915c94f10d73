"""Headless Chromium driven through the DevTools protocol over ``--remote-debugging-pipe`` (no
client library, no browser download): open a page at a window size, evaluate JavaScript in it,
take a screenshot. Used by the page's layout tests (``view/test_browser.py``) and its load-time
benchmark (``benchmarks/test_bench_view_browser.py``)."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """Chromium over ``--remote-debugging-pipe``: commands on fd 3, answers and events on fd 4,
    each message JSON ended by a NUL byte."""

    def __init__(self, profile: Path, window: tuple[int, int] | None = None) -> None:
        assert CHROMIUM is not None
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        size = [f"--window-size={window[0]},{window[1]}"] if window is not None else []
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--remote-debugging-pipe", f"--user-data-dir={profile}", *size, "about:blank"],
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


class Tab:
    """One page of ``browser`` at ``width`` × ``height`` CSS pixels."""

    def __init__(self, browser: Browser, url: str, width: int, height: int = 900) -> None:
        self.browser = browser
        self.target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = browser.send("Target.attachToTarget", {"targetId": self.target, "flatten": True})[
            "sessionId"
        ]
        self.width = width
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        self.send("Page.navigate", {"url": url})

    def send(self, method: str, params: dict[str, Any] | None = None) -> Any:
        return self.browser.send(method, params, self.session)

    def eval(self, expression: str) -> Any:
        """The value of a JavaScript expression (awaited when it is a promise)."""
        result = self.send(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_mark(self, mark: str, timeout: float = 120) -> None:
        """Wait until the page has set the performance mark ``mark``."""
        deadline = time.monotonic() + timeout
        expr = f"performance.getEntriesByName({json.dumps(mark)}).length > 0"
        while not self.eval(expr):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the page set no {mark!r} mark within {timeout} s")
            time.sleep(0.05)

    def screenshot(self, path: Path) -> Path:
        """The whole page (not only the window) as a PNG."""
        height = int(self.eval("document.documentElement.scrollHeight"))
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": self.width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        time.sleep(0.5)  # let plotly's responsive charts settle at the new size
        shot = self.send("Page.captureScreenshot", {"format": "png"})
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def close(self) -> None:
        self.browser.send("Target.closeTarget", {"targetId": self.target})

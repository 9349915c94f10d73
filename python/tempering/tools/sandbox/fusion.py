"""A SandboxFusion backend: run commands on a SandboxFusion server over HTTP.

SandboxFusion (https://github.com/bytedance/SandboxFusion) runs code in its own containers and
serves ``POST /run_code``. :class:`SandboxFusionSandbox` sends the command as a ``bash``
program, with the files base64-encoded under ``files`` and ``stdin``, and maps the reply (its
``status``, and ``run_result``'s ``status``, ``return_code``, ``stdout``, ``stderr``,
``execution_time``) onto a :class:`SandboxResult`. The limits are the server's; it reports only
``timeout``, ``error`` and ``sandbox_error`` among the failures.

Not runnable on the project's test machine: tests/tools/test_sandbox_fusion.py checks the
request and the reply mapping against a recorded exchange replayed by a local HTTP server.

Example::

    sandbox = SandboxFusionSandbox(url="http://localhost:8080/run_code")
    result = await sandbox.run(["python3", "main.py"], files={"main.py": "print(1)"})
"""

from __future__ import annotations

import asyncio
import base64
import json
import shlex
import time
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any, cast

import attrs

from tempering_protocols.sandbox import SandboxResult

__all__ = ["SandboxFusionSandbox", "fusion_request", "fusion_result"]


def fusion_request(
    command: Sequence[str],
    files: Mapping[str, str | bytes],
    stdin: str | None,
    run_timeout: float,
    compile_timeout: float,
) -> dict[str, Any]:
    """The JSON body of a ``/run_code`` request running ``command`` with ``files``."""
    encoded = {
        name: base64.b64encode(content.encode("utf-8") if isinstance(content, str) else content).decode(
            "ascii"
        )
        for name, content in files.items()
    }
    body: dict[str, Any] = {
        "code": shlex.join(command),
        "language": "bash",
        "run_timeout": run_timeout,
        "compile_timeout": compile_timeout,
        "files": encoded,
    }
    if stdin is not None:
        body["stdin"] = stdin
    return body


def fusion_result(reply: Mapping[str, Any], wall_seconds: float) -> SandboxResult:
    """A ``/run_code`` reply as a :class:`SandboxResult` (``wall_seconds``: the request's own
    time, used when the reply has no ``execution_time``)."""
    isolation = ("sandbox_fusion",)
    status = reply.get("status")
    run = reply.get("run_result")
    if status == "SandboxError" or not isinstance(run, Mapping):
        message = str(reply.get("message") or "no run_result in the reply")
        return SandboxResult(
            "sandbox_error", None, "", "", wall_seconds, f"SandboxFusion: {message}", isolation
        )
    run = cast(Mapping[str, Any], run)
    stdout = str(run.get("stdout") or "")
    stderr = str(run.get("stderr") or "")
    elapsed = run.get("execution_time")
    seconds = float(elapsed) if isinstance(elapsed, int | float) else wall_seconds
    code = run.get("return_code")
    exit_code = int(code) if isinstance(code, int) else None
    if run.get("status") == "TimeLimitExceeded":
        return SandboxResult(
            "timeout", exit_code, stdout, stderr, seconds, "ran past SandboxFusion's run timeout", isolation
        )
    if run.get("status") == "Finished" and exit_code == 0:
        return SandboxResult("ok", 0, stdout, stderr, seconds, "", isolation)
    reason = f"exited with code {exit_code}" if exit_code is not None else f"run status {run.get('status')}"
    return SandboxResult("error", exit_code, stdout, stderr, seconds, reason, isolation)


@attrs.frozen(kw_only=True)
class SandboxFusionSandbox:
    """``tempering_protocols.Sandbox`` over a SandboxFusion server (see the module doc)."""

    url: str = "http://localhost:8080/run_code"
    run_timeout: float = 10.0
    """Seconds the server lets the command run (``run(timeout=...)`` overrides it)."""
    compile_timeout: float = 10.0
    request_timeout: float = 120.0
    """Seconds to wait for the HTTP reply (beyond that: ``sandbox_error``)."""

    async def run(
        self,
        command: Sequence[str],
        /,
        *,
        files: Mapping[str, str | bytes] | None = None,
        stdin: str | None = None,
        timeout: float | None = None,
    ) -> SandboxResult:
        if not command:
            raise ValueError("SandboxFusionSandbox.run: command is empty; pass e.g. ['python3', 'main.py']")
        body = fusion_request(
            command,
            files or {},
            stdin,
            self.run_timeout if timeout is None else timeout,
            self.compile_timeout,
        )
        start = time.monotonic()
        try:
            reply = await asyncio.to_thread(self._post, body)
        except (OSError, ValueError) as e:  # URLError, HTTPError and timeouts are OSErrors
            return SandboxResult(
                "sandbox_error",
                None,
                "",
                "",
                time.monotonic() - start,
                f"SandboxFusion at {self.url}: {e}",
                ("sandbox_fusion",),
            )
        return fusion_result(reply, time.monotonic() - start)

    def _post(self, body: Mapping[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            self.url,
            data=json.dumps(body).encode("utf-8"),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=self.request_timeout) as response:
            loaded: object = json.loads(response.read().decode("utf-8"))
        if not isinstance(loaded, dict):
            raise ValueError(f"the reply is not a JSON object: {str(loaded)[:200]}")
        return cast(dict[str, Any], loaded)

"""The SandboxFusion backend against a recorded exchange.

No SandboxFusion server runs here, so a local HTTP server replays replies written from the
documented ``/run_code`` format (request: ``code``, ``language``, ``run_timeout``,
``compile_timeout``, ``stdin``, ``files`` as base64; reply: ``status``, ``message``,
``run_result`` with ``status``, ``return_code``, ``stdout``, ``stderr``, ``execution_time``).
This checks our request and our reading of the reply, not the server.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

from tempering.tools.sandbox import SandboxFusionSandbox, grade_program
from tempering_protocols import Sandbox

FINISHED = {
    "status": "Success",
    "message": "",
    "compile_result": None,
    "run_result": {
        "status": "Finished",
        "execution_time": 0.0312,
        "return_code": 0,
        "stdout": "42\n",
        "stderr": "",
    },
    "executor_pod_name": None,
    "files": {},
}
TIMED_OUT = {
    "status": "Failed",
    "message": "",
    "compile_result": None,
    "run_result": {
        "status": "TimeLimitExceeded",
        "execution_time": 2.004,
        "return_code": None,
        "stdout": "",
        "stderr": "",
    },
    "files": {},
}
FAILED = {
    "status": "Failed",
    "message": "",
    "run_result": {
        "status": "Finished",
        "execution_time": 0.05,
        "return_code": 1,
        "stdout": "",
        "stderr": "Traceback (most recent call last):\nZeroDivisionError: division by zero\n",
    },
}
SANDBOX_ERROR = {"status": "SandboxError", "message": "no executor available", "run_result": None}


class _Replay:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.replies: list[tuple[int, bytes]] = []
        self.responder: Callable[[dict[str, Any]], tuple[int, bytes]] | None = None


@pytest.fixture
def server() -> Iterator[tuple[str, _Replay]]:
    replay = _Replay()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers["Content-Length"])
            request = json.loads(self.rfile.read(length))
            replay.requests.append({"path": self.path, "body": request})
            code, body = replay.responder(request) if replay.responder else replay.replies.pop(0)
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            del format, args

    httpd = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}/run_code", replay
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.timeout(30)
def test_request_and_reply_of_a_finished_run(server: tuple[str, _Replay]) -> None:
    url, replay = server
    replay.replies.append((200, json.dumps(FINISHED).encode()))
    sandbox = SandboxFusionSandbox(url=url, run_timeout=7)
    assert isinstance(sandbox, Sandbox)
    result = asyncio.run(
        sandbox.run(
            ["python3", "main.py", "a b"], files={"main.py": "print(6 * 7)", "d.bin": b"\x00\x01"}, stdin="x"
        )
    )
    (request,) = replay.requests
    assert request["path"] == "/run_code"
    body = request["body"]
    assert body["language"] == "bash"
    assert body["code"] == "python3 main.py 'a b'"
    assert body["run_timeout"] == 7
    assert body["stdin"] == "x"
    assert base64.b64decode(body["files"]["main.py"]) == b"print(6 * 7)"
    assert base64.b64decode(body["files"]["d.bin"]) == b"\x00\x01"
    assert (result.status, result.exit_code, result.stdout) == ("ok", 0, "42\n")
    assert result.wall_seconds == pytest.approx(0.0312)
    assert result.isolation == ("sandbox_fusion",)


@pytest.mark.timeout(30)
def test_failures_map_to_statuses(server: tuple[str, _Replay]) -> None:
    url, replay = server
    for reply in (TIMED_OUT, FAILED, SANDBOX_ERROR):
        replay.replies.append((200, json.dumps(reply).encode()))
    replay.replies.append((500, b'{"detail": "internal"}'))
    sandbox = SandboxFusionSandbox(url=url)

    async def four() -> list[Any]:
        return [await sandbox.run(["python3", "main.py"], timeout=2) for _ in range(4)]

    timed_out, failed, sandbox_error, http_error = asyncio.run(four())
    assert replay.requests[0]["body"]["run_timeout"] == 2
    assert (timed_out.status, timed_out.exit_code) == ("timeout", None)
    assert (failed.status, failed.exit_code) == ("error", 1)
    assert "ZeroDivisionError" in failed.stderr
    assert sandbox_error.status == "sandbox_error"
    assert "no executor available" in sandbox_error.reason
    assert http_error.status == "sandbox_error"
    assert "500" in http_error.reason


@pytest.mark.timeout(30)
def test_unreachable_server_is_a_sandbox_error() -> None:
    sandbox = SandboxFusionSandbox(url="http://127.0.0.1:9/run_code", request_timeout=5)
    result = asyncio.run(sandbox.run(["true"]))
    assert result.status == "sandbox_error"
    assert "127.0.0.1:9" in result.reason


@pytest.mark.timeout(30)
def test_grading_reads_the_harness_reports_through_fusion(server: tuple[str, _Replay]) -> None:
    url, replay = server

    def harness_reply(body: dict[str, Any]) -> tuple[int, bytes]:
        # what the harness prints for tests 0 and 1 passing and test 2 failing, under the nonce
        # that grade_program fed on stdin
        nonce = body["stdin"].strip()
        stdout = "".join(f"\n{nonce} {i} {int(i < 2)}\n" for i in range(3))
        run = {"status": "Finished", "execution_time": 0.1, "return_code": 0, "stdout": stdout, "stderr": ""}
        return 200, json.dumps({"status": "Success", "message": "", "run_result": run}).encode()

    replay.responder = harness_reply
    graded = asyncio.run(
        grade_program(SandboxFusionSandbox(url=url), "x = 1", ["assert x", "assert x", "assert not x"])
    )
    assert (graded.passed, graded.total, graded.status) == (2, 3, "ok")
    body = replay.requests[0]["body"]
    assert body["code"] == "python3 harness.py"
    assert set(body["files"]) == {"harness.py", "solution.py", "tests.json"}

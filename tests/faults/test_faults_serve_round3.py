"""Fault catalogue, ``tempering serve``, round 3 (issue 32): bad options at startup, stalled and
vanishing clients, deeply nested bodies, server paths in answers, and a fuzz of every route.

One server subprocess for the module, with a 1 s ``--read-timeout`` and a 64 KB request limit,
its log (stdout and stderr) read by the tests. Requests go over raw sockets where the test needs
to stall, truncate or oversize them, and through ``httpx`` otherwise.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.routing import Route

from tempering.cli import main as cli_main
from tempering.data.jsontext import MAX_JSON_DEPTH
from tempering.local.checkpoints import CheckpointMeta, LoraMeta
from tempering.serve import build_app
from tempering.serve.engine import Engine
from tempering.serve.private import PathScrubber
from tempering.serve.testing import API_KEY, ServerProcess

READ_TIMEOUT_S = 1.0
LIMIT_MB = 0.0625
LIMIT_BYTES = int(LIMIT_MB * 1024 * 1024)
KEY = {"X-API-Key": API_KEY}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("faults-serve-r3")


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[ServerProcess]:
    process = ServerProcess(
        root / "data",
        root / "home",
        *("--read-timeout", str(READ_TIMEOUT_S), "--max-request-mb", str(LIMIT_MB), "--log-level", "info"),
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers=KEY, timeout=10) as c:
        yield c


def port_of(server: ServerProcess) -> int:
    return int(server.url.rsplit(":", 1)[1])


def raw_exchange(
    server: ServerProcess, data: bytes, *, wait: float = 5.0, then: bytes | None = None
) -> tuple[float, bytes, bool]:
    """Send ``data``, read until the server closes; ``(seconds, bytes read, closed by the server)``."""
    with socket.create_connection(("127.0.0.1", port_of(server))) as sock:
        sock.settimeout(wait)
        start = time.monotonic()
        sock.sendall(data)
        if then is not None:
            sock.sendall(then)
        out = b""
        try:
            while chunk := sock.recv(65536):
                out += chunk
        except TimeoutError:
            return time.monotonic() - start, out, False
        except ConnectionResetError:
            pass
        return time.monotonic() - start, out, True


def status_of(response: bytes) -> int | None:
    match = re.match(rb"HTTP/1\.1 (\d{3}) ", response)
    return int(match[1]) if match else None


def head(method: str, path: str, length: int, *, key: str | None = API_KEY) -> bytes:
    """A request's head; ``Connection: close`` so that the server closes once it has answered."""
    lines = [f"{method} {path} HTTP/1.1", "Host: test", "Connection: close", f"Content-Length: {length}"]
    if key is not None:
        lines.append(f"X-API-Key: {key}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def log_text(server: ServerProcess) -> str:
    return "".join(server.log)


def server_paths(server: ServerProcess) -> list[str]:
    """What no answer may contain: the data dir, $TEMPERING_HOME, the home directory."""
    return [str(server.data_dir), str(server.data_dir.resolve()), str(server.home), str(Path.home())]


# ---- options: refused before binding or creating the data dir ---------------------------------


def run_cli(argv: list[str]) -> int:
    try:
        return cli_main(argv)
    except SystemExit as exc:  # argparse's own refusals
        return int(exc.code or 0)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("flags", "env", "says"),
    [
        (["--max-request-mb", "0"], {}, "--max-request-mb 0 "),
        (["--max-request-mb", "-5"], {}, "--max-request-mb -5 "),
        (["--max-request-mb", "nan"], {}, "--max-request-mb nan "),
        (["--max-request-mb", "inf"], {}, "--max-request-mb inf "),
        (["--max-request-mb", "1e-9"], {}, "under one byte"),
        (["--port", "-1"], {}, "--port -1 "),
        (["--port", "65536"], {}, "--port 65536 "),
        (["--port", "abc"], {}, "--port: invalid int value: 'abc'"),
        (["--log-level", "loud"], {}, "--log-level 'loud' "),
        (["--session-ttl-s", "nan"], {}, "--session-ttl-s nan "),
        (["--read-timeout", "0"], {}, "--read-timeout 0 "),
        (["--read-timeout", "-1"], {}, "--read-timeout -1 "),
        (["--read-timeout", "nan"], {}, "--read-timeout nan "),
        (["--read-timeout", "inf"], {}, "--read-timeout inf "),
        (["--dtype", "float33"], {}, "unknown dtype 'float33'"),
        ([], {"TEMPERING_NUM_THREADS": "many"}, "$TEMPERING_NUM_THREADS='many'"),
        ([], {"TEMPERING_SERVE_RESIDENT_SAMPLERS": "0"}, "$TEMPERING_SERVE_RESIDENT_SAMPLERS='0'"),
    ],
)
def test_bad_options_are_refused_at_startup(
    flags: list[str],
    env: dict[str, str],
    says: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--max-request-mb 0`` started a server that refused every request; ``nan`` crashed; a bad
    ``--port`` or ``--log-level`` printed a traceback after creating the data dir. Each bad option
    is now one ``error:`` line naming the flag and its value, exit 2, before anything is bound or
    written."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    data_dir = tmp_path / "data"
    argv = ["serve", "--host", "127.0.0.1", "--port", "0", "--api-key", API_KEY, "--data-dir", str(data_dir)]
    code = run_cli(argv + flags)
    err = capsys.readouterr().err
    assert code == 2, err
    assert says in err, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if not line.startswith(("usage:", " "))]  # argparse's usage
    assert 1 <= len(lines) <= 2, err
    assert not data_dir.exists()


# ---- read timeouts ----------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_half_sent_headers_are_closed_after_the_read_timeout(
    server: ServerProcess, client: httpx.Client
) -> None:
    """A client that sent half its headers and stalled held the connection for ever. After
    ``--read-timeout`` it gets a 408 and the connection closes; others are served meanwhile."""
    result: list[tuple[float, bytes, bool]] = []
    stalled = threading.Thread(
        target=lambda: result.append(
            raw_exchange(server, b"POST /api/v1/create_session HTTP/1.1\r\nHost: t\r\n")
        )
    )
    stalled.start()
    time.sleep(0.2)
    start = time.monotonic()
    assert client.get("/api/v1/healthz").status_code == 200
    assert time.monotonic() - start < 0.7 * READ_TIMEOUT_S  # not queued behind the stalled client
    stalled.join()
    seconds, answer, closed = result[0]
    assert closed, "the server held a half-sent request open"
    assert READ_TIMEOUT_S * 0.8 <= seconds < READ_TIMEOUT_S + 2
    assert status_of(answer) == 408
    assert b"--read-timeout" in answer


@pytest.mark.timeout(60)
def test_trickled_headers_do_not_hold_the_connection(server: ServerProcess) -> None:
    """Headers sent a byte every 0.2 s (each pause shorter than the timeout) are cut off once
    they have taken ``--read-timeout`` in all."""
    with socket.create_connection(("127.0.0.1", port_of(server))) as sock:
        start = time.monotonic()
        closed_after = None
        for byte in b"GET /api/v1/healthz HTTP/1.1\r\nX-Padding: " + b"a" * 100:
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed_after = time.monotonic() - start
                break
            sock.settimeout(0.2)
            try:
                if sock.recv(4096).startswith(b"HTTP/1.1 408"):
                    closed_after = time.monotonic() - start
                    break
            except TimeoutError:
                pass
        assert closed_after is not None, "trickled headers held the connection"
        assert closed_after < READ_TIMEOUT_S + 1.5


@pytest.mark.timeout(60)
def test_half_sent_body_is_closed_after_the_read_timeout(server: ServerProcess) -> None:
    """A body that stops half way gets a 408 after ``--read-timeout``; the handler waiting for
    it is released (logged at INFO, no traceback)."""
    seconds, answer, closed = raw_exchange(
        server, head("POST", "/api/v1/create_session", 100) + b'{"tags": ['
    )
    assert closed, "the server held a half-sent body open"
    assert READ_TIMEOUT_S * 0.8 <= seconds < READ_TIMEOUT_S + 2
    assert status_of(answer) == 408
    assert b"request body of POST /api/v1/create_session incomplete" in answer
    time.sleep(0.3)
    assert "request body of POST /api/v1/create_session incomplete after 1 s (--read-timeout)" in log_text(
        server
    )


@pytest.mark.timeout(60)
def test_a_slow_body_that_keeps_coming_is_served(server: ServerProcess) -> None:
    """The body's clock restarts with each chunk: a body sent in pieces over twice the timeout,
    each pause shorter than it, is answered normally."""
    body = json.dumps({"tags": ["slow"], "user_metadata": None, "sdk_version": "0.38"}).encode()
    with socket.create_connection(("127.0.0.1", port_of(server))) as sock:
        sock.settimeout(10)
        sock.sendall(head("POST", "/api/v1/create_session", len(body)))
        pieces = [body[i : i + 8] for i in range(0, len(body), 8)]
        pause = 2 * READ_TIMEOUT_S / len(pieces)
        for piece in pieces:
            time.sleep(pause)
            sock.sendall(piece)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert status_of(answer) == 200, answer
    assert b"session_id" in answer


@pytest.mark.timeout(60)
def test_a_client_gone_mid_body_is_logged_at_info_without_a_traceback(server: ServerProcess) -> None:
    """Every client that disconnected mid-body logged an ERROR with a traceback."""
    with socket.create_connection(("127.0.0.1", port_of(server))) as sock:
        sock.sendall(head("POST", "/api/v1/telemetry", 1000) + b'{"events": [')
        time.sleep(0.2)
    deadline = time.monotonic() + 5
    line = "POST /api/v1/telemetry: the client disconnected before its request body was complete"
    while line not in log_text(server) and time.monotonic() < deadline:
        time.sleep(0.05)
    log = log_text(server)
    assert re.search(r" INFO 127\.0\.0\.1:\d+: " + re.escape(line), log), log
    assert "Traceback" not in log
    assert " ERROR " not in log


# ---- JSON bodies with a nesting limit ---------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("route", ["/api/v1/create_session", "/api/v1/weights_info", "/api/v1/asample"])
def test_a_deeply_nested_body_is_a_400_naming_the_limit(client: httpx.Client, route: str) -> None:
    """A body nested 10,000 levels deep got a 500 (a RecursionError in the JSON parser)."""
    deep = "[" * 10_000 + "]" * 10_000  # past Python's recursion limit, under the 64 KB limit
    response = client.post(route, content=deep)
    assert response.status_code == 400, response.text
    detail = response.json()["detail"]
    assert f"nests deeper than {MAX_JSON_DEPTH} levels" in detail
    assert f"at byte {MAX_JSON_DEPTH + 1}" in detail


# ---- no server paths in answers ---------------------------------------------------------------


def _write_meta(directory: Path, base_model: str) -> None:
    directory.mkdir(parents=True)
    lora = LoraMeta(rank=4, alpha=32, target_modules=("q_proj",))
    meta = CheckpointMeta(
        kind="weights", base_model=base_model, lora=lora, has_optimizer=False, optimizer_steps=0
    )
    (directory / "meta.json").write_text(json.dumps(meta.to_json()))


def _session(client: httpx.Client) -> str:
    response = client.post(
        "/api/v1/create_session", json={"tags": [], "user_metadata": None, "sdk_version": "0.38"}
    )
    return str(response.json()["session_id"])


@pytest.mark.timeout(60)
def test_a_missing_checkpoint_names_the_tinker_path_not_the_data_dir(
    server: ServerProcess, client: httpx.Client
) -> None:
    """A 404 for a missing checkpoint told the client the absolute path of the server's data dir
    (``looked in /.../checkpoints/...``). Every route naming a checkpoint answers with the client's
    own ``tinker://`` path."""
    session = _session(client)
    missing = "tinker://run-gone/weights/nothing"
    ckpt = "/api/v1/training_runs/run-gone/checkpoints/weights/nothing"
    calls = [
        (
            "POST",
            "/api/v1/create_sampling_session",
            {"session_id": session, "sampling_session_seq_id": 0, "model_path": missing},
        ),
        (
            "POST",
            "/api/v1/load_weights",
            {"session_id": session, "model_seq_id": 0, "path": missing, "optimizer": False},
        ),
        ("POST", "/api/v1/weights_info", {"tinker_path": missing}),
        ("POST", "/api/v1/copy_weights", {"source_path": missing, "destination_project_id": "p"}),
        ("DELETE", ckpt, None),
        ("PUT", ckpt + "/ttl", {"ttl_seconds": 60}),
    ]
    for method, path, body in calls:
        response = client.request(method, path, json=body)
        assert response.status_code == 404, (path, response.text)
        assert missing.removeprefix("tinker://") in response.text, (path, response.text)
        for private in server_paths(server):
            assert private not in response.text, (path, response.text)


@pytest.mark.timeout(60)
def test_a_broken_checkpoint_names_no_server_path(server: ServerProcess, client: httpx.Client) -> None:
    """Errors raised deeper in the engine name files by their absolute paths (a checkpoint whose
    weights file is gone, a base model directory that is gone): the client gets the ``tinker://``
    path or ``<data dir>/...``, both at once (4xx) and through a failed future."""
    base = server.data_dir / "checkpoints"
    _write_meta(base / "run-broken" / "weights" / "no-weights", "tempering/tiny")
    _write_meta(base / "run-broken" / "weights" / "no-base", str(server.data_dir / "models" / "gone"))
    session = _session(client)
    started = client.post(
        "/api/v1/load_weights",
        json={
            "session_id": session,
            "model_seq_id": 0,
            "path": "tinker://run-broken/weights/no-weights",
            "optimizer": False,
        },
    )
    assert started.status_code == 200, started.text
    request_id = started.json()["request_id"]
    for _ in range(60):
        polled = client.post("/api/v1/retrieve_future", json={"request_id": request_id}).json()
        if "error" in polled:
            break
    assert "tinker://run-broken/weights/no-weights/weights.safetensors" in polled["error"], polled
    assert "tempering://" not in polled["error"]
    sampled = client.post(
        "/api/v1/create_sampling_session",
        json={
            "session_id": session,
            "sampling_session_seq_id": 1,
            "model_path": "tinker://run-broken/weights/no-base",
        },
    )
    assert sampled.status_code == 404, sampled.text
    assert "<data dir>/models/gone" in sampled.text
    for text in (json.dumps(polled), sampled.text):
        for private in server_paths(server):
            assert private not in text, text


def test_path_scrubber_rewrites_server_paths(tmp_path: Path) -> None:
    data = tmp_path / "data"
    scrub = PathScrubber(data, home=tmp_path / "home")
    assert scrub(
        f"no checkpoint at 'tempering://r/weights/x' (looked in {data}/checkpoints/r/weights/x)"
    ) == ("no checkpoint at 'tinker://r/weights/x'")
    assert scrub(f"see {data}/checkpoints/r/weights/x") == "see tinker://r/weights/x"
    assert scrub(f"{data}/checkpoints/r/sampler_weights/x/weights.safetensors is truncated") == (
        "tinker://r/sampler_weights/x/weights.safetensors is truncated"
    )
    assert (
        scrub(f"'{tmp_path}/home/models/m' and {Path.home()}/x.")
        == "'<tempering home>/models/m' and <home>/x."
    )
    assert "<data dir>" not in scrub(f"{data}-other")  # a root ends at a path separator
    assert scrub("'tempering://r/weights/x' is missing") == "'tinker://r/weights/x' is missing"


# ---- fuzz: every route, malformed, oversized, truncated, slow, unauthenticated ----------------


def _routes(tmp: Path) -> list[tuple[str, str]]:
    """Every (method, path) of the app, path parameters filled in (so a new route is covered)."""
    engine = Engine(tmp, device="cpu", dtype="float32")
    try:
        app = build_app(engine, API_KEY)
    finally:
        engine.close()
    out: list[tuple[str, str]] = []
    for route in app.routes:
        assert isinstance(route, Route)
        path = route.path.replace("{kind}", "weights")
        path = re.sub(r"\{[a-z_]+\}", "fuzz", path)
        out += [(method, path) for method in sorted(route.methods or ()) if method != "HEAD"]
    return out


_BODIES: list[bytes] = [
    b'{"model_id": ',  # malformed JSON
    b"\xff\xfe not utf-8",
    b"[1, 2]",
    b'"a string"',
    b"3.5",
    json.dumps(
        {
            "session_id": 5,
            "model_id": [],
            "seq_id": "x",
            "request_id": {},
            "tinker_path": 7,
            "ttl_seconds": "x",
            "base_model": None,
            "path": ["tinker://x"],
            "prompt": "p",
            "num_samples": -1,
            "source_path": 1,
        }
    ).encode(),
    b"[" * 5000 + b"]" * 5000,
]


@pytest.mark.timeout(120)
def test_fuzz_every_route(server: ServerProcess, root: Path) -> None:
    """Every route gets malformed and wrongly typed bodies, no key and a wrong key, an oversized
    body, a truncated body and a stalled body: never a 5xx, never a server path or a traceback
    in an answer, no traceback in the log, and the server stays healthy."""
    routes = _routes(root / "routes")
    assert len(routes) >= 30
    answers: list[tuple[str, int | None, bytes]] = []

    def record(label: str, raw: bytes) -> None:
        answers.append((label, status_of(raw), raw))

    for method, path in routes:
        public = path.startswith("/api/v1/files/")
        for key in (None, "tml-wrong"):
            _, raw, _ = raw_exchange(server, head(method, path, 0, key=key))
            record(f"{method} {path} key={key}", raw)
            expected = 403 if public else 401
            assert status_of(raw) == expected, (method, path, raw)
        for body in _BODIES:
            _, raw, _ = raw_exchange(server, head(method, path, len(body)) + body)
            record(f"{method} {path} body={body[:20]!r}", raw)
        # oversized: the length alone is refused, without reading the body
        _, raw, _ = raw_exchange(server, head(method, path, LIMIT_BYTES + 1), wait=READ_TIMEOUT_S + 3)
        record(f"{method} {path} oversized", raw)
        # truncated: the client stops writing half way (a dropped connection)
        with socket.create_connection(("127.0.0.1", port_of(server))) as sock:
            sock.sendall(head(method, path, 64) + b'{"session_id": ')
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(5)
            raw = b""
            try:
                while chunk := sock.recv(65536):
                    raw += chunk
            except (TimeoutError, ConnectionResetError):
                pass
            record(f"{method} {path} truncated", raw)

    # slow: every route stalls mid-body at once; each gets its 408 after the timeout
    stalled: dict[str, tuple[float, bytes, bool]] = {}

    def stall(method: str, path: str) -> None:
        stalled[f"{method} {path}"] = raw_exchange(
            server, head(method, path, 64) + b'{"a', wait=READ_TIMEOUT_S + 5
        )

    threads = [threading.Thread(target=stall, args=route) for route in routes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for label, (seconds, raw, closed) in stalled.items():
        record(f"{label} slow", raw)
        assert closed, (label, seconds, raw)
        assert seconds < READ_TIMEOUT_S + 4, (label, seconds, raw)

    for label, status, raw in answers:
        assert status is None or status < 500, (label, raw)
        assert b"Traceback" not in raw, (label, raw)
        if status is not None and status >= 400:  # a listing may name a base model directory a client chose
            for private in server_paths(server):
                assert private.encode() not in raw, (label, raw)
    statuses = {status for _, status, _ in answers}
    assert {400, 401, 408, 413} <= statuses, statuses
    healthy = httpx.get(f"{server.url}/api/v1/healthz", headers=KEY, timeout=10)
    assert healthy.status_code == 200
    log = log_text(server)
    assert "Traceback" not in log, log[-3000:]


# ---- one server per data dir -------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_second_server_on_the_same_data_dir_is_refused(
    server: ServerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: a second ``tempering serve --data-dir D`` started and wrote the same checkpoint
    store as the first. Now it exits 2 before serving, naming the first server's pid."""
    assert server.pid is not None
    before = sorted(p.name for p in server.data_dir.iterdir())
    argv = ["serve", "--port", "0", "--api-key", API_KEY, "--data-dir", str(server.data_dir)]
    code = run_cli(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"data directory {server.data_dir} is in use by pid {server.pid} on host" in err
    assert "Traceback" not in err
    assert sorted(p.name for p in server.data_dir.iterdir()) == before

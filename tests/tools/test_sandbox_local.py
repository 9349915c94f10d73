"""The local sandbox: what it runs, and the issue's fault list, each stopped with a reason.

Every attack runs against a real :class:`LocalSandbox` on this machine, with small limits so a
fork bomb or a runaway loop costs little. Protections that need root (a pids cgroup, a mount
namespace, an own uid) are asserted where the test runs as root, as it does here.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tempering.tools.sandbox import ISOLATION_STEPS, LocalSandbox, SandboxResult
from tempering.tools.sandbox._limits import ISSUED_UIDS, live_pids_of
from tempering_protocols.testing import check_sandbox

IS_ROOT = os.geteuid() == 0
SMALL = LocalSandbox(
    wall_seconds=10, cpu_seconds=2, memory_bytes=512 << 20, max_processes=8, max_output_bytes=1 << 16
)


def _run(code: str, sandbox: LocalSandbox = SMALL, **kwargs: object) -> SandboxResult:
    return asyncio.run(sandbox.run(["python3", "-c", textwrap.dedent(code)], **kwargs))  # pyright: ignore[reportArgumentType]


def _sandbox_processes(uids: set[int] | None = None) -> list[int]:
    """Live processes under ``uids`` (default: every uid this process gave a sandbox; none may
    outlive a run; sandboxes of other processes on the machine are not ours to judge)."""
    return live_pids_of(set(ISSUED_UIDS) if uids is None else uids)


def _leftover_cgroups() -> list[str]:
    root = Path("/sys/fs/cgroup/pids")
    return [p.name for p in root.glob(f"tempering-sandbox-{os.getpid()}-*")] if root.is_dir() else []


@pytest.fixture(autouse=True)
def _nothing_left_behind() -> Iterator[None]:
    yield
    assert _sandbox_processes() == []
    assert _leftover_cgroups() == []


@pytest.mark.timeout(60)
def test_runs_files_stdin_and_reports_exit_code() -> None:
    sandbox = LocalSandbox(wall_seconds=10)
    result = asyncio.run(
        sandbox.run(
            ["python3", "main.py", "arg"],
            files={
                "main.py": "import sys\nprint(open('data/n.txt').read().strip(), input(), sys.argv[1])\n",
                "data/n.txt": "41",
            },
            stdin="hello\n",
        )
    )
    assert result.status == "ok"
    assert result.ok
    assert result.exit_code == 0
    assert result.stdout == "41 hello arg\n"
    assert result.wall_seconds > 0
    failing = _run("import sys; print('bye'); sys.exit(3)")
    assert (failing.status, failing.exit_code, failing.stdout) == ("error", 3, "bye\n")
    assert "code 3" in failing.reason


@pytest.mark.timeout(60)
def test_bad_arguments_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="relative path"):
        asyncio.run(SMALL.run(["true"], files={"../x": "no"}))
    with pytest.raises(ValueError, match="command is empty"):
        asyncio.run(SMALL.run([]))
    with pytest.raises(ValueError, match="unknown protections"):
        LocalSandbox(require=("magic",))
    missing = asyncio.run(SMALL.run(["no-such-program-here"]))
    assert missing.status == "error"
    assert "cannot run" in missing.stderr


@pytest.mark.skipif(not IS_ROOT, reason="the pids cgroup, mount namespace and own uid need root")
@pytest.mark.timeout(60)
def test_every_protection_holds_here() -> None:
    result = _run("print('hi')", LocalSandbox(require=ISOLATION_STEPS))
    assert result.status == "ok", result.reason
    assert set(result.isolation) == set(ISOLATION_STEPS)


@pytest.mark.timeout(60)
def test_fork_bomb_is_stopped_at_the_process_limit() -> None:
    result = _run(
        """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
        """,
        LocalSandbox(wall_seconds=3, cpu_seconds=2, max_processes=8),
    )
    assert not result.ok
    assert result.status == "process_limit", (result.status, result.reason)
    assert "8 processes" in result.reason


@pytest.mark.timeout(60)
def test_infinite_loop_is_stopped_by_the_cpu_limit() -> None:
    result = _run("while True:\n    pass\n", LocalSandbox(wall_seconds=20, cpu_seconds=1))
    assert result.status == "cpu_limit", (result.status, result.reason)
    assert result.exit_code is None


@pytest.mark.timeout(60)
def test_sleeping_forever_is_stopped_by_the_wall_limit() -> None:
    result = _run("import time\ntime.sleep(600)\n", LocalSandbox(wall_seconds=1))
    assert result.status == "timeout"
    assert "wall-time limit of 1 s" in result.reason


@pytest.mark.timeout(60)
def test_allocating_10_gb_fails_with_memory_limit() -> None:
    # RLIMIT_AS refuses the mapping up front: the 10 GB are never touched
    result = _run("x = bytearray(10 * 1024**3)\nprint('allocated', len(x))\n")
    assert result.status == "memory_limit", (result.status, result.reason)
    assert "allocated" not in result.stdout
    assert "MemoryError" in result.stderr


@pytest.mark.timeout(60)
def test_writing_outside_its_directory_fails(tmp_path: Path) -> None:
    targets = [
        tmp_path / "escaped.txt",
        Path("/tmp") / f"escaped-{secrets.token_hex(4)}",
        Path.cwd() / "escaped.txt",
    ]
    code = f"""
        import sys
        wrote = []
        for path in {[str(t) for t in targets]!r}:
            try:
                with open(path, "w") as f:
                    f.write("escaped")
                wrote.append(path)
            except OSError as e:
                print(path, e, file=sys.stderr)
        open("inside.txt", "w").write("fine")
        sys.exit(3 if wrote else 1)
        """
    result = _run(code)
    assert (result.status, result.exit_code) == ("error", 1), result.stderr
    assert not any(t.exists() for t in targets)


@pytest.mark.timeout(60)
def test_the_callers_environment_is_not_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = secrets.token_hex(16)
    monkeypatch.setenv("TEMPERING_TEST_SECRET", secret)
    code = """
        import os, sys
        seen = dict(os.environ)
        for pid in [os.getppid(), 1] + [int(p) for p in os.listdir("/proc") if p.isdigit()]:
            try:
                seen[f"proc{pid}"] = open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace")
            except OSError:
                pass
        print(seen)
        sys.exit(0 if any("TEMPERING_TEST_SECRET" in v or "TEMPERING_TEST_SECRET" == k
                          for k, v in seen.items()) else 1)
        """
    result = _run(code)
    assert secret not in result.stdout
    assert secret not in result.stderr
    assert result.status == "error"
    assert result.exit_code == 1
    assert "TEMPERING_TEST_SECRET" not in result.stdout


@pytest.mark.timeout(60)
def test_no_network_not_even_the_hosts_loopback() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        code = f"""
            import socket, sys
            reached = []
            for address in [("127.0.0.1", {port}), ("1.1.1.1", 53)]:
                try:
                    socket.create_connection(address, timeout=2).close()
                    reached.append(address)
                except OSError as e:
                    print(address, e, file=sys.stderr)
            sys.exit(3 if reached else 1)
            """
        result = _run(code)
    assert (result.status, result.exit_code) == ("error", 1), result.stderr
    assert "unreachable" in result.stderr or "refused" in result.stderr


@pytest.mark.timeout(60)
def test_printing_1_gb_is_cut_at_the_output_cap() -> None:
    result = _run(
        "import sys\nchunk = b'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.buffer.write(chunk)\n"
    )
    assert result.status == "output_limit", (result.status, result.reason)
    assert len(result.stdout) <= SMALL.max_output_bytes
    assert "stdout" in result.reason


@pytest.mark.timeout(60)
def test_a_huge_file_is_stopped_by_the_file_size_limit() -> None:
    code = "with open('big', 'wb') as f:\n    for _ in range(64):\n        f.write(b'x' * (1 << 20))\n"
    result = _run(code, LocalSandbox(max_file_bytes=1 << 20))
    assert result.status == "file_size_limit", (result.status, result.reason)


@pytest.mark.timeout(60)
def test_cancelling_kills_everything_and_removes_the_directory(tmp_path: Path) -> None:
    sandbox = LocalSandbox(wall_seconds=60, base_dir=str(tmp_path))
    code = "import subprocess, time\nsubprocess.Popen(['sleep', '300'])\ntime.sleep(300)\n"

    async def scenario() -> None:
        issued_before = len(ISSUED_UIDS)
        task = asyncio.ensure_future(sandbox.run(["python3", "-c", code]))
        for _ in range(400):
            await asyncio.sleep(0.05)
            ours = set(list(ISSUED_UIDS)[issued_before:])
            if len(_sandbox_processes(ours)) >= 2 or (not IS_ROOT and list(tmp_path.iterdir())):
                break
        assert list(tmp_path.iterdir()), "the sandbox never started"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert list(tmp_path.iterdir()) == []
    # the fixture checks that no sandbox process and no cgroup is left


@pytest.mark.timeout(60)
def test_the_run_goes_on_after_every_fault() -> None:
    async def batch() -> list[SandboxResult]:
        return list(
            await asyncio.gather(
                SMALL.run(["python3", "-c", "while True: pass"], timeout=3),
                SMALL.run(["python3", "-c", "x = bytearray(10 * 1024**3)"]),
                SMALL.run(["python3", "-c", "print(sum(range(10)))"]),
            )
        )

    loop, memory, fine = asyncio.run(batch())
    assert loop.status in ("cpu_limit", "timeout"), loop
    assert memory.status == "memory_limit", memory
    assert (fine.status, fine.stdout) == ("ok", "45\n"), fine


@pytest.mark.timeout(60)
def test_passes_the_conformance_kit() -> None:
    check_sandbox(LocalSandbox(wall_seconds=10))

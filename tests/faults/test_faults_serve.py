"""Fault catalogue, ``tempering serve`` (issue 15, bugs 1-4 and the idle-session leak of 12): the
official ``tinker`` SDK against a server subprocess on loopback, as a new user would drive it.

Each case pins what the user sees: the error's type, that its message names the flag, path or
argument at fault, that nothing already written is lost, and that nothing waits out a timeout.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tinker
from safetensors.numpy import load_file

from tempering.cli import main as cli_main
from tempering.local.tiny import build_tiny_model
from tempering.serve import build_app
from tempering.serve.engine import GAP_TIMEOUT_S, Engine
from tempering.serve.testing import API_KEY, ServerProcess, collect_sdk_garbage

pytestmark = pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning")  # the SDK's leak (tests/serve)

TEXT = "the quick brown fox jumps over the lazy dog"
ERROR_DEADLINE_S = 15.0
"""A user's mistake must surface this fast (the SDK would retry a 5xx, 408, 409 or 429 for minutes)."""


# ---- fixtures: one server for the module, a second one with a short session TTL ---------------


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("faults-serve")


@pytest.fixture(scope="module")
def tiny_dir(root: Path) -> Path:
    return build_tiny_model(root / "tiny")


@pytest.fixture(scope="module")
def server(root: Path, tiny_dir: Path) -> Iterator[ServerProcess]:
    del tiny_dir
    process = ServerProcess(root / "data", root / "home")
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def service(server: ServerProcess) -> Iterator[tinker.ServiceClient]:
    client = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
    yield client
    client.close("success").result(timeout=30)


@pytest.fixture(scope="module", autouse=True)
def _collect_sdk_garbage() -> Iterator[None]:
    yield
    collect_sdk_garbage()


def sft_datum(tokens: Sequence[int]) -> tinker.Datum:
    tokens = list(tokens)
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )


DATA = [sft_datum(TEXT.encode()), sft_datum(TEXT.encode()[:20])]
ADAM = tinker.AdamParams(learning_rate=1e-2)


def checkpoint_weights(server: ServerProcess, tinker_path: str) -> dict[str, np.ndarray]:
    """The tensors of a checkpoint the server wrote (``tinker://<run>/<kind>/<name>``)."""
    run, kind, name = tinker_path.removeprefix("tinker://").split("/")
    return load_file(str(server.data_dir / "checkpoints" / run / kind / name / "weights.safetensors"))


# ---- 1: the same seed gives the same adapter, however many clients start at once ---------------


def _train(trainer: tinker.TrainingClient, steps: int) -> list[float]:
    losses: list[float] = []
    for _ in range(steps):
        fb = trainer.forward_backward(DATA, "cross_entropy")
        trainer.optim_step(ADAM).result(timeout=120)
        losses.append(fb.result(timeout=120).metrics["loss:sum"])
    return losses


_SEED_CLIENT = """
import json, sys
import tinker
svc = tinker.ServiceClient(base_url=sys.argv[1], api_key=sys.argv[2])
tokens = list({text!r}.encode())
data = [
    tinker.Datum(
        model_input=tinker.ModelInput.from_ints(t[:-1]),
        loss_fn_inputs={{"target_tokens": t[1:], "weights": [1.0] * (len(t) - 1)}},
    )
    for t in (tokens, tokens[:20])
]
print("ready", flush=True)
sys.stdin.readline()  # "go": every client creates its model at the same moment
trainer = svc.create_lora_training_client(sys.argv[3], rank=4, seed=0).result(timeout=180)
path = trainer.save_state("init").result(timeout=60).path
losses = []
for _ in range({steps}):
    fb = trainer.forward_backward(data, "cross_entropy")
    trainer.optim_step(tinker.AdamParams(learning_rate=1e-2)).result(timeout=120)
    losses.append(fb.result(timeout=120).metrics["loss:sum"])
print(json.dumps({{"path": path, "losses": losses}}), flush=True)
svc.close("success").result(timeout=30)
"""


@pytest.mark.timeout(400)
def test_seed_reproducible_under_concurrent_clients(server: ServerProcess, root: Path) -> None:
    """Bug 1: ``create_lora_training_client(DIR, rank=4, seed=0)`` from several SDK processes at
    the same moment gave different initial LoRA weights (a process-global ``torch.manual_seed``
    on the server's worker threads); each must equal the adapter a client alone gets, and train
    to the same losses."""
    steps, clients = 3, 6
    model_dir = str(build_tiny_model(root / "tiny-seed"))  # new to the server: all wait for its load
    script = _SEED_CLIENT.format(text=TEXT, steps=steps)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, server.url, API_KEY, model_dir],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for _ in range(clients)
    ]
    results: list[dict[str, Any]] = []
    try:
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        for proc in procs:
            out, _ = proc.communicate(timeout=300)
            assert proc.returncode == 0
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)

    # One client alone, afterwards: the reference.
    alone_service = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
    try:
        alone = alone_service.create_lora_training_client(model_dir, rank=4, seed=0).result(timeout=120)
        reference = checkpoint_weights(server, alone.save_state("init").result(timeout=60).path)
        reference_losses = _train(alone, steps)
    finally:
        alone_service.close("success").result(timeout=30)
    assert any("lora_A" in k for k in reference)
    assert all(np.abs(v).sum() > 0 for k, v in reference.items() if "lora_A" in k)
    differing: list[int] = []
    for i, result in enumerate(results):
        weights = checkpoint_weights(server, result["path"])
        if weights.keys() != reference.keys() or any(
            not np.array_equal(weights[k], reference[k]) for k in reference
        ):
            differing.append(i)
    assert not differing, f"clients {differing} of {clients} got another initial adapter than one alone"
    assert [r["losses"] for r in results] == [reference_losses] * clients


# ---- 2: a refused request does not stall the next one ------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:DEPRECATED. TrainingClient.load_state:FutureWarning")
def test_refused_request_does_not_stall_the_next(service: tinker.ServiceClient, tiny_dir: Path) -> None:
    """Bug 2: a 4xx (``load_state`` of a missing path) left its ``seq_id`` unused, so the
    client's next request waited out the server's 10 s gap timeout."""
    trainer = service.create_lora_training_client(str(tiny_dir), rank=4).result(timeout=120)
    before = trainer.forward(DATA, "cross_entropy").result(timeout=60).metrics["loss:sum"]

    missing = "tinker://run-nope/weights/never-saved"
    start = time.monotonic()
    with pytest.raises(tinker.NotFoundError, match="run-nope/weights/never-saved"):
        trainer.load_state(missing).result(timeout=30)
    with pytest.raises(tinker.BadRequestError, match="/no/such/checkpoint"):
        trainer.load_state("/no/such/checkpoint").result(timeout=30)
    assert time.monotonic() - start < ERROR_DEADLINE_S

    start = time.monotonic()
    after = trainer.forward(DATA, "cross_entropy").result(timeout=60).metrics["loss:sum"]
    elapsed = time.monotonic() - start
    assert elapsed < GAP_TIMEOUT_S / 2, f"the request after a refusal took {elapsed:.1f} s"
    assert after == before  # the refusals changed nothing
    start = time.monotonic()
    assert _train(trainer, 1)[0] == pytest.approx(before)
    assert time.monotonic() - start < GAP_TIMEOUT_S / 2


# ---- 3: an API key that cannot protect the server is refused at startup ----------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("key", "says"),
    [("", "is empty"), ("   ", "is empty"), ("secret", "'tml-'"), ("tml-", "'tml-'")],
)
def test_api_key_refused_at_startup(
    key: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bug 3: ``--api-key ""`` turned authentication off (any client got in). An empty key, or
    one the SDK would not send, is refused before the server binds or writes anything."""
    data_dir = tmp_path / "data"
    argv = ["serve", "--host", "127.0.0.1", "--port", "0", "--api-key", key, "--data-dir", str(data_dir)]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert "--api-key" in err
    assert says in err
    assert "listening" not in err
    assert not data_dir.exists()


def test_build_app_refuses_an_empty_key(tmp_path: Path) -> None:
    engine = Engine(tmp_path, device="cpu", dtype="float32")
    try:
        with pytest.raises(ValueError, match="api_key is empty"):
            build_app(engine, "")
    finally:
        engine.close()


# ---- 4: save_state never replaces a checkpoint unless asked ---------------------------------


@pytest.mark.timeout(120)
def test_save_state_twice_keeps_the_first(
    server: ServerProcess, service: tinker.ServiceClient, tiny_dir: Path
) -> None:
    """Bug 4: ``save_state(name)`` twice silently replaced the first checkpoint
    (``overwrite=False`` ignored). The second save now fails at once with a user error naming
    the checkpoint and ``overwrite=True``; the first checkpoint is intact and still loads."""
    trainer = service.create_lora_training_client(str(tiny_dir), rank=4).result(timeout=120)
    _train(trainer, 1)
    first = trainer.save_state("ckpt").result(timeout=60).path
    saved = checkpoint_weights(server, first)
    _train(trainer, 1)  # the weights move on

    start = time.monotonic()
    with pytest.raises(tinker.RequestFailedError, match=r"'ckpt'.*overwrite=True") as info:
        trainer.save_state("ckpt").result(timeout=60)
    assert info.value.category == tinker.types.RequestErrorCategory.User
    assert "CheckpointExistsError" in str(info.value)
    # Two saves of one new name queued back to back: the second is refused as well.
    a, b = trainer.save_state("twice"), trainer.save_state("twice")
    a.result(timeout=60)
    with pytest.raises(tinker.RequestFailedError, match="'twice'"):
        b.result(timeout=60)
    assert time.monotonic() - start < ERROR_DEADLINE_S

    kept = checkpoint_weights(server, first)
    assert kept.keys() == saved.keys()
    for name, value in saved.items():
        np.testing.assert_array_equal(kept[name], value, err_msg=name)
    # The kept checkpoint still loads, into a fresh client.
    restored = service.create_training_client_from_state(first).result(timeout=120)
    assert restored.forward(DATA, "cross_entropy").result(timeout=60).metrics["loss:sum"] > 0

    # Asked for, the overwrite happens.
    replaced = trainer.save_state("ckpt", overwrite=True).result(timeout=60).path
    assert replaced == first
    now = checkpoint_weights(server, first)
    assert any(not np.array_equal(now[k], saved[k]) for k in saved)


# ---- 12 (last bullet): an SDK client that exits without close() does not leak its session -----


@pytest.mark.timeout(180)
def test_idle_sessions_expire(root: Path, tiny_dir: Path) -> None:
    """Issue 15, 12: SDK clients that exit without ``close()`` leaked their session's threads and
    memory. A session that sends nothing (not even the SDK's heartbeat) for ``--session-ttl-s``
    expires: its models are released, the log names it, and a late request is told why."""
    ttl = 2.0
    server = ServerProcess(root / "ttl-data", root / "ttl-home", "--session-ttl-s", str(ttl))
    server.start()
    try:
        assert any("--session-ttl-s 2 is short" in line for line in server.log)
        headers = {"X-API-Key": API_KEY}
        with httpx.Client(base_url=server.url, headers=headers, timeout=30) as http:

            def counts() -> dict[str, int]:
                r = http.get("/api/v1/healthz")
                r.raise_for_status()
                return {k: v for k, v in r.json().items() if k != "status"}

            assert counts() == {
                "sessions": 0,
                "training_models": 0,
                "samplers": 0,
                "sampler_weights": 0,
                "resident_sampler_weights": 0,
                "sampler_decode_copies": 0,
            }
            script = textwrap.dedent(
                f"""
                import tinker
                svc = tinker.ServiceClient(base_url={server.url!r}, api_key={API_KEY!r})
                t = svc.create_lora_training_client({str(tiny_dir)!r}, rank=2).result(timeout=120)
                t.save_state("kept").result(timeout=60)
                print("trained", flush=True)
                # exits without svc.close()
                """
            )
            done = subprocess.run(
                [sys.executable, "-c", script], capture_output=True, text=True, timeout=150, check=False
            )
            assert done.returncode == 0, done.stderr[-2000:]
            assert done.stdout.split() == ["trained"]

            deadline = time.monotonic() + 30
            while counts()["training_models"] and time.monotonic() < deadline:
                time.sleep(0.2)
            assert counts() == {
                "sessions": 0,
                "training_models": 0,
                "samplers": 0,
                "sampler_weights": 0,
                "resident_sampler_weights": 0,
                "sampler_decode_copies": 0,
            }
            expired = [line for line in server.log if "expired after" in line]
            assert expired, "".join(server.log[-20:])
            assert "--session-ttl-s 2" in expired[0]
            assert "released 1 training model(s)" in expired[0]
            # What the client wrote is kept.
            assert list((root / "ttl-data" / "checkpoints").glob("*/weights/kept/weights.safetensors"))

            # A client that is alive but idle past the TTL is told why its model is gone.
            service = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
            trainer = service.create_lora_training_client(str(tiny_dir), rank=2).result(timeout=120)
            deadline = time.monotonic() + 30
            while counts()["training_models"] and time.monotonic() < deadline:
                time.sleep(0.2)
            with pytest.raises(tinker.APIStatusError, match="--session-ttl-s") as info:
                trainer.forward(DATA, "cross_entropy").result(timeout=30)
            assert info.value.status_code == 410
            service.close("success").result(timeout=30)
    finally:
        server.stop()

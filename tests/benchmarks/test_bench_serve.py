"""The wire path's overhead: the same SFT step through the official SDK and ``tempering serve``
and through the in-process engine (group ``serve-sft-step``).

One step = ``forward_backward`` (8 datums x 64 tokens, cross-entropy) with ``optim_step``
queued right behind it, then both awaited: what a training loop does. Both sides train a LoRA
of rank 8 on the tiny model, float32 on the CPU, one torch thread (the server in a subprocess,
the in-process engine here). Run with ``make bench``; under plain pytest each runs once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import tinker
from pytest_benchmark.fixture import BenchmarkFixture

from tempering.local import ServiceClient as LocalService
from tempering.local.tiny import build_tiny_model
from tempering.serve.testing import API_KEY, ServerProcess, collect_sdk_garbage

pytestmark = pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning")  # tinker 0.38 leaks a pool

BATCH, LENGTH, RANK = 8, 64, 8
ADAM = tinker.AdamParams(learning_rate=1e-4)


def _data() -> list[tinker.Datum]:
    out: list[tinker.Datum] = []
    for d in range(BATCH):
        tokens = [(7 * d + 3 * t) % 256 for t in range(LENGTH + 1)]
        out.append(
            tinker.Datum(
                model_input=tinker.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * LENGTH},
            )
        )
    return out


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bench-serve")


@pytest.fixture(scope="module")
def tiny_dir(root: Path) -> Path:
    return build_tiny_model(root / "tiny")


@pytest.fixture(scope="module")
def wire_trainer(root: Path, tiny_dir: Path) -> Iterator[tinker.TrainingClient]:
    server = ServerProcess(root / "data", root / "home").start()
    try:
        service = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
        yield service.create_lora_training_client(str(tiny_dir), rank=RANK).result(timeout=120)
        service.close("success").result(timeout=30)
    finally:
        server.stop()
        collect_sdk_garbage()


@pytest.fixture(scope="module")
def local_trainer(root: Path, tiny_dir: Path) -> Iterator[tinker.TrainingClient]:
    with LocalService(root=root / "local", device="cpu", dtype="float32", num_threads=1) as service:
        client = service.create_lora_training_client(str(tiny_dir), rank=RANK).result()
        yield client  # pyright: ignore[reportReturnType]
        client.close()


def _step(client: tinker.TrainingClient, data: list[tinker.Datum]) -> float:
    fb = client.forward_backward(data, "cross_entropy")
    opt = client.optim_step(ADAM)
    loss = fb.result().metrics["loss:sum"]
    opt.result()
    return loss


@pytest.mark.benchmark(group="serve-sft-step")
def test_sft_step_in_process(benchmark: BenchmarkFixture, local_trainer: tinker.TrainingClient) -> None:
    data = _data()
    _step(local_trainer, data)  # warm-up
    loss = benchmark.pedantic(_step, args=(local_trainer, data), rounds=20, iterations=1)
    benchmark.extra_info["tokens"] = BATCH * LENGTH
    assert loss > 0


@pytest.mark.benchmark(group="serve-sft-step")
def test_sft_step_sdk_and_server(benchmark: BenchmarkFixture, wire_trainer: tinker.TrainingClient) -> None:
    data = _data()
    _step(wire_trainer, data)  # warm-up
    loss = benchmark.pedantic(_step, args=(wire_trainer, data), rounds=20, iterations=1)
    benchmark.extra_info["tokens"] = BATCH * LENGTH
    assert loss > 0

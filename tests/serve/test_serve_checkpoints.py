"""Checkpoints on ``tempering serve`` through the official SDK's ``RestClient``: listing,
weights info, signed downloads, deletion; ``tempering export tinker://…`` (trained through the
SDK, exported to a Hugging Face directory whose logprobs equal the server's) and
``tempering checkpoints list|show|rm|prune --base-url``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tinker
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "local"))

from local_helpers import EXPORT_TOKENS, next_token_logprobs  # pyright: ignore[reportMissingImports]  # tests/local

from tempering.cli import main
from tempering.serve.testing import API_KEY, ServerProcess

pytestmark = pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning")  # the SDK's leak (conftest)

TOKENS = EXPORT_TOKENS


def _datum(tokens: list[int]) -> tinker.Datum:
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )


@pytest.fixture(scope="module")
def trained(service: tinker.ServiceClient, tiny_dir: Path) -> tuple[str, str, list[float]]:
    """Two real optimizer steps through the SDK; three save_state checkpoints; the server's own
    logprobs of TOKENS after training. Returns (run id, the last save_state path, logprobs)."""
    trainer = service.create_lora_training_client(str(tiny_dir), rank=4, seed=3).result(timeout=120)
    rng = np.random.default_rng(0)
    data = [_datum([int(t) for t in rng.integers(1, 250, size=10)]) for _ in range(4)]
    paths: list[str] = []
    for step in range(3):
        if step < 2:
            trainer.forward_backward(data, "cross_entropy").result(timeout=60)
            trainer.optim_step(tinker.AdamParams(learning_rate=1e-2)).result(timeout=60)
        paths.append(trainer.save_state(f"step-{step}").result(timeout=60).path)
    sampler_path = trainer.save_weights_for_sampler("sampler-final").result(timeout=60).path
    sampler = service.create_sampling_client(model_path=sampler_path).result(timeout=60)
    logprobs = sampler.compute_logprobs(tinker.ModelInput.from_ints(TOKENS)).result(timeout=60)
    run_id = tinker.ParsedCheckpointTinkerPath.from_tinker_path(paths[-1]).training_run_id
    return run_id, paths[-1], [float(x) for x in logprobs[1:] if x is not None]


@pytest.fixture(scope="module")
def rest(server: ServerProcess) -> tinker.RestClient:
    return tinker.RestClient(base_url=server.url, api_key=API_KEY)


@pytest.fixture(scope="module")
def key(server: ServerProcess) -> tuple[str, ...]:
    """The CLI's flags that point it at the test server."""
    return ("--base-url", server.url, "--api-key", API_KEY)


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.timeout(300)
def test_rest_client_lists_and_describes_checkpoints(
    rest: tinker.RestClient, trained: tuple[str, str, list[float]], tiny_dir: Path
) -> None:
    run_id, path, _ = trained
    listed = rest.list_checkpoints(run_id).result(timeout=30).checkpoints
    by_path = {c.tinker_path: c for c in listed}
    assert {f"tinker://{run_id}/weights/step-{i}" for i in range(3)} <= set(by_path)
    assert by_path[path].checkpoint_type == "training"
    assert by_path[path].checkpoint_id == "weights/step-2"
    assert (by_path[path].size_bytes or 0) > 0
    assert f"tinker://{run_id}/sampler_weights/sampler-final" in by_path
    info = rest.get_weights_info_by_tinker_path(path).result(timeout=30)
    assert (info.base_model, info.is_lora, info.lora_rank) == (str(tiny_dir), True, 4)
    run = rest.get_training_run(run_id).result(timeout=30)
    assert run.lora_rank == 4
    assert run.last_checkpoint is not None
    assert run.last_checkpoint.tinker_path == path
    everything = rest.list_user_checkpoints(limit=2).result(timeout=30)
    assert len(everything.checkpoints) == 2
    assert everything.cursor is not None
    assert everything.cursor.total_count >= 4
    with pytest.raises(tinker.NotFoundError):
        rest.get_weights_info_by_tinker_path(f"tinker://{run_id}/weights/nope").result(timeout=30)


@pytest.mark.timeout(300)
@pytest.mark.filterwarnings(
    "ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"
)  # peft on transformers 5
def test_export_tinker_path_round_trips_through_transformers(
    key: tuple[str, ...],
    rest: tinker.RestClient,
    trained: tuple[str, str, list[float]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, path, engine = trained
    code, out, err = _cli(capsys, "export", path, str(tmp_path / "model"), *key)
    assert code == 0, err
    assert "Hugging Face model" in out
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.float32)
    model.eval()
    assert not any("lora" in name for name, _ in model.named_parameters())
    np.testing.assert_allclose(next_token_logprobs(model), engine, atol=1e-4)
    assert path in (tmp_path / "model" / "README.md").read_text()

    code, _, err = _cli(capsys, "export", path, str(tmp_path / "adapter"), "--adapter", *key)
    assert code == 0, err
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    base = AutoModelForCausalLM.from_pretrained(config["base_model_name_or_path"], dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, tmp_path / "adapter")
    peft_model.eval()
    np.testing.assert_allclose(next_token_logprobs(peft_model), engine, atol=1e-4)
    # The temporary external export on the server is gone again; nothing scratch is left here.
    types = {c.checkpoint_type for c in rest.list_user_checkpoints().result(timeout=30).checkpoints}
    assert "external" not in types
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter", "model"]


@pytest.mark.timeout(120)
def test_export_refusals_name_the_problem(
    server: ServerProcess,
    key: tuple[str, ...],
    trained: tuple[str, str, list[float]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run_id, _, _ = trained
    code, _, err = _cli(capsys, "export", f"tinker://{run_id}/weights/missing", str(tmp_path / "a"), *key)
    assert code == 2
    assert "missing" in err
    sampler = f"tinker://{run_id}/sampler_weights/sampler-final"
    code, _, err = _cli(capsys, "export", sampler, str(tmp_path / "b"), *key)
    assert code == 2
    assert "save_state" in err
    code, _, err = _cli(
        capsys,
        "export",
        f"tinker://{run_id}/weights/step-2",
        str(tmp_path / "c"),
        "--base-url",
        server.url,
        "--api-key",
        "tml-wrong",
    )
    assert code == 2
    assert "401" in err or "API key" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.timeout(300)
def test_signed_download_urls(
    service: tinker.ServiceClient, rest: tinker.RestClient, tiny_dir: Path, tmp_path: Path
) -> None:
    trainer = service.create_lora_training_client(str(tiny_dir), rank=2).result(timeout=120)
    export = trainer.save_weights_external("mine", ttl_seconds=7200).result(timeout=120).path
    assert export.endswith("/external_weights/mine")
    urls = rest.get_external_weights_urls(export).result(timeout=30).urls
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(urls)
    with urllib.request.urlopen(urls["adapter_config.json"], timeout=30) as answer:  # no API key
        assert json.loads(answer.read())["r"] == 2
    tampered = urls["adapter_config.json"].replace("adapter_config.json", "adapter_model.safetensors")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(tampered, timeout=30)
    assert info.value.code == 403
    listed = {c.tinker_path: c for c in rest.list_user_checkpoints().result(timeout=30).checkpoints}
    assert listed[export].checkpoint_type == "external"
    assert listed[export].expires_at is not None
    rest.delete_checkpoint_from_tinker_path(export).result(timeout=30)
    with pytest.raises(tinker.NotFoundError):
        rest.get_external_weights_urls(export).result(timeout=30)


@pytest.mark.timeout(300)
def test_checkpoints_cli_over_the_rest_client(
    key: tuple[str, ...], service: tinker.ServiceClient, tiny_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trainer = service.create_lora_training_client(str(tiny_dir), rank=2).result(timeout=120)
    paths = [trainer.save_state(f"step-{i}").result(timeout=60).path for i in range(3)]
    trainer.save_weights_for_sampler("sampler-final").result(timeout=60)
    path = paths[-1]
    run_id = tinker.ParsedCheckpointTinkerPath.from_tinker_path(path).training_run_id
    code, out, err = _cli(capsys, "checkpoints", "list", "--run", run_id, *key)
    assert code == 0, err
    for i in range(3):
        assert f"tinker://{run_id}/weights/step-{i}" in out
    assert "checkpoints, " in out
    assert key[1] in out  # the server's URL
    code, out, err = _cli(capsys, "checkpoints", "show", path, *key)
    assert code == 0, err
    shown = json.loads(out)
    assert (shown["lora_rank"], shown["checkpoint_type"]) == (2, "training")
    code, out, err = _cli(
        capsys, "checkpoints", "prune", "--run", run_id, "--keep-last", "2", "--dry-run", *key
    )
    assert code == 0, err
    assert f"would remove tinker://{run_id}/weights/step-0" in out
    assert "step-1" not in out
    assert "step-2" not in out
    code, out, err = _cli(capsys, "checkpoints", "prune", "--run", run_id, "--keep-last", "2", *key)
    assert code == 0, err
    code, out, _ = _cli(capsys, "checkpoints", "list", "--run", run_id, "--json", *key)
    paths = {json.loads(line)["path"] for line in out.splitlines()}
    assert f"tinker://{run_id}/weights/step-0" not in paths
    assert {f"tinker://{run_id}/weights/step-1", path} <= paths
    # the newest of the sampler checkpoints stays too
    assert f"tinker://{run_id}/sampler_weights/sampler-final" in paths
    code, out, err = _cli(capsys, "checkpoints", "rm", f"tinker://{run_id}/weights/step-1", *key)
    assert code == 0, err
    code, _, err = _cli(capsys, "checkpoints", "rm", f"tinker://{run_id}/weights/step-1", *key)
    assert code == 2
    assert "step-1" in err
    assert "404" in err


@pytest.mark.timeout(300)
def test_the_official_tinker_cli_downloads_from_the_server(
    server: ServerProcess, service: tinker.ServiceClient, tiny_dir: Path, tmp_path: Path
) -> None:
    """``tinker checkpoint download`` (the SDK's own CLI) against the server: it exports the
    checkpoint as external weights, fetches the signed URLs and deletes the export."""
    trainer = service.create_lora_training_client(str(tiny_dir), rank=2).result(timeout=120)
    path = trainer.save_state("for-the-cli").result(timeout=60).path
    env = {**os.environ, "TINKER_BASE_URL": server.url, "TINKER_API_KEY": API_KEY}
    proc = subprocess.run(
        [sys.executable, "-m", "tinker.cli", "checkpoint", "download", path, "--output", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (folder,) = tmp_path.iterdir()
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in folder.iterdir()}
    assert json.loads((folder / "adapter_config.json").read_text())["r"] == 2

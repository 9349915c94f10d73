"""Export: a local checkpoint out as a Hugging Face model or a PEFT adapter, checked by loading
it with transformers / peft alone and comparing logprobs with the engine's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tinker
import torch
from local_helpers import EXPORT_TOKENS, next_token_logprobs, random_tokens, reference_model, sft_datum
from peft import PeftModel
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from tempering.local import ServiceClient
from tempering.local.checkpoints import CheckpointStore
from tempering.local.errors import CheckpointNotFoundError, IncompatibleCheckpointError
from tempering.local.export import ExportError, export_checkpoint

TOKENS = EXPORT_TOKENS


def _train(service: ServiceClient, *, lora: bool, name: str) -> tuple[str, list[float]]:
    """A few real optimizer steps (so a LoRA's B is no longer zero); the save_state path and
    the engine's own logprobs of TOKENS after training."""
    if lora:
        client = service.create_lora_training_client("tempering/tiny", rank=4, seed=3).result()
    else:
        client = service.create_full_training_client("tempering/tiny").result()
    rng = np.random.default_rng(0)
    data = [sft_datum(random_tokens(rng, 10)) for _ in range(4)]
    for _ in range(3):
        client.forward_backward(data, "cross_entropy").result()
        client.optim_step(tinker.AdamParams(learning_rate=1e-2)).result()
    path = client.save_state(name).result().path
    sampler = client.save_weights_and_get_sampling_client(f"{name}-sampler")
    logprobs = sampler.compute_logprobs(tinker.ModelInput.from_ints(TOKENS)).result()
    return path, [float(x) for x in logprobs[1:] if x is not None]


@pytest.fixture(scope="module")
def lora_checkpoint(service: ServiceClient) -> tuple[str, list[float]]:
    return _train(service, lora=True, name="export-lora")


@pytest.mark.timeout(300)
def test_lora_checkpoint_exports_as_a_merged_hf_model(
    lora_checkpoint: tuple[str, list[float]], local_root: Path, tmp_path: Path
) -> None:
    path, engine = lora_checkpoint
    out = export_checkpoint(
        path, tmp_path / "model", store=CheckpointStore(local_root), run_config={"lr": 0.01}
    )
    assert out.kind == "model"
    assert {"config.json", "model.safetensors", "generation_config.json", "README.md"} <= set(out.files)
    model = reference_model(out.out_dir)
    assert not any("lora" in name for name, _ in model.named_parameters())
    np.testing.assert_allclose(next_token_logprobs(model), engine, atol=1e-4)
    tokenizer = AutoTokenizer.from_pretrained(out.out_dir)
    assert tokenizer.decode(tokenizer.encode("7+8=15")).strip().endswith("15")
    card = (out.out_dir / "README.md").read_text()
    assert path in card
    assert '"lr": 0.01' in card
    assert "LoRA rank 4" in card


@pytest.mark.timeout(300)
@pytest.mark.filterwarnings(
    "ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"
)  # peft on transformers 5
def test_lora_checkpoint_exports_as_a_peft_adapter(
    lora_checkpoint: tuple[str, list[float]], local_root: Path, tmp_path: Path
) -> None:
    path, engine = lora_checkpoint
    out = export_checkpoint(path, tmp_path / "adapter", adapter=True, store=CheckpointStore(local_root))
    assert out.kind == "adapter"
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(out.files)
    config = json.loads((out.out_dir / "adapter_config.json").read_text())
    assert Path(config["base_model_name_or_path"]) == out.base_model_dir
    base = AutoModelForCausalLM.from_pretrained(config["base_model_name_or_path"], dtype=torch.float32)
    model = PeftModel.from_pretrained(base, out.out_dir)
    model.eval()
    np.testing.assert_allclose(next_token_logprobs(model), engine, atol=1e-4)


@pytest.mark.timeout(300)
def test_full_fine_tune_exports_and_refuses_adapter(
    service: ServiceClient, local_root: Path, tmp_path: Path
) -> None:
    path, engine = _train(service, lora=False, name="export-full")
    out = export_checkpoint(path, tmp_path / "full", store=CheckpointStore(local_root))
    np.testing.assert_allclose(next_token_logprobs(reference_model(out.out_dir)), engine, atol=1e-4)
    with pytest.raises(ExportError, match="full fine-tune"):
        export_checkpoint(path, tmp_path / "nope", adapter=True, store=CheckpointStore(local_root))
    assert not (tmp_path / "nope").exists()


def test_refusals_name_the_problem_and_leave_nothing(
    lora_checkpoint: tuple[str, list[float]], local_root: Path, tmp_path: Path
) -> None:
    path, _ = lora_checkpoint
    store = CheckpointStore(local_root)
    with pytest.raises(CheckpointNotFoundError):
        export_checkpoint("tempering://run-nope/weights/missing", tmp_path / "a", store=store)
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match="not empty"):
        export_checkpoint(path, taken, store=store)
    assert (taken / "keep.txt").read_text() == "mine"
    # A truncated weights file: a named error, and no half-written output directory.
    broken = _copy_checkpoint(store.resolve(path), tmp_path / "broken-ckpt", truncate=True)
    with pytest.raises((IncompatibleCheckpointError, ValueError, OSError)) as info:
        export_checkpoint(str(broken), tmp_path / "b", store=store)
    assert "weights.safetensors" in str(info.value) or str(broken) in str(info.value)
    assert not (tmp_path / "b").exists()
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".b-export-")] == []


def _copy_checkpoint(source: Path, dest: Path, *, truncate: bool = False) -> Path:
    """A copy of a checkpoint directory; with ``truncate``, its weights file cut in half."""
    dest.mkdir()
    for f in source.iterdir():
        data = f.read_bytes()
        cut = truncate and f.name == "weights.safetensors"
        (dest / f.name).write_bytes(data[: len(data) // 2] if cut else data)
    return dest


def test_a_checkpoint_of_another_base_model_is_refused(
    lora_checkpoint: tuple[str, list[float]], local_root: Path, tiny_dir: Path, tmp_path: Path
) -> None:
    """The checkpoint's meta names a base model whose shapes differ (hidden 64, not the tiny
    model's 128): a named error that says which weight and which model, and no OUT_DIR."""
    path, _ = lora_checkpoint
    other = tmp_path / "other-base"
    config = AutoConfig.from_pretrained(tiny_dir)
    config.hidden_size, config.intermediate_size = 64, 128
    AutoModelForCausalLM.from_config(config).save_pretrained(other)
    AutoTokenizer.from_pretrained(tiny_dir).save_pretrained(other)
    moved = _copy_checkpoint(CheckpointStore(local_root).resolve(path), tmp_path / "moved")
    meta = json.loads((moved / "meta.json").read_text())
    (moved / "meta.json").write_text(json.dumps({**meta, "base_model": str(other)}))
    with pytest.raises(IncompatibleCheckpointError, match=r"has shape .* the base model .*other-base"):
        export_checkpoint(str(moved), tmp_path / "out", store=CheckpointStore(local_root))
    assert not (tmp_path / "out").exists()

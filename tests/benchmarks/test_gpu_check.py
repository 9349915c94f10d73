"""The GPU check (``tests/benchmarks/gpu_check.py``, ``make gpu-check``) run on the CPU at its
``--quick`` sizes, on the built-in tiny model and on a tiny random Qwen3 (the builder the GPU run
uses for its Qwen3-0.6B-shaped model): every figure is there, finite and positive, and the
float32 sampler/trainer logprob gap is within the engine's parity contract; a model that cannot
load is recorded with its error and the next one still runs. Also the FLOP
arithmetic of ``engine_scale.ModelShape``, against a count by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import engine_scale as es
import gpu_check
import pytest

from tempering.local.tiny import tiny_config


def _positive(value: Any, what: str) -> None:
    assert isinstance(value, int | float), f"{what}: {value!r}"
    assert not isinstance(value, bool), f"{what}: {value!r}"
    assert math.isfinite(value), f"{what}: {value!r}"
    assert value > 0, f"{what}: {value!r}"


def test_quick_cpu_run_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "check.json"
    broken = tmp_path / "broken"  # a model that cannot load is recorded; the others still run
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "no-such-architecture"}')
    argv = ["--device", "cpu", "--quick", "--threads", "1", "--out", str(out)]
    gpu_check.main(
        [*argv, "--model", "tempering/tiny", "--model", str(broken), "--model", "qwen3-mini-random"]
    )
    results = json.loads(out.read_text())
    sizes = gpu_check.QUICK
    failed = results["models"].pop(1)
    assert failed["name"] == str(broken)
    assert "no-such-architecture" in failed["error"]

    assert results["machine"]["device"] == "cpu"
    assert results["dtype"] == "float32"
    assert set(results["matmul_peak_flops"]) == {"float32", "bfloat16"}
    for name, flops in results["matmul_peak_flops"].items():
        _positive(flops, f"matmul peak {name}")
    assert [m["name"] for m in results["models"]] == ["tempering/tiny", "qwen3-mini-random"]
    qwen = results["models"][1]
    assert qwen["shape"]["vocab"] == es.QWEN3_MINI["vocab_size"]
    assert qwen["shape"]["layers"] == es.QWEN3_MINI["num_hidden_layers"]

    for model in results["models"]:
        name = model["name"]
        assert [row["batch"] for row in model["sampling"]] == list(sizes.batches)
        for row in model["sampling"]:
            for side in ("engine", "generate"):
                got = row[side]
                assert "error" not in got, f"{name} {side}: {got.get('error')}"
                assert got["tokens"] == row["batch"] * sizes.new_tokens
                assert len(got["seconds"]) == sizes.rounds
                for key in ("tokens_per_s", "fraction_of_peak", "process_max_rss_bytes"):
                    _positive(got[key], f"{name} {side} {key}")
                assert got["peak_gpu_bytes"] is None  # CPU: no GPU peak, the RSS instead
            _positive(row["engine_over_generate"], f"{name} ratio")
            _positive(row["decode_flops_per_token"], f"{name} decode FLOPs")

        training = model["training"]
        assert "error" not in training, f"{name} training: {training.get('error')}"
        assert training["tokens"] == sizes.train_batch * sizes.train_seq_len
        for key in ("tokens_per_s", "mfu", "flops_per_token"):
            _positive(training[key], f"{name} training {key}")

        gaps = model["logprob_gap"]
        assert set(gaps) == {"float32", "bfloat16"}
        for dtype, gap in gaps.items():
            assert "error" not in gap, f"{name} gap {dtype}: {gap.get('error')}"
            assert gap["tokens"] == sizes.gap_prompts * sizes.gap_new_tokens
            assert 0 <= gap["mean_abs"] <= gap["max_abs"] < 1.0, (name, dtype, gap)
        # The parity contract: the sampler's float32 logprobs are the trainer's.
        assert gaps["float32"]["max_abs"] <= 1e-5, (name, gaps["float32"])


def test_unknown_model_is_named(tmp_path: Path) -> None:
    argv = ["--device", "cpu", "--quick", "--out", str(tmp_path / "x.json"), "--model", "no/such-model"]
    with pytest.raises(SystemExit, match=r"'no/such-model' is none of"):
        gpu_check.main(argv)


def test_flops_match_a_count_by_hand() -> None:
    from transformers import LlamaForCausalLM

    config = tiny_config()
    shape = es.ModelShape.of_model(LlamaForCausalLM(config))
    h, inter, layers, vocab = 128, 384, 4, 264
    kv = 2 * (h // 4)  # 2 KV heads of head_dim 32
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * inter + 2 * h  # q, o, k, v, MLP, two norms
    non_embedding = layers * per_layer + h  # and the final norm
    assert shape.non_embedding_params == non_embedding
    assert shape.params == non_embedding + 2 * vocab * h  # embedding and unembedding untied
    attention = 4 * layers * 4 * 32  # per position attended to
    assert shape.forward_flops(10) == 2 * (non_embedding + h * vocab) + attention * 10
    assert shape.decode_flops(32, 64) == shape.forward_flops(64)
    linear_in_out = layers * (2 * (h + h) + 2 * (h + kv) + 3 * (h + inter)) + (h + vocab)
    assert shape.lora_params_per_rank == linear_in_out
    assert shape.lora_train_flops(9, 8) == (
        4 * (non_embedding + h * vocab) + 3 * attention * 5 + 6 * 8 * linear_in_out
    )

"""SFT throughput against TRL (issue 27): LoRA SFT through tempering (the demo's SFT stage) and
through TRL's ``SFTTrainer`` with a PEFT adapter of the same rank, alpha and layers, the same
batch and the same conversations (the demo's arithmetic training split), float32 on the CPU with
the same torch threads, each side in its own process (tests/benchmarks/sft_peers.py says how each
is configured). Needs the ``bench`` extra (``trl``); skipped without it. Run on demand:

    BENCH_SFT_MODEL=HuggingFaceTB/SmolLM2-135M-Instruct \\
        .venv/bin/python -m pytest tests/benchmarks/test_bench_sft_peers.py --benchmark-enable -s

Full workload: the demo preset ``BENCH_SFT_MODEL`` names (:data:`tempering.recipes.demo.PRESETS`,
by preset name or base model; default the real model): its SFT stage's LoRA rank, batch, learning
rate and threads, ``BENCH_SFT_STEPS`` steps (default the preset's), of which the first
``BENCH_SFT_WARMUP`` (default 5) are not timed, on the first steps × batch conversations of the
training split (each seen once on both sides, in each side's own shuffled order). The adapter
covers every attention and MLP projection; unlike the demo's, not the unembedding, as TRL's
``SFTTrainer`` refuses an adapter on ``lm_head`` ("the log-probabilities are computed from
``lm_head.weight`` directly"). ``BENCH_SFT_ROUNDS`` rounds (default 2) run
interleaved ABBA (tempering, TRL, TRL, tempering, ...) so that both sides meet the same
background load. Prints each side's tokens/s and s/step (mean over the rounds, and each round's)
and the ratio; ``BENCH_SFT_PEERS_OUT`` (a file) keeps them with their JSON. Under plain pytest a
smoke run (tiny model, rank 4, 4 steps of 8, one untimed) checks that both sides train the same
sequences.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl", reason="the bench extra (pip install 'tempering[bench]') is not installed")

HERE = Path(__file__).resolve().parent


def _timing(request: pytest.FixtureRequest) -> bool:
    config = request.config
    return bool(config.getoption("benchmark_enable")) or not config.getoption("benchmark_disable")


def _preset(name: str) -> Any:
    from tempering.recipes.demo import PRESETS

    for key, sizes in PRESETS.items():
        if name in (key, sizes.base_model):
            return sizes
    choices = ", ".join(f"{k} ({v.base_model})" for k, v in PRESETS.items())
    raise ValueError(f"BENCH_SFT_MODEL={name!r} names no demo preset; use one of: {choices}")


def _settings(full: bool, out: Path) -> dict[str, Any]:
    env = os.environ.get
    z = _preset(env("BENCH_SFT_MODEL", "smollm2") if full else "tiny")
    steps = int(env("BENCH_SFT_STEPS", str(z.sft.steps))) if full else 4
    warmup = int(env("BENCH_SFT_WARMUP", "5")) if full else 1
    if not 0 <= warmup < steps:
        raise ValueError(f"BENCH_SFT_WARMUP={warmup} must be at least 0 and below BENCH_SFT_STEPS={steps}")
    return {
        "base_model": z.base_model,
        "lora_rank": (z.lora_rank or 32) if full else 4,  # the tiny preset is a full fine-tune
        "train_unembed": False,  # TRL refuses a LoRA on lm_head
        "threads": z.num_threads,
        "seed": 0,
        "n_test": z.n_test,
        "steps": steps,
        "warmup": warmup,
        "batch_size": z.sft.batch_size if full else 8,
        "lr": z.sft.learning_rate,
        "lr_warmup": steps // 10,
        "out": str(out),
        "rounds": int(env("BENCH_SFT_ROUNDS", "2")) if full else 1,
    }


def _side(side: str, s: dict[str, Any]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(HERE / "sft_peers.py"), side, json.dumps(s)],
        capture_output=True, text=True, timeout=3600, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise AssertionError(f"the {side} side failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _report(s: dict[str, Any], rounds: list[dict[str, dict[str, Any]]]) -> tuple[str, dict[str, Any]]:
    sides: dict[str, Any] = {}
    for name in ("tempering", "trl"):
        runs = [r[name] for r in rounds]
        sides[name] = {
            "tokens_per_s": statistics.fmean(r["tokens_per_s"] for r in runs),
            "step_s": statistics.fmean(r["step_s"] for r in runs),
            "tokens_per_seq": statistics.fmean(r["tokens_per_seq"] for r in runs),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
            "tokens_per_s_runs": [r["tokens_per_s"] for r in runs],
            "loss": [(r["loss_first"], r["loss_last"]) for r in runs],
        }
    per_round = [r["tempering"]["tokens_per_s"] / r["trl"]["tokens_per_s"] for r in rounds]
    ratio = sides["tempering"]["tokens_per_s"] / sides["trl"]["tokens_per_s"]
    lines = [
        f"SFT peers: {s['base_model']}, LoRA rank {s['lora_rank']}, {s['steps']} steps x {s['batch_size']} "
        f"conversations ({s['warmup']} untimed), {s['threads']} thread(s), load average {s['load']}"
    ]
    for name in ("tempering", "trl"):
        r = sides[name]
        runs = ", ".join(f"{x:.0f}" for x in r["tokens_per_s_runs"])
        losses = ", ".join(f"{a:.3f} -> {b:.3f}" for a, b in r["loss"])
        lines.append(
            f"  {name:9s} {r['tokens_per_s']:.0f} tokens/s (rounds: {runs}), {r['step_s']:.3f} s/step, "
            f"{r['tokens_per_seq']:.1f} tokens/sequence, peak RSS {r['peak_rss_mb']:.0f} MB, loss {losses}"
        )
    lines.append(
        f"  ratio (tempering tokens/s / TRL tokens/s, means): {ratio:.2f}x "
        f"(per round: {', '.join(f'{x:.2f}x' for x in per_round)})"
    )
    return "\n".join(lines), {"sides": sides, "ratio": ratio, "ratio_runs": per_round}


@pytest.mark.timeout(3600)
def test_bench_sft_against_trl(benchmark: object, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    from tempering.envs.arithmetic import split_problems, write_chat_jsonl

    full = _timing(request)
    s = _settings(full, tmp_path)
    train, _ = split_problems(seed=s["seed"], n_test=s["n_test"])
    train = train[: s["steps"] * s["batch_size"]]  # one epoch: each conversation once on each side
    s["data"] = str(write_chat_jsonl(train, tmp_path / "data" / "train.jsonl"))
    rounds: list[dict[str, dict[str, Any]]] = []

    def run() -> None:
        # Interleaved (ABBA...): both sides meet the same background load on a shared machine.
        for i in range(s["rounds"]):
            order = ("tempering", "trl") if i % 2 == 0 else ("trl", "tempering")
            here = s | {"out": str(Path(s["out"]) / f"round{i}")}
            rounds.append({side: _side(side, here) for side in order})

    load_before = os.getloadavg()[0]
    benchmark.pedantic(run, rounds=1)  # type: ignore[attr-defined]
    s["load"] = f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after the rounds"
    text, figures = _report(s, rounds)
    print("\n" + text)
    if full and os.environ.get("BENCH_SFT_PEERS_OUT"):
        Path(os.environ["BENCH_SFT_PEERS_OUT"]).write_text(
            text + "\n" + json.dumps(figures | {"rounds": rounds})
        )
    for r in rounds:
        tempering, trl = r["tempering"], r["trl"]
        assert tempering["tokens_per_s"] > 0
        assert trl["tokens_per_s"] > 0
        # the same conversations, the same template: within a token a sequence of each other
        # (measured: TRL's sequences are one token longer, on the tiny model and on SmolLM2)
        assert abs(tempering["tokens_per_seq"] - trl["tokens_per_seq"]) <= 1.0 + 1e-9, (tempering, trl)
        for side in (tempering, trl):
            assert side["loss_last"] < side["loss_first"], side  # both train

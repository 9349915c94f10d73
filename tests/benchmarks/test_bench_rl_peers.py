"""RL speed against TRL (issue 16): the demo's RL stage through tempering and through TRL's
``GRPOTrainer``, side by side in one run, from the same SFT checkpoint. Needs the ``bench``
extra (``trl``); skipped without it. Run on demand: ``make bench`` or

    .venv/bin/python -m pytest tests/benchmarks/test_bench_rl_peers.py --benchmark-enable -s

Full workload (``make bench``): the demo's SFT stage (600 steps × 64, full fine-tuning),
exported as a Hugging Face model directory for TRL; then each side trains 80 steps × 16 prompts
× 16 generations in its own process (tests/benchmarks/rl_peers.py says how each is configured),
``BENCH_RL_ROUNDS`` times (default 2) interleaved ABBA (tempering, TRL, TRL, tempering, ...) so
that both sides meet the same background load; each side's mean over the rounds is reported with every
round's s/step and ratio. The first round's trained models are evaluated by tempering's held-out
evaluator (independent seed per problem; 200 problems, greedy and 4 samples at T=1, evaluation
seeds 0, 1, 2). Prints one line per side and the ratio; figures go to docs/benchmarks.md. Under
plain pytest a tiny smoke run (5 SFT steps, 2 RL steps of 2 × 4, 8 held-out problems) checks
that both sides train and that TRL's model evaluates. ``BENCH_RL_STEPS`` / ``BENCH_SFT_STEPS``
override the step counts; ``BENCH_SFT_STATE`` (a ``tempering://…`` state path, e.g. a demo run's
``sft`` checkpoint) skips the SFT stage and starts both sides from that checkpoint;
``BENCH_RL_PEERS_OUT`` (a file) keeps the printed figures and their JSON;
``BENCH_RL_EVAL_PROBLEMS`` evaluates only the first that many held-out problems.

``BENCH_RL_MODEL`` picks the demo whose job is compared (:data:`tempering.recipes.demo.PRESETS`,
by preset name or base model): ``tiny`` (the default, the workload above) or ``smollm2`` /
``HuggingFaceTB/SmolLM2-135M-Instruct``, the real model's demo: SFT 40 steps × 32 at lr 1e-3
with a LoRA adapter of rank 32, then RL 8 steps × 8 prompts × 8 generations at lr 1e-4, two
torch threads, 100 held-out problems; both sides train the SFT checkpoint's adapter (TRL: the
adapter exported for PEFT). One difference from the demo: the adapter leaves the unembedding
(``lm_head``) out, on every attention and MLP projection only, as TRL's ``GRPOTrainer`` refuses
an adapter on ``lm_head`` ("the log-probabilities are computed from ``lm_head.weight``
directly"); a ``BENCH_SFT_STATE`` must have such an adapter too. The smoke run trains a rank-4
adapter on the tiny model, so that the adapter path is what it checks.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest

from tempering.backend import ModelConfig

pytest.importorskip("trl", reason="the bench extra (pip install 'tempering[bench]') is not installed")

HERE = Path(__file__).resolve().parent
EVAL_SEEDS = (0, 1, 2)


def _timing(request: pytest.FixtureRequest) -> bool:
    config = request.config
    return bool(config.getoption("benchmark_enable")) or not config.getoption("benchmark_disable")


def _preset(name: str) -> Any:
    """The demo preset ``BENCH_RL_MODEL`` names (a preset name or its base model)."""
    from tempering.recipes.demo import PRESETS

    for key, sizes in PRESETS.items():
        if name in (key, sizes.base_model):
            return sizes
    choices = ", ".join(f"{k} ({v.base_model})" for k, v in PRESETS.items())
    raise ValueError(f"BENCH_RL_MODEL={name!r} names no demo preset; use one of: {choices}")


@attrs.frozen(kw_only=True)
class _NoUnembedLora(ModelConfig):
    """A new LoRA adapter on the attention and MLP projections only (no ``lm_head``, which
    TRL's ``GRPOTrainer`` cannot train)."""

    async def create_training_client(self, service: Any) -> Any:
        if self.init_state is None and self.lora_rank > 0:
            return await service.create_lora_training_client(
                self.base_model, rank=self.lora_rank, seed=self.seed, train_unembed=False
            )
        return await super().create_training_client(service)


def _settings(full: bool, out: Path) -> dict[str, Any]:
    env = os.environ.get
    z = _preset(env("BENCH_RL_MODEL", "tiny") if full else "tiny")
    return {
        "full": full,
        "base_model": z.base_model,
        "lora_rank": z.lora_rank if full else 4,
        "threads": z.num_threads,
        "seed": 0,
        "n_test": z.n_test,
        "prompts": z.rl.batch_size if full else 2,
        "generations": z.group_size if full else 4,
        "steps": int(env("BENCH_RL_STEPS", str(z.rl.steps))) if full else 2,
        "sft_steps": int(env("BENCH_SFT_STEPS", str(z.sft.steps))) if full else 5,
        "sft_batch_size": z.sft.batch_size,
        "sft_lr": z.sft.learning_rate if full else 1e-3,
        "sft_weight_decay": z.sft.weight_decay,
        "lr": z.rl.learning_rate,
        "max_tokens": 8,
        "out": str(out),
        "eval_problems": int(env("BENCH_RL_EVAL_PROBLEMS", str(z.n_test))) if full else 8,
        "eval_samples": z.eval_samples,
        "eval_seeds": list(EVAL_SEEDS if full else EVAL_SEEDS[:1]),
        "rounds": int(env("BENCH_RL_ROUNDS", "2")) if full else 1,
    }


async def _sft(s: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """The demo's SFT stage; returns its final state path and its export for TRL: ``hf_model``
    (a Hugging Face model directory: the fine-tune, or the base model under a LoRA adapter) and
    ``hf_adapter`` (the PEFT adapter directory; empty for full fine-tuning)."""
    from tempering.envs.arithmetic import split_problems, write_chat_jsonl
    from tempering.local import ServiceClient
    from tempering.local.export import export_checkpoint
    from tempering.recipes.stages import RecipeSession, SFTStage, sft_stage

    out = Path(s["out"])
    given = os.environ.get("BENCH_SFT_STATE") if s["full"] else None
    state = given
    if not state:
        train, _ = split_problems(seed=s["seed"], n_test=s["n_test"])
        path = write_chat_jsonl(train, out / "data" / "train.jsonl")
        service = ServiceClient(num_threads=s["threads"], device="cpu")
        try:
            session = RecipeSession("bench-rl-peers", out, service, None, progress=False)
            stage = SFTStage(
                s["sft_steps"], s["sft_batch_size"], s["sft_lr"], weight_decay=s["sft_weight_decay"]
            )
            model = _NoUnembedLora(base_model=s["base_model"], lora_rank=s["lora_rank"], seed=0)
            sft = await sft_stage(session, "sft", stage, model=model, train_path=path, seed=s["seed"])
        finally:
            service.close()
        state = sft.final.state_path
    if s["lora_rank"] == 0:
        return state, {"hf_model": str(export_checkpoint(state, out / "sft-hf").out_dir), "hf_adapter": ""}
    exported = export_checkpoint(state, out / "sft-adapter", adapter=True)
    return state, {"hf_model": str(exported.base_model_dir), "hf_adapter": str(exported.out_dir)}


def _side(side: str, s: dict[str, Any]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(HERE / "rl_peers.py"), side, json.dumps(s)],
        capture_output=True, text=True, timeout=3600, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise AssertionError(f"the {side} side failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


async def _evaluate(s: dict[str, Any], models: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Held-out accuracy of each trained model (and of the SFT checkpoint) by tempering's
    evaluator, once per evaluation seed: sampled (4 answers per problem at T=1) and greedy."""
    from tempering.backend import load_renderer, load_tokenizer
    from tempering.envs.arithmetic import split_problems
    from tempering.evals.accuracy import AccuracyEvaluator
    from tempering.local import ServiceClient

    _, test = split_problems(seed=s["seed"], n_test=s["n_test"])
    test = test[: s["eval_problems"]]
    tokenizer = load_tokenizer(s["base_model"])
    renderer = load_renderer(s["base_model"], None)
    service = ServiceClient(num_threads=s["threads"], device="cpu")
    out: dict[str, dict[str, Any]] = {}
    try:
        for name, model in models.items():
            is_dir = Path(model).is_dir()
            future = (
                service.create_sampling_client(base_model=model)
                if is_dir
                else service.create_sampling_client(model_path=model)
            )
            sampler = await future
            runs = [  # greedy answers do not depend on the seed: the first seed's alone
                await AccuracyEvaluator(
                    test, renderer, tokenizer, num_samples=s["eval_samples"], seed=seed, greedy=i == 0
                )(sampler)
                for i, seed in enumerate(s["eval_seeds"])
            ]
            sampled = [r["test/accuracy"] for r in runs]
            greedy = [runs[0]["test/accuracy_greedy"]]
            out[name] = {
                "sampled": statistics.fmean(sampled),
                "sampled_sd": statistics.stdev(sampled) if len(sampled) > 1 else 0.0,
                "sampled_runs": sampled,
                "greedy": statistics.fmean(greedy),
                "greedy_ci95": (
                    runs[0]["test/accuracy_greedy/ci95_low"],
                    runs[0]["test/accuracy_greedy/ci95_high"],
                ),
            }
    finally:
        service.close()
    return out


def _combine(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Each side's figures over the rounds: mean timings (and every round's ``step_s``), the
    first round's model (the one evaluated) and the highest peak RSS; plus the per-round
    ratios."""
    sides: dict[str, dict[str, Any]] = {}
    for name in ("tempering", "trl"):
        runs = [r[name] for r in rounds]
        sides[name] = {
            key: statistics.fmean(r[key] for r in runs)
            for key in ("wall_s", "train_s", "step_s", "samples_per_s")
        } | {
            "model": runs[0]["model"],
            "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
            "step_s_runs": [r["step_s"] for r in runs],
        }
    sides["ratio"] = {"runs": [r["trl"]["step_s"] / r["tempering"]["step_s"] for r in rounds]}
    return sides


def _report(s: dict[str, Any], sides: dict[str, dict[str, Any]], acc: dict[str, dict[str, Any]]) -> str:
    lines = [
        f"RL peers: {s['base_model']}, "
        + (f"LoRA rank {s['lora_rank']}" if s["lora_rank"] else "full fine-tuning")
        + f", {s['steps']} steps x {s['prompts']} prompts x {s['generations']} generations, "
        f"max {s['max_tokens']} tokens, {s['threads']} thread(s), load average {s['load']}"
    ]
    for name in ("sft", "tempering", "trl"):
        a = acc[name]
        timing = ""
        if name in sides:
            r = sides[name]
            timing = (
                f"{r['step_s']:.3f} s/step, {r['samples_per_s']:.0f} samples/s, "
                f"stage wall {r['wall_s']:.1f} s, "
                f"peak RSS {r['peak_rss_mb']:.0f} MB; "
            )
        lo, hi = a["greedy_ci95"]
        lines.append(
            f"  {name:9s} {timing}held-out sampled {a['sampled']:.1%} ± {a['sampled_sd']:.1%} "
            f"(seeds {', '.join(f'{x:.1%}' for x in a['sampled_runs'])}), greedy {a['greedy']:.1%} "
            f"[95% CI {lo:.1%}-{hi:.1%}]"
        )
    ratio = sides["trl"]["step_s"] / sides["tempering"]["step_s"]
    per_round = ", ".join(f"{x:.2f}x" for x in sides["ratio"]["runs"])
    lines.append(f"  ratio (TRL s/step / tempering s/step, means): {ratio:.2f}x (per round: {per_round})")
    for name in ("tempering", "trl"):
        runs = ", ".join(f"{x:.3f}" for x in sides[name]["step_s_runs"])
        lines.append(f"  {name} s/step per round: {runs}")
    return "\n".join(lines)


@pytest.mark.timeout(3600)
def test_bench_rl_against_trl(benchmark: object, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    full = _timing(request)
    s = _settings(full, tmp_path)
    state_path, exported = asyncio.run(_sft(s))
    s |= {"init_state": state_path, **exported}
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
    sides = _combine(rounds)
    acc = asyncio.run(
        _evaluate(
            s, {"sft": state_path, "tempering": sides["tempering"]["model"], "trl": sides["trl"]["model"]}
        )
    )
    text = _report(s, sides, acc)
    print("\n" + text)
    (tmp_path / "rl_peers.json").write_text(json.dumps({"settings": s, "sides": sides, "accuracy": acc}))
    if full and os.environ.get("BENCH_RL_PEERS_OUT"):
        Path(os.environ["BENCH_RL_PEERS_OUT"]).write_text(
            text + "\n" + json.dumps({"sides": sides, "accuracy": acc})
        )
    for name in ("tempering", "trl"):
        r = sides[name]
        assert r["step_s"] > 0
        assert r["peak_rss_mb"] > 0
        assert 0.0 <= acc[name]["sampled"] <= 1.0
        assert 0.0 <= acc[name]["greedy"] <= 1.0

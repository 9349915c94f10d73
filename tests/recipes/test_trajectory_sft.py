"""Trajectory logs back into SFT data (:mod:`tempering.rl.trajectory_data`) on a small real log,
and ``tempering recipe trajectory-sft`` at a tiny budget in a subprocess (both ways in: running
its own teacher, and ``--log-dir`` with learning histories)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tempering.backend import ModelConfig, load_tokenizer
from tempering.envs.tasks import LowercaseTask
from tempering.local import ServiceClient
from tempering.recipes.trajectory_sft import TrajectorySFTRecipe
from tempering.rl.train import RLConfig, train
from tempering.rl.trajectories import episodes_table, read_trajectories
from tempering.rl.trajectory_data import (
    learning_history_examples,
    select_episodes,
    supervised_dataset,
    trajectory_examples,
)
from tempering.training import AdamConfig, LRSchedule, RunConfig


@pytest.fixture(scope="module")
def log(service: ServiceClient, tmp_path_factory: pytest.TempPathFactory) -> pa.Table:
    """A real log: 3 steps of 2 prompts x 4 samples (LowercaseTask: a reward in [0, 1])."""
    log_dir = tmp_path_factory.mktemp("log")
    config = RLConfig(
        run=RunConfig(log_dir=str(log_dir), save_every=0, eval_every=0, progress=False),
        dataset=LowercaseTask(batch_size=2, group_size=4),
        model=ModelConfig(lora_rank=4),
        adam=AdamConfig(learning_rate=1e-2, schedule=LRSchedule("constant")),
        num_steps=3,
        max_tokens=6,
        log_trajectories=True,
    )
    asyncio.run(train(config, service=service))
    return read_trajectories(log_dir)


def _episodes(table: pa.Table) -> list[dict[str, object]]:
    return episodes_table(table).to_pylist()


def test_rejection_sampling_filters(log: pa.Table) -> None:
    episodes = _episodes(log)
    assert len(episodes) == 3 * 2 * 4
    # The middle distinct reward (the median of the rewards can equal their minimum, when most
    # episodes score 0, and then keeps every episode).
    distinct = sorted({float(e["total_reward"]) for e in episodes})  # type: ignore[arg-type]
    assert len(distinct) > 1, "every episode got the same reward: nothing to filter"
    threshold = distinct[len(distinct) // 2]

    kept = _episodes(select_episodes(log, min_reward=threshold))
    expected = [e["episode_id"] for e in episodes if float(e["total_reward"]) >= threshold]  # type: ignore[arg-type]
    assert [e["episode_id"] for e in kept] == expected
    assert 0 < len(expected) < len(episodes)

    best = _episodes(select_episodes(log, top_k_per_prompt=1))
    by_prompt: defaultdict[object, list[float]] = defaultdict(list)
    for e in episodes:
        by_prompt[e["prompt_id"]].append(float(e["total_reward"]))  # type: ignore[arg-type]
    assert len(best) == len(by_prompt)
    assert {e["prompt_id"]: e["total_reward"] for e in best} == {p: max(r) for p, r in by_prompt.items()}
    two = _episodes(select_episodes(log, min_reward=threshold, top_k_per_prompt=2))
    assert all(float(e["total_reward"]) >= threshold for e in two)  # type: ignore[arg-type]
    counts = defaultdict[object, int](int)
    for e in two:
        counts[e["prompt_id"]] += 1
    assert max(counts.values()) <= 2

    # Each kept episode becomes one example: its tokens, weight 1 on the action.
    rows = select_episodes(log, top_k_per_prompt=1)
    examples = trajectory_examples(rows)
    assert len(examples) == len(best)
    for example, row in zip(examples, rows.to_pylist(), strict=True):
        ob, ac = row["ob_tokens"], row["ac_tokens"]
        assert example.model_input.to_ints() == ob + ac
        assert example.weights.tolist() == [0.0] * len(ob) + [1.0] * len(ac)
    dataset = supervised_dataset(examples, batch_size=2)
    assert len(dataset) == len(examples) // 2
    assert all("weights" in d.loss_fn_inputs for d in dataset.get_batch(0))


def test_dedup_keeps_one_copy_the_latest(log: pa.Table) -> None:
    # The log twice, the copy ten steps later with its own episode ids: every episode has a
    # duplicate (same prompt, same action tokens).
    copy = log.set_column(
        log.schema.get_field_index("step"), "step", pa.array(np.asarray(log.column("step")) + 10, pa.int32())
    )
    copy = copy.set_column(
        copy.schema.get_field_index("episode_id"),
        "episode_id",
        pa.array(["copy-" + str(x) for x in log.column("episode_id").to_pylist()]),
    )
    doubled = pa.concat_tables([log, copy.cast(log.schema)])
    unique = {
        (e["prompt_id"], tuple(r["ac_tokens"])) for e, r in zip(_episodes(log), log.to_pylist(), strict=True)
    }
    kept = _episodes(select_episodes(doubled, dedup=True))
    assert len(kept) == len(unique)
    assert all(str(e["episode_id"]).startswith("copy-") for e in kept)  # ties go to the later step
    assert len(_episodes(select_episodes(doubled))) == 2 * len(_episodes(log))


def test_learning_histories_follow_training_order(log: pa.Table) -> None:
    tokenizer = load_tokenizer("tempering/tiny")
    # One task ("lowercase"), one episode per step: one history of the first episode of steps
    # 0, 1, 2, each followed by its reward but the last.
    (history,) = learning_history_examples(log, tokenizer, key="tags", per_step=1, episodes_per_history=10)
    rows = {(r["step"], r["group"], r["member"]): r for r in log.to_pylist()}
    tokens: list[int] = []
    weights: list[float] = []
    for step in range(3):
        r = rows[(step, 0, 0)]
        tokens += r["ob_tokens"] + r["ac_tokens"]
        weights += [0.0] * len(r["ob_tokens"]) + [1.0] * len(r["ac_tokens"])
        if step < 2:
            feedback = tokenizer.encode(f"\nreward: {r['total_reward']:g}\n", add_special_tokens=False)
            tokens += feedback
            weights += [0.0] * len(feedback)
    assert history.model_input.to_ints() == tokens
    assert history.weights.tolist() == weights

    # Per prompt, windows of 3 episodes in (step, group, member) order.
    histories = learning_history_examples(log, tokenizer, episodes_per_history=3)
    per_prompt = defaultdict[object, int](int)
    for e in _episodes(log):
        per_prompt[e["prompt_id"]] += 1
    assert len(histories) == sum(-(-n // 3) for n in per_prompt.values())
    text = tokenizer.decode(histories[0].model_input.to_ints())
    assert isinstance(text, str)
    assert text.count("\nreward: ") == 2


_TINY = [
    "--teacher-sft-steps", "40", "--teacher-rl-steps", "2", "--teacher-rl-batch-size", "4",
    "--teacher-group-size", "4", "--steps", "6", "--batch-size", "4", "--n-test", "12",
    "--eval-samples", "2", "--min-reward", "0", "--no-progress",
]  # fmt: skip


def _recipe(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tempering.cli", "recipe", "trajectory-sft", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_recipe_tiny_budget(tmp_path: Path) -> None:
    env = {**os.environ, "TEMPERING_HOME": str(tmp_path / "home"), "TEMPERING_NUM_THREADS": "1"}
    env.pop("TINKER_API_KEY", None)
    out = tmp_path / "run"
    proc = _recipe(["--out", str(out), *_TINY], env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"run directory: {out}" in proc.stdout
    assert "tempering recipe trajectory-sft:" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["recipe"] == "trajectory-sft"
    assert summary["mode"] == "rejection"
    assert summary["episodes_logged"] == 2 * 4 * 4  # teacher RL: 2 steps x 4 problems x 4 samples
    assert 0 < summary["episodes_kept"] <= 2 * 4  # min reward 0, the best of each prompt
    assert summary["examples"] == summary["episodes_kept"]
    for key in ("student_accuracy", "student_greedy_accuracy", "teacher_accuracy", "teacher_greedy_accuracy"):
        assert 0.0 <= summary[key] <= 1.0, key
    assert (out / "teacher-rl" / "trajectories" / "rl" / "step-000001.parquet").is_file()
    assert (out / "teacher-rl" / "trajectories" / "text" / "step-000001.jsonl").is_file()
    student = [json.loads(x) for x in (out / "student" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in student] == list(range(6))

    # The same log, given with --log-dir, as learning histories; the teacher is evaluated from
    # its checkpoint (the same store).
    again = tmp_path / "history"
    proc = _recipe(
        ["--out", str(again), "--log-dir", str(out / "teacher-rl"), "--mode", "history", *_TINY], env
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    history = json.loads((again / "summary.json").read_text())
    assert history["mode"] == "history"
    assert history["episodes_kept"] == history["episodes_logged"] == summary["episodes_logged"]
    assert history["examples"] == 2 * 4  # each prompt's 4 samples make one window of 4
    assert 0.0 <= history["teacher_accuracy"] <= 1.0  # from the checkpoint: no summary names it
    assert not (again / "teacher-rl").exists()

    # A log from another held-out split is refused before anything runs, naming the flag to pass.
    refused = TrajectorySFTRecipe(out=str(tmp_path / "x"), log_dir=str(out / "teacher-rl"), n_test=30)
    with pytest.raises(ValueError, match="--n-test 12"):
        asyncio.run(refused())
    assert not (tmp_path / "x").exists()


def test_self_run_teacher_follows_the_model_preset() -> None:
    """Without --log-dir the teacher repeats the demo's stages; the settings that are not flags
    (SFT batch size, learning rate, weight decay) are those of the base model's demo preset, so
    the real model's teacher is not trained at the tiny model's 2e-3 and batch 64."""
    from tempering.recipes.demo import PRESETS
    from tempering.recipes.trajectory_sft import teacher_demo

    real = PRESETS["smollm2"].sft
    for name in ("HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2-135m-instruct"):
        demo = teacher_demo(name).sizes().sft
        assert (demo.batch_size, demo.learning_rate, demo.weight_decay) == (
            real.batch_size, real.learning_rate, real.weight_decay,
        )  # fmt: skip
    tiny = teacher_demo("tempering/tiny").sizes().sft
    assert (tiny.batch_size, tiny.learning_rate) == (
        PRESETS["tiny"].sft.batch_size,
        PRESETS["tiny"].sft.learning_rate,
    )
    assert teacher_demo("acme/Other-1B").sizes().sft.batch_size == PRESETS["tiny"].sft.batch_size

"""``tempering recipe chat-sft`` at a tiny budget, in a subprocess: the run directory, the
summary and the direction (held-out NLL falls). Also: the hosted service refuses the tiny model
in every recipe of this family, and bad flags fail with a message naming the flag. The
full-budget figures are in docs/recipes/chat-sft.md, not asserted here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tempering import assets
from tempering.evals.reply import held_out_replies
from tempering.recipes._common import recipe_learning_rate
from tempering.recipes.chat_sft import ChatSFTRecipe, chat_stage
from tempering_protocols import Message

_TINY = ["--steps", "30", "--batch-size", "8", "--eval-every", "0", "--show", "3", "--no-progress"]


def _env(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "TEMPERING_HOME": str(tmp_path / "home"), "TEMPERING_NUM_THREADS": "1"}
    env.pop("TINKER_API_KEY", None)
    return env


def test_chat_sft_tiny_budget(tmp_path: Path) -> None:
    out = tmp_path / "run"
    # 30 of the 100 held-out chats keep the evaluation short.
    small = tmp_path / "chat_test_30.jsonl"
    small.write_text("".join(assets.path("arithmetic_chat_test.jsonl").read_text().splitlines(True)[:30]))
    proc = subprocess.run(
        [sys.executable, "-m", "tempering.cli", "recipe", "chat-sft", *_TINY, "--test-path", str(small),
         "--out", str(out)],
        capture_output=True, text=True, timeout=300, env=_env(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"run directory: {out}" in proc.stdout
    assert "tempering recipe chat-sft: test_nll_before" in proc.stdout
    assert "held-out replies" in proc.stdout

    summary = json.loads((out / "summary.json").read_text())
    assert summary["recipe"] == "chat-sft"
    for key in ("exact_match_before", "exact_match_after"):
        assert 0.0 <= summary[key] <= 1.0
    assert summary["wall_seconds"] > 0
    assert summary["config"]["sft"]["steps"] == 30  # the stage is nested: --sft.steps (or --steps)
    assert summary["config"]["test_path"] == str(small)
    assert len(summary["replies"]) == 3
    assert {"prompt", "reference", "before", "after", "correct"} <= set(summary["replies"][0])
    assert summary["sft_sampler_path"].startswith("tempering://")
    # The randomly initialised tiny model starts near ln(264) = 5.58 nats per token; 30 steps
    # of SFT take most of the way to the chat format (measured 5.50 -> 2.5).
    assert 5.0 < summary["test_nll_before"] < 6.0
    assert summary["test_nll_after"] < 0.7 * summary["test_nll_before"]

    lines = [json.loads(x) for x in (out / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(30))
    assert lines[-1]["test/nll"] == pytest.approx(summary["test_nll_after"])
    assert lines[-1]["test/exact_match"] == pytest.approx(summary["exact_match_after"])
    assert (out / "sft" / "config.json").is_file()
    assert (out / "sft" / "checkpoints.jsonl").is_file()


@pytest.mark.parametrize("name", ["chat-sft", "dpo", "rlhf"])
def test_hosted_service_refuses_the_tiny_model(tmp_path: Path, name: str) -> None:
    out = tmp_path / "run"
    env = {**_env(tmp_path), "TINKER_API_KEY": "tml-dummy-key-for-the-test"}
    proc = subprocess.run(
        [sys.executable, "-m", "tempering.cli", "recipe", name, "--out", str(out), "--no-progress"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "TINKER_API_KEY is set" in proc.stderr
    assert "--base-model" in proc.stderr
    assert not out.exists()  # refused before anything was written


def test_bad_config_names_the_flag() -> None:
    with pytest.raises(ValueError, match=r"ChatSFTRecipe\.sft\.steps \(--sft\.steps\) must be > 0, got 0"):
        ChatSFTRecipe(sft=chat_stage(0))
    with pytest.raises(ValueError, match=r"ChatSFTRecipe\.max_tokens \(--max-tokens\) must be > 0, got -1"):
        ChatSFTRecipe(max_tokens=-1)


def test_learning_rate_defaults_and_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    assert recipe_learning_rate("tempering/tiny", None) == 2e-3
    # a listed model: its recommended LoRA rate (tempering.model_info.get_lr); an unlisted one: 2e-4
    assert recipe_learning_rate("Qwen/Qwen3-4B-Instruct-2507", None) == pytest.approx(
        5e-4 * (2000 / 2560) ** 0.0775
    )
    assert recipe_learning_rate("my-org/my-model", None) == 2e-4
    assert recipe_learning_rate("tempering/tiny", 1e-4) == 1e-4
    with pytest.raises(ValueError, match="positive"):
        recipe_learning_rate("tempering/tiny", -1.0)
    with pytest.raises(ValueError, match="positive"):  # an explicit 0 is refused, never replaced
        recipe_learning_rate("tempering/tiny", 0.0)


def test_held_out_replies_takes_the_last_assistant_turn() -> None:
    two_turns: list[Message] = [
        {"role": "user", "content": "What is 1 + 1?"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4"},
    ]
    unanswered: list[Message] = [{"role": "user", "content": "hello"}]
    ((prompt, reference),) = held_out_replies([two_turns, unanswered])
    assert reference == "4"
    assert [m["content"] for m in prompt] == ["What is 1 + 1?", "2", "What is 2 + 2?"]

"""``tempering recipe tic-tac-toe`` at a tiny budget, in a subprocess: it exits 0, writes its run
directories, and its summary holds the win/draw/loss/illegal rates in range. The full-budget
figures are in docs/recipes/tic-tac-toe.md, not a test."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tempering.envs.game_data import SelfPlayTask, random_game_positions, write_random_games
from tempering.envs.tic_tac_toe import legal_moves, winner
from tempering.recipes import load_recipe
from tempering.recipes.tic_tac_toe import TicTacToeRecipe
from tempering_protocols.testing import check_rl_dataset

_TINY = [
    "--sft-games", "100", "--sft-steps", "16", "--sft-batch-size", "16",
    "--rl-steps", "2", "--rl-batch-size", "2", "--games-per-group", "2",
    "--eval-games", "10", "--eval-seeds", "2", "--no-progress",
]  # fmt: skip


def test_registry_names_the_recipe() -> None:
    assert load_recipe("tic-tac-toe") is TicTacToeRecipe


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError, match=r"TicTacToeRecipe\.games_per_group .* must be > 0"):
        TicTacToeRecipe(games_per_group=0)


def test_random_games_are_legal(tmp_path: Path) -> None:
    rng = random.Random(0)
    for _ in range(50):
        positions = random_game_positions(rng)
        for board, mark, cell in positions:
            assert cell in legal_moves(board)
            assert winner(board) is None
            assert mark == ("X" if board.count("X") == board.count("O") else "O")
        last_board, last_mark, last_cell = positions[-1]
        final = last_board[:last_cell] + last_mark + last_board[last_cell + 1 :]
        assert winner(final) == last_mark or not legal_moves(final)
    rows = [
        json.loads(x) for x in write_random_games(tmp_path / "g.jsonl", 20, seed=1).read_text().splitlines()
    ]
    assert len(rows) >= 20 * 5  # at least five moves a game
    assert all(len(r["messages"]) == 2 and r["messages"][1]["content"] in "123456789" for r in rows)


def test_self_play_task_is_a_dataset() -> None:
    train, test = asyncio.run(SelfPlayTask(batch_size=2, games_per_group=1, n_batches=3)())
    assert test is None
    assert len(train) == 3
    check_rl_dataset(train, builders_per_batch=0)


def test_recipe_tiny_budget(tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "TEMPERING_HOME": str(tmp_path / "home"), "TEMPERING_NUM_THREADS": "1"}
    env.pop("TINKER_API_KEY", None)
    proc = subprocess.run(
        [sys.executable, "-m", "tempering.cli", "recipe", "tic-tac-toe", *_TINY, "--out", str(out)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"run directory: {out}" in proc.stdout

    summary = json.loads((out / "summary.json").read_text())
    assert summary["recipe"] == "tic-tac-toe"
    for stage in ("sft", "rl"):
        for side in ("X", "O"):
            rates = [summary[f"{stage}_{side}_{k}"] for k in ("win", "draw", "loss")]
            assert all(0.0 <= r <= 1.0 for r in rates)
            assert sum(rates) == pytest.approx(1.0)
            assert 0.0 <= summary[f"{stage}_{side}_illegal"] <= summary[f"{stage}_{side}_loss"]
            assert summary[stage][side]["games"] == 10 * 2  # games per side x eval seeds, pooled
            spread = summary["spread"][f"{stage}_{side}_win"]
            assert spread["seeds"] == [7919, 7920]
            assert summary[f"{stage}_{side}_win"] == pytest.approx(sum(spread["values"]) / 2)
    assert summary["wall_seconds"] > 0
    assert summary["sft_positions"] >= 100 * 5

    sft = [json.loads(x) for x in (out / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in sft] == list(range(16))
    assert sft[-1]["loss"] < 0.6 * sft[0]["loss"]  # SFT learns the format
    rl = [json.loads(x) for x in (out / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in rl] == [0, 1]
    # self-play: every game has a winner's +1 against a loser's -1, or a draw, or a forfeit
    assert all(-1.0 <= x["env/reward/mean"] <= 1.0 for x in rl)
    assert all(x["env/tic_tac_toe/reward/mean"] == x["env/reward/mean"] for x in rl)
    for stage in ("sft", "rl"):
        assert (out / stage / "checkpoints.jsonl").read_text().strip()

"""SFT warm-start data for the game envs, and tic-tac-toe's self-play task.

A randomly initialised model cannot play from nothing, so the game recipes first fine-tune on
scripted or random games:

- guess-number: :func:`write_transcripts` (games of a scripted player: ``"random"`` guesses
  uniformly within the range the feedback still allows, ``"bisect"`` halves it) and
  :func:`scripted_stats` (that player's success rate and mean turns, for scale);
- tic-tac-toe: :func:`random_game_positions` and :func:`write_random_games` (every position of
  games between two uniformly random legal players), and :class:`SelfPlayTask`, the RL dataset
  builder of self-play.

Example::

    write_transcripts(Path("guess.jsonl"), (1, 2, 3), n_games=100, teacher="random",
                      low=0, high=15, max_turns=5, seed=0)
    write_random_games(Path("ttt.jsonl"), n_games=1000, seed=0)
    train, _ = await SelfPlayTask(batch_size=4, games_per_group=4)()
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import attrs

from tempering.envs.agent_data import SameEveryBatch
from tempering.envs.guess_number import (
    GuessNumberGame,
    GuessPolicy,
    bisect_guess,
    play_scripted,
    random_consistent_guess,
)
from tempering.envs.task_base import PolicyTask
from tempering.envs.tic_tac_toe import (
    EMPTY,
    MARKS,
    Side,
    TicTacToeGroupBuilder,
    legal_moves,
    tic_tac_toe_prompt,
    winner,
)
from tempering_protocols import Message, RLDataset

__all__ = [
    "TEACHERS",
    "SelfPlayTask",
    "Teacher",
    "random_game_positions",
    "scripted_stats",
    "write_random_games",
    "write_transcripts",
]

Teacher = Literal["random", "bisect"]
TEACHERS: dict[str, GuessPolicy] = {"random": random_consistent_guess, "bisect": bisect_guess}
"""The scripted guess-number players by name."""


def _write_rows(path: Path, conversations: Sequence[Sequence[Message]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for messages in conversations:
            f.write(json.dumps({"messages": list(messages)}) + "\n")
    return path


def write_transcripts(
    path: Path,
    secrets: Sequence[int],
    *,
    n_games: int,
    teacher: Teacher,
    low: int,
    high: int,
    max_turns: int,
    seed: int,
) -> Path:
    """Write ``n_games`` guess-number games of the scripted ``teacher`` (secrets drawn from
    ``secrets``) as ``{"messages": [...]}`` rows; returns ``path``.

    Example::

        write_transcripts(Path("sft.jsonl"), (1, 2, 3), n_games=100, teacher="random",
                          low=0, high=15, max_turns=5, seed=0)
    """
    rng = random.Random(f"guess-number-transcripts/{seed}")
    policy = TEACHERS[teacher]
    games: list[list[Message]] = []
    for _ in range(n_games):
        game = GuessNumberGame(rng.choice(secrets), low=low, high=high, max_turns=max_turns)
        games.append(play_scripted(game, policy, rng))
    return _write_rows(path, games)


def scripted_stats(
    teacher: Teacher, secrets: Sequence[int], low: int, high: int, max_turns: int, games: int
) -> dict[str, float]:
    """``{<teacher>_success, <teacher>_turns}``: a scripted player's success rate and mean turns
    over ``games`` guess-number games per secret."""
    rng = random.Random(f"guess-number-baseline/{teacher}")
    found = turns = n = 0
    for secret in secrets:
        for _ in range(games):
            game = GuessNumberGame(secret, low=low, high=high, max_turns=max_turns)
            play_scripted(game, TEACHERS[teacher], rng)
            found += game.found
            turns += game.turns
            n += 1
    return {f"{teacher}_success": found / n, f"{teacher}_turns": turns / n}


def random_game_positions(rng: random.Random) -> list[tuple[str, Side, int]]:
    """One tic-tac-toe game between two uniformly random legal players: ``(board, mover, cell)``
    for every move (board as 9 characters, cell 0-based)."""
    board = [EMPTY] * 9
    out: list[tuple[str, Side, int]] = []
    player = 0
    while winner(board) is None and legal_moves(board):
        cell = rng.choice(legal_moves(board))
        out.append(("".join(board), MARKS[player], cell))
        board[cell] = MARKS[player]
        player = 1 - player
    return out


def write_random_games(path: Path, n_games: int, seed: int) -> Path:
    """Write every position of ``n_games`` random legal tic-tac-toe games as a one-turn
    conversation ``{"messages": [user: board, assistant: cell]}``; returns ``path``.

    Example::

        write_random_games(Path("ttt.jsonl"), n_games=1000, seed=0)
    """
    rng = random.Random(f"tic-tac-toe-games/{seed}")
    rows: list[list[Message]] = [
        [
            {"role": "user", "content": tic_tac_toe_prompt(board, mark)},
            {"role": "assistant", "content": str(cell + 1)},
        ]
        for _ in range(n_games)
        for board, mark, cell in random_game_positions(rng)
    ]
    return _write_rows(path, rows)


@attrs.frozen(kw_only=True)
class SelfPlayTask(PolicyTask):
    """The RL dataset builder of tic-tac-toe self-play: ``batch_size`` groups of
    ``games_per_group`` games per step, ``n_batches`` steps; no test set (evaluate against a
    random player, :func:`tempering.rl.evaluate.evaluate_against_random`). Picklable.

    Example::

        train, _ = await SelfPlayTask(batch_size=4, games_per_group=4)()
    """

    batch_size: int = 4
    """Self-play groups per training batch."""
    games_per_group: int = 4
    """Games per group (both players of each are members)."""
    n_batches: int = 1000
    """Training batches."""
    illegal_reward: float = -1.0
    """Reward of an illegal move (not a free cell's number, or unparsed); it loses the game."""
    turn_timeout_s: float = 120.0
    """Seconds a player waits for the opponent's move before winning by forfeit."""

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        # Every batch alike: the games differ by the sampling seeds the RL loop gives each group.
        group = TicTacToeGroupBuilder(
            self.renderer(),
            n_games=self.games_per_group,
            illegal_reward=self.illegal_reward,
            turn_timeout_s=self.turn_timeout_s,
        )
        dataset = SameEveryBatch((group,) * self.batch_size, self.n_batches)
        return dataset, None

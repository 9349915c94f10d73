"""Tic-tac-toe: self-play (both players in one group) and play against a uniformly random player.

The board is nine cells, numbered 1-9 row by row; ``X`` moves first. Each turn the mover sees
the current board (only the current board: the observation does not grow, so every turn is its
own datum), each free cell shown as its number, and replies with the number of a free cell::

    Tic-tac-toe, you are O. Pick a free cell.
    X23
    4X6
    78O

(Showing the free cells' numbers makes a legal move a digit copied from the prompt, which a
tiny model learns in a few hundred SFT steps; with ``.`` for free cells it did not, in 300.)

A reply that is not one digit 1-9, names a taken cell, or does not parse (no stop token within
the turn's budget) is an **illegal move**: the mover loses at once and it is counted.

**Self-play** (:class:`TicTacToeGroupBuilder`), modelled on :mod:`tempering.envs.games` (Nim):
``n_games`` games per group, both players of each game are members (``[game0 X, game0 O,
game1 X, …]``), turn-taking coordinated in-group (``coordinated_envs = True``: members are
played concurrently), the outcome is the group reward:

=======================================  ==========================================
outcome for a player                     group reward
=======================================  ==========================================
won                                      ``+1``
draw                                     ``0``
lost on the board                        ``-1``
moved illegally (or resigned)            ``illegal_reward`` (default ``-1``)
opponent moved illegally or timed out    ``forfeit_reward`` (default ``0``: it did
                                         nothing to earn the win)
=======================================  ==========================================

A player waiting longer than ``turn_timeout_s`` for its opponent wins by forfeit, so a game never
hangs on a failed opponent (and the conformance kit, which plays members one after another,
gets through).

**Against a random player** (:class:`TicTacToeVsRandom`, :class:`TicTacToeVsRandomGroupBuilder`):
one player is the policy, the other a seeded uniformly random legal mover inside the env; the
step reward at the end is ``+1`` / ``0`` / ``-1`` (illegal: ``illegal_reward``).
:func:`tempering.rl.evaluate.evaluate_against_random` plays a policy as X and as O and returns
:class:`TicTacToeStats` (win / draw / loss / illegal-move rates) per side.

Metrics of a player's last step: ``ttt/won``, ``ttt/draw``, ``ttt/lost``, ``ttt/illegal``,
``ttt/moves``.

Shapes: ``P`` groups, ``G`` members (players; ``2 * n_games`` in self-play).

Example::

    builder = TicTacToeGroupBuilder(renderer, n_games=4)
    rollout = await rollout_group(builder, policy, RolloutConfig())
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import ClassVar, Literal

import attrs
import numpy as np

from tempering.envs.message import GameEnvAdapter, MessageStepResult, PrefixedFigures
from tempering.envs.turn_based import TurnBasedGame, TurnBasedGroupBuilder, TurnBasedPlayer
from tempering_protocols import (
    Env,
    EnvGroupBuilder,
    Message,
    Metrics,
    Renderer,
    Trajectory,
)

__all__ = [
    "EMPTY",
    "LINES",
    "MARKS",
    "Side",
    "TicTacToeGame",
    "TicTacToeGroupBuilder",
    "TicTacToePlayer",
    "TicTacToeStats",
    "TicTacToeVsRandom",
    "TicTacToeVsRandomGroupBuilder",
    "legal_moves",
    "parse_move",
    "tic_tac_toe_prompt",
    "tic_tac_toe_stats",
    "winner",
]

Side = Literal["X", "O"]
MARKS: tuple[Side, Side] = ("X", "O")
"""Player 0 plays X (moves first), player 1 plays O."""
EMPTY = "."
LINES: tuple[tuple[int, int, int], ...] = (
    (0, 1, 2), (3, 4, 5), (6, 7, 8),  # rows
    (0, 3, 6), (1, 4, 7), (2, 5, 8),  # columns
    (0, 4, 8), (2, 4, 6),  # diagonals
)  # fmt: skip
"""The eight winning lines, as 0-based cell indices."""


def winner(board: Sequence[str]) -> str | None:
    """The mark (``"X"``/``"O"``) that has three in a line on ``board`` (9 cells), else ``None``."""
    for a, b, c in LINES:
        if board[a] != EMPTY and board[a] == board[b] == board[c]:
            return board[a]
    return None


def legal_moves(board: Sequence[str]) -> list[int]:
    """The empty cells of ``board`` (0-based)."""
    return [i for i, cell in enumerate(board) if cell == EMPTY]


def parse_move(text: str) -> int | None:
    """A reply's cell (0-based) when it is one digit 1-9 (surrounding spaces allowed), else ``None``."""
    text = text.strip()
    return int(text) - 1 if len(text) == 1 and "1" <= text <= "9" else None


def tic_tac_toe_prompt(board: Sequence[str], mark: Side) -> str:
    """The user message that asks ``mark`` to move on ``board``: the board's rows with each free
    cell shown as its number, so a legal reply is a digit that appears on the board."""
    cells = [str(i + 1) if c == EMPTY else c for i, c in enumerate(board)]
    rows = "\n".join("".join(cells[r * 3 : r * 3 + 3]) for r in range(3))
    return f"Tic-tac-toe, you are {mark}. Pick a free cell.\n{rows}"


def _outcome_metrics(won: bool, draw: bool, illegal: bool, moves: int) -> Metrics:
    return {
        "ttt/won": int(won),
        "ttt/draw": int(draw),
        "ttt/lost": int(not won and not draw),
        "ttt/illegal": int(illegal),
        "ttt/moves": moves,
    }


# ------------------------------------------------------------------------------ self-play


class TicTacToeGame(TurnBasedGame[int]):
    """The shared state of one self-play game between players 0 (X) and 1 (O).

    ``winner`` is the winning player (``None`` while the game is on or after a draw), ``draw``
    whether it ended drawn, ``illegal_by`` the player who moved illegally or resigned,
    ``forfeit_by`` the player who timed out. Turn-taking is :class:`TurnBasedGame`'s.
    """

    def __init__(self, turn_timeout_s: float) -> None:
        super().__init__(turn_timeout_s)
        self.board: list[str] = [EMPTY] * 9
        self.draw = False
        self.illegal_by: int | None = None
        self.forfeit_by: int | None = None
        self.moves = [0, 0]

    @property
    def over(self) -> bool:
        return self.winner is not None or self.draw

    def forfeit(self, waiting: int) -> None:
        self.winner = waiting
        self.forfeit_by = 1 - waiting

    def apply(self, player: int, move: int | None) -> None:
        """Mark cell ``move`` (``None`` or a taken cell: illegal, which loses)."""
        if move is None or self.turn != player or self.board[move] != EMPTY:
            self.winner = 1 - player
            self.illegal_by = player
            return
        self.board[move] = MARKS[player]
        self.moves[player] += 1
        if winner(self.board) is not None:
            self.winner = player
        elif not legal_moves(self.board):
            self.draw = True
        self.turn = 1 - player

    def reward(self, player: int, *, illegal_reward: float, forfeit_reward: float) -> float:
        """``player``'s reward for the finished game (see the module docstring)."""
        if self.draw or self.winner is None:
            return 0.0
        if self.illegal_by == player:
            return illegal_reward
        if self.illegal_by is not None or self.forfeit_by is not None:
            return forfeit_reward if self.winner == player else -1.0
        return 1.0 if self.winner == player else -1.0

    def metrics(self, player: int) -> Metrics:
        return _outcome_metrics(
            self.winner == player, self.draw, self.illegal_by == player, self.moves[player]
        )


class TicTacToePlayer(TurnBasedPlayer[TicTacToeGame]):
    """One player of a :class:`TicTacToeGame`, as a message-level env. Each observation is the
    current board only; a resignation (unparseable reply, context overflow) counts as an
    illegal move.

    Example::

        game = TicTacToeGame(turn_timeout_s=60)
        x, o = TicTacToePlayer(game, 0), TicTacToePlayer(game, 1)
    """

    def next_messages(self, reply: Message | None) -> list[Message]:
        return [{"role": "user", "content": tic_tac_toe_prompt(self.game.board, MARKS[self.player])}]

    def parse(self, text: str) -> int | None:
        return parse_move(text)

    def final_metrics(self) -> Metrics:
        return self.game.metrics(self.player)

    def resign_metrics(self) -> Metrics:
        return self.game.metrics(self.player)


@attrs.frozen
class TicTacToeGroupBuilder(TurnBasedGroupBuilder[TicTacToePlayer]):
    """``n_games`` self-play games; both players of each game are members of the group
    (turn-taking, validation and the group's shape: :class:`TurnBasedGroupBuilder`).

    Example::

        check_env_group_builder(TicTacToeGroupBuilder(renderer, n_games=2, turn_timeout_s=0.05))
    """

    player_type: ClassVar[type[TicTacToePlayer]] = TicTacToePlayer
    n_games: int = 4
    illegal_reward: float = -1.0
    forfeit_reward: float = 0.0
    tag: str = "tic_tac_toe"

    def new_game(self) -> TicTacToeGame:
        return TicTacToeGame(self.turn_timeout_s)

    def outcome(self, player: TicTacToePlayer) -> tuple[float, Metrics]:
        reward = player.game.reward(
            player.player, illegal_reward=self.illegal_reward, forfeit_reward=self.forfeit_reward
        )
        return reward, player.game.metrics(player.player)


# ------------------------------------------------------------------------------ against random


class TicTacToeVsRandom:
    """One game of the policy (playing ``side``) against a uniformly random legal mover seeded
    by ``seed``, as a message-level env. Single-use. Reward at the end: +1 win, 0 draw, -1 loss,
    ``illegal_reward`` for an illegal move (which ends the game).

    Example::

        env = MessageEnvAdapter(TicTacToeVsRandom("O", seed=3), renderer)
    """

    def __init__(self, side: Side, seed: int, *, illegal_reward: float = -1.0) -> None:
        if side not in MARKS:
            raise ValueError(f"TicTacToeVsRandom: side must be 'X' or 'O', got {side!r}")
        self.side: Side = side
        self.rng = random.Random(f"tic-tac-toe-random/{seed}")
        self.illegal_reward = illegal_reward
        self.board: list[str] = [EMPTY] * 9
        self.moves = 0
        self.illegal = False
        self.done = False

    @property
    def opponent(self) -> Side:
        return "O" if self.side == "X" else "X"

    def _random_move(self) -> None:
        self.board[self.rng.choice(legal_moves(self.board))] = self.opponent

    def _prompt(self) -> list[Message]:
        return [{"role": "user", "content": tic_tac_toe_prompt(self.board, self.side)}]

    def _end(self, reward: float) -> MessageStepResult:
        self.done = True
        won, draw = reward > 0, reward == 0 and not self.illegal
        return MessageStepResult(
            reward=reward, episode_done=True, metrics=_outcome_metrics(won, draw, self.illegal, self.moves)
        )

    def unparsed_reply(self, reward: float | None = None, /) -> MessageStepResult:
        """Record a reply that did not parse (an illegal move) and end the game with ``reward``
        (default ``illegal_reward``)."""
        if self.done:
            raise RuntimeError("TicTacToeVsRandom is single-use and this game is over")
        self.illegal = True
        return self._end(self.illegal_reward if reward is None else reward)

    async def initial_messages(self) -> Sequence[Message]:
        if self.side == "O" and self.moves == 0 and all(c == EMPTY for c in self.board):
            self._random_move()
        return self._prompt()

    async def step(self, message: Message, /) -> MessageStepResult:
        if self.done:
            raise RuntimeError("TicTacToeVsRandom is single-use and this game is over")
        cell = parse_move(message["content"])
        if cell is None or self.board[cell] != EMPTY:
            self.illegal = True
            return self._end(self.illegal_reward)
        self.board[cell] = self.side
        self.moves += 1
        if winner(self.board) == self.side:
            return self._end(1.0)
        if not legal_moves(self.board):
            return self._end(0.0)
        self._random_move()
        if winner(self.board) == self.opponent:
            return self._end(-1.0)
        if not legal_moves(self.board):
            return self._end(0.0)
        return MessageStepResult(reward=0.0, episode_done=False, next_messages=self._prompt())


class _VsRandomEnv(GameEnvAdapter[TicTacToeVsRandom]):
    """A :class:`TicTacToeVsRandom` through the renderer; an unparseable reply is an illegal move."""

    def __init__(self, game: TicTacToeVsRandom, renderer: Renderer) -> None:
        super().__init__(game, renderer, penalty=game.illegal_reward)


@attrs.frozen
class TicTacToeVsRandomGroupBuilder(EnvGroupBuilder):
    """``group_size`` games of the policy as ``side`` against random players seeded
    ``seed * group_size + g``.

    Example::

        check_env_group_builder(TicTacToeVsRandomGroupBuilder(renderer, side="O", seed=0))
    """

    renderer: Renderer = attrs.field(eq=False)
    side: Side = "X"
    seed: int = 0
    group_size: int = 8
    illegal_reward: float = -1.0
    tag: str = "tic_tac_toe_vs_random"

    def __attrs_post_init__(self) -> None:
        if self.side not in MARKS:
            raise ValueError(f"TicTacToeVsRandomGroupBuilder: side must be 'X' or 'O', got {self.side!r}")
        if self.group_size < 1:
            raise ValueError(f"TicTacToeVsRandomGroupBuilder: group_size must be >= 1, got {self.group_size}")

    async def make_envs(self) -> Sequence[Env]:
        return [
            _VsRandomEnv(
                TicTacToeVsRandom(
                    self.side, self.seed * self.group_size + g, illegal_reward=self.illegal_reward
                ),
                self.renderer,
            )
            for g in range(self.group_size)
        ]

    def logging_tags(self) -> list[str]:
        return [self.tag]


@attrs.frozen
class TicTacToeStats(PrefixedFigures):
    """Outcome rates of finished games (fractions of ``games``; an illegal move is a loss, so
    ``win + draw + loss == 1`` and ``illegal <= loss``); ``moves``: mean moves per game by the
    policy."""

    games: int
    win: float
    draw: float
    loss: float
    illegal: float
    moves: float


def tic_tac_toe_stats(trajectories: Sequence[Trajectory]) -> TicTacToeStats:
    """:class:`TicTacToeStats` of finished games, from the metrics of each trajectory's last step.

    Example::

        stats = tic_tac_toe_stats([t for r in rollouts if r.group for t in r.group.trajectories_G])
    """
    rows: list[tuple[float, float, float, float, float]] = []
    for traj in trajectories:
        if not traj.transitions:
            continue
        m = traj.transitions[-1].metrics
        rows.append(
            (
                float(m.get("ttt/won", 0)),
                float(m.get("ttt/draw", 0)),
                float(m.get("ttt/lost", 0)),
                float(m.get("ttt/illegal", 0)),
                float(m.get("ttt/moves", 0)),
            )
        )
    if not rows:
        nan = float("nan")
        return TicTacToeStats(0, nan, nan, nan, nan, nan)
    win, draw, loss, illegal, moves = (float(x) for x in np.mean(np.asarray(rows), axis=0))
    return TicTacToeStats(len(rows), win, draw, loss, illegal, moves)

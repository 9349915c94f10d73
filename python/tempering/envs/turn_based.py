"""The plumbing every two-player, turn-taking game shares (Nim, tic-tac-toe).

The envs of one group are the players of one game; each player's env waits (in
``initial_observation`` or ``step``) until the opponent has moved, so the builder sets
``coordinated_envs = True``. A game subclasses :class:`TurnBasedGame` (its state and
:meth:`~TurnBasedGame.apply`), a player :class:`TurnBasedPlayer` (what it sees and how a reply
parses), and the env that renders a player is a :class:`TurnBasedPlayerEnv`. A game's group
builder subclasses :class:`TurnBasedGroupBuilder` (a new game, and a finished game's reward).

- A player who waits longer than ``turn_timeout_s`` for the opponent wins by forfeit, so a game
  never hangs on a failed or absent opponent.
- A player whose episode ends while the game goes on (an unparseable reply, a context overflow)
  resigns: its move is ``None``, which loses, so the opponent is told at once.

Example::

    class CountGame(TurnBasedGame[int]):
        def apply(self, player: int, move: int | None) -> None:
            ...  # update the state; set self.winner; hand the turn over: self.turn = 1 - player
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, Generic, TypeVar

import attrs

from tempering.envs.message import MessageEnvAdapter, MessageStepResult
from tempering_protocols import (
    Action,
    Env,
    EnvGroupBuilder,
    Message,
    Metrics,
    Renderer,
    StepResult,
    Trajectory,
)

__all__ = ["TurnBasedGame", "TurnBasedGroupBuilder", "TurnBasedPlayer", "TurnBasedPlayerEnv", "players_of"]

_Move = TypeVar("_Move")
_Game = TypeVar("_Game", bound="TurnBasedGame[Any]")
_Player = TypeVar("_Player", bound="TurnBasedPlayer[Any]")


class TurnBasedGame(ABC, Generic[_Move]):
    """The shared state of one game between players 0 and 1 (player 0 moves first).

    ``winner``: the winning player, ``None`` while the game is on (or after a draw, for games
    that have one: they override :attr:`over`).
    """

    def __init__(self, turn_timeout_s: float) -> None:
        self.turn = 0
        self.winner: int | None = None
        self.turn_timeout_s = turn_timeout_s
        self.changed = asyncio.Condition()

    @property
    def over(self) -> bool:
        return self.winner is not None

    @abstractmethod
    def apply(self, player: int, move: _Move | None) -> None:
        """Apply ``player``'s move to a game that is on (``None``: an illegal move or a
        resignation, which loses); hand the turn over when the game goes on."""

    def forfeit(self, waiting: int) -> None:
        """``waiting``'s opponent did not move in time: ``waiting`` wins."""
        self.winner = waiting

    async def wait_turn(self, player: int) -> None:
        """Wait until it is ``player``'s turn or the game is over; a silent opponent forfeits."""
        async with self.changed:
            try:
                async with asyncio.timeout(self.turn_timeout_s):
                    await self.changed.wait_for(lambda: self.over or self.turn == player)
            except TimeoutError:
                if not self.over:
                    self.forfeit(player)
                self.changed.notify_all()

    async def move(self, player: int, move: _Move | None) -> None:
        """Apply ``player``'s move (ignored once the game is over) and wake the opponent."""
        async with self.changed:
            if not self.over:
                self.apply(player, move)
            self.changed.notify_all()


class TurnBasedPlayer(ABC, Generic[_Game]):
    """One player of a :class:`TurnBasedGame`, as a message-level env (``MessageEnv``)."""

    def __init__(self, game: _Game, player: int) -> None:
        self.game = game
        self.player = player

    @abstractmethod
    def next_messages(self, reply: Message | None) -> list[Message]:
        """The conversation the player sees on its turn (after its own ``reply``; ``None`` on
        the first turn)."""

    @abstractmethod
    def parse(self, text: str) -> object | None:
        """The move a reply names, or ``None`` when it names none (an illegal move)."""

    @abstractmethod
    def final_metrics(self) -> Metrics:
        """The metrics of the player's last step."""

    def resign_metrics(self) -> Metrics:
        """Metrics added to the step on which the player resigned (default: none)."""
        return {}

    def _over(self) -> MessageStepResult:
        return MessageStepResult(reward=0.0, episode_done=True, metrics=self.final_metrics())

    async def initial_messages(self) -> Sequence[Message]:
        await self.game.wait_turn(self.player)
        return self.next_messages(None)

    async def step(self, message: Message, /) -> MessageStepResult:
        if self.game.over:
            return self._over()
        await self.game.move(self.player, self.parse(message["content"]))
        if self.game.over:
            return self._over()
        await self.game.wait_turn(self.player)
        if self.game.over:
            return self._over()
        return MessageStepResult(reward=0.0, episode_done=False, next_messages=self.next_messages(message))


class TurnBasedPlayerEnv(MessageEnvAdapter):
    """A :class:`TurnBasedPlayer` through the renderer (an unparseable reply scores 0 and ends
    the episode); a player whose episode ends while the game is on resigns."""

    def __init__(
        self,
        player: TurnBasedPlayer[Any],
        renderer: Renderer,
        max_context_tokens: int | None = None,
    ) -> None:
        super().__init__(
            player, renderer, max_context_tokens=max_context_tokens, on_parse_error="penalty", penalty=0.0
        )
        self.player = player

    async def step(self, action: Action, /) -> StepResult:
        result = await super().step(action)
        if result.episode_done and not self.player.game.over:
            await self.player.game.move(self.player.player, None)
            extra = self.player.resign_metrics()
            return attrs.evolve(result, metrics={**result.metrics, **extra}) if extra else result
        return result


def players_of(envs_G: Sequence[Env], kind: type[_Player]) -> list[_Player | None]:
    """The ``kind`` player inside each env of a group (``None`` for an env that is not one)."""
    out: list[_Player | None] = []
    for env in envs_G:
        inner = env.env if isinstance(env, MessageEnvAdapter) else None
        out.append(inner if isinstance(inner, kind) else None)
    return out


@attrs.frozen
class TurnBasedGroupBuilder(EnvGroupBuilder, ABC, Generic[_Player]):
    """``n_games`` games; both players of each game are members of the group (``[game0 player 0,
    game0 player 1, game1 player 0, …]``), and a finished game's outcome is the group reward.

    A subclass sets ``player_type`` (its :class:`TurnBasedPlayer`, built as ``player_type(game,
    player)``) and ``unfinished_metrics`` (a member whose game did not finish scores 0 with
    these), and defines :meth:`new_game` and :meth:`outcome`.
    """

    coordinated_envs: ClassVar[bool] = True
    player_type: ClassVar[type[Any]]
    unfinished_metrics: ClassVar[Metrics] = {}
    renderer: Renderer = attrs.field(eq=False)
    n_games: int = 1
    turn_timeout_s: float = 60.0
    max_context_tokens: int | None = None
    tag: str = "turn_based"

    def __attrs_post_init__(self) -> None:
        name = type(self).__name__
        if self.n_games < 1:
            raise ValueError(f"{name}: n_games must be >= 1, got {self.n_games}")
        if self.turn_timeout_s <= 0:
            raise ValueError(f"{name}: turn_timeout_s must be > 0, got {self.turn_timeout_s}")

    @abstractmethod
    def new_game(self) -> TurnBasedGame[Any]:
        """A fresh game for two of the group's members."""

    @abstractmethod
    def outcome(self, player: _Player) -> tuple[float, Metrics]:
        """The group reward and metrics of ``player``, whose game is over."""

    async def make_envs(self) -> Sequence[Env]:
        envs: list[Env] = []
        for _ in range(self.n_games):
            game = self.new_game()
            for player in (0, 1):
                inner: TurnBasedPlayer[Any] = self.player_type(game, player)
                envs.append(TurnBasedPlayerEnv(inner, self.renderer, self.max_context_tokens))
        return envs

    async def compute_group_rewards(
        self, trajectories_G: Sequence[Trajectory], envs_G: Sequence[Env], /
    ) -> list[tuple[float, Metrics]]:
        out: list[tuple[float, Metrics]] = []
        for inner in players_of(envs_G, self.player_type):
            if inner is None or not inner.game.over:
                out.append((0.0, dict(self.unfinished_metrics)))
            else:
                out.append(self.outcome(inner))
        return out

    def logging_tags(self) -> list[str]:
        return [self.tag]

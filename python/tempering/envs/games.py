"""Multi-agent environments: the envs of one group are the players of one game.

Turn-taking is coordinated inside the group: each player's env waits (in
``initial_observation`` or ``step``) until the opponent has moved, so the rollout runner must
play the members concurrently. The builder says so with ``coordinated_envs = True`` (the runner
then skips the shared first turn and never retries one member alone). The game's outcome is the
group reward (``compute_group_rewards``): +1 for the winner, -1 for the loser, so self-play
trains both sides from one group.

A player whose episode ends while the game goes on (an unparseable reply, a context overflow)
loses at once, so the opponent is told straight away. A player who waits longer than
``turn_timeout_s`` for the opponent wins by forfeit: a game never hangs on a failed or absent
opponent (this is also how the conformance kit, which plays members one after another, gets
through a game).

:class:`NimGroupBuilder` plays Nim: a pile of ``pile`` stones, players alternately take 1, 2 or
3; whoever takes the last stone wins; an invalid move loses at once. ``n_games`` games per
group, members ordered ``[game0 first, game0 second, game1 first, …]``.

Example::

    builder = NimGroupBuilder(renderer, pile=7, n_games=4)
    rollout = await rollout_group(builder, policy, RolloutConfig())
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import ClassVar

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

__all__ = ["NimGame", "NimGroupBuilder", "NimPlayer"]

_RULES = "Nim: players take turns removing 1, 2 or 3 stones. Whoever takes the last stone wins."


class NimGame:
    """The shared state of one game of Nim between players 0 and 1 (player 0 moves first)."""

    def __init__(self, pile: int, turn_timeout_s: float) -> None:
        self.pile = pile
        self.turn = 0
        self.winner: int | None = None
        self.last_take: int | None = None
        self.turn_timeout_s = turn_timeout_s
        self.changed = asyncio.Condition()

    async def wait_turn(self, player: int) -> None:
        """Wait until it is ``player``'s turn or the game is over; a silent opponent forfeits."""
        async with self.changed:
            try:
                async with asyncio.timeout(self.turn_timeout_s):
                    await self.changed.wait_for(lambda: self.winner is not None or self.turn == player)
            except TimeoutError:
                self.winner = player
                self.changed.notify_all()

    async def resign(self, player: int) -> None:
        """``player`` leaves the game (its episode ended early): if the game is on, it loses."""
        await self.move(player, None)

    async def move(self, player: int, take: int | None) -> None:
        """Apply ``player``'s move (``None``: invalid, which loses)."""
        async with self.changed:
            if self.winner is None:
                if take is None or not 1 <= take <= min(3, self.pile):
                    self.winner = 1 - player
                else:
                    self.pile -= take
                    self.last_take = take
                    if self.pile == 0:
                        self.winner = player
                    self.turn = 1 - player
            self.changed.notify_all()


class NimPlayer:
    """One player of a :class:`NimGame`, as a message-level env."""

    def __init__(self, game: NimGame, player: int) -> None:
        self.game = game
        self.player = player
        self.history: list[Message] = [{"role": "system", "content": _RULES}]

    def _prompt(self) -> Message:
        lead = "" if self.game.last_take is None else f"Opponent took {self.game.last_take}. "
        return {"role": "user", "content": f"{lead}Pile: {self.game.pile}. Take 1, 2 or 3."}

    def _over(self) -> MessageStepResult:
        return MessageStepResult(reward=0.0, episode_done=True, metrics={"game/won": int(self.won)})

    @property
    def won(self) -> bool:
        return self.game.winner == self.player

    async def initial_messages(self) -> Sequence[Message]:
        await self.game.wait_turn(self.player)
        self.history.append(self._prompt())
        return list(self.history)

    async def step(self, message: Message, /) -> MessageStepResult:
        if self.game.winner is not None:
            return self._over()
        text = message["content"].strip()
        await self.game.move(self.player, int(text) if text in {"1", "2", "3"} else None)
        if self.game.winner is not None:
            return self._over()
        await self.game.wait_turn(self.player)
        if self.game.winner is not None:
            return self._over()
        self.history += [message, self._prompt()]
        return MessageStepResult(reward=0.0, episode_done=False, next_messages=list(self.history))


class _NimPlayerEnv(MessageEnvAdapter):
    """A :class:`NimPlayer` through the renderer; a player whose episode ends while the game is
    on (unparseable reply, context overflow) resigns, so the opponent does not wait for it."""

    def __init__(self, player: NimPlayer, renderer: Renderer, max_context_tokens: int | None) -> None:
        super().__init__(
            player, renderer, max_context_tokens=max_context_tokens, on_parse_error="penalty", penalty=0.0
        )
        self.player = player

    async def step(self, action: Action, /) -> StepResult:
        result = await super().step(action)
        if result.episode_done and self.player.game.winner is None:
            await self.player.game.resign(self.player.player)
        return result


@attrs.frozen
class NimGroupBuilder(EnvGroupBuilder):
    """``n_games`` games of Nim; both players of each game are members of the group.

    Example::

        check_env_group_builder(NimGroupBuilder(renderer, pile=5, turn_timeout_s=0.05))
    """

    coordinated_envs: ClassVar[bool] = True
    renderer: Renderer = attrs.field(eq=False)
    pile: int = 7
    n_games: int = 1
    turn_timeout_s: float = 60.0
    max_context_tokens: int | None = None
    tag: str = "nim"

    async def make_envs(self) -> Sequence[Env]:
        envs: list[Env] = []
        for _ in range(self.n_games):
            game = NimGame(self.pile, self.turn_timeout_s)
            for player in (0, 1):
                envs.append(_NimPlayerEnv(NimPlayer(game, player), self.renderer, self.max_context_tokens))
        return envs

    async def compute_group_rewards(
        self, trajectories_G: Sequence[Trajectory], envs_G: Sequence[Env], /
    ) -> list[tuple[float, Metrics]]:
        out: list[tuple[float, Metrics]] = []
        for env in envs_G:
            inner = env.env if isinstance(env, MessageEnvAdapter) else None
            if not isinstance(inner, NimPlayer) or inner.game.winner is None:
                out.append((0.0, {"game/won": 0}))
                continue
            out.append((1.0 if inner.won else -1.0, {"game/won": int(inner.won)}))
        return out

    def logging_tags(self) -> list[str]:
        return [self.tag]

"""Multi-agent environments: the envs of one group are the players of one game.

Turn-taking, forfeits and resignations are :mod:`tempering.envs.turn_based`'s (shared with
tic-tac-toe): each player's env waits for the opponent, so the builder sets
``coordinated_envs = True`` (the runner then skips the shared first turn and never retries one
member alone). The game's outcome is the group reward (``compute_group_rewards``): +1 for the
winner, -1 for the loser, so self-play trains both sides from one group. A player who waits
longer than ``turn_timeout_s`` wins by forfeit (this is also how the conformance kit, which
plays members one after another, gets through a game).

:class:`NimGroupBuilder` plays Nim: a pile of ``pile`` stones, players alternately take 1, 2 or
3; whoever takes the last stone wins; an invalid move loses at once. ``n_games`` games per
group, members ordered ``[game0 first, game0 second, game1 first, …]``.

Example::

    builder = NimGroupBuilder(renderer, pile=7, n_games=4)
    rollout = await rollout_group(builder, policy, RolloutConfig())
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from tempering.envs.turn_based import TurnBasedGame, TurnBasedGroupBuilder, TurnBasedPlayer
from tempering_protocols import Message, Metrics

__all__ = ["NimGame", "NimGroupBuilder", "NimPlayer"]

_RULES = "Nim: players take turns removing 1, 2 or 3 stones. Whoever takes the last stone wins."


class NimGame(TurnBasedGame[int]):
    """The shared state of one game of Nim between players 0 and 1 (player 0 moves first)."""

    def __init__(self, pile: int, turn_timeout_s: float) -> None:
        super().__init__(turn_timeout_s)
        self.pile = pile
        self.last_take: int | None = None

    def apply(self, player: int, move: int | None) -> None:
        """Take ``move`` stones (``None`` or more than allowed: invalid, which loses)."""
        if move is None or not 1 <= move <= min(3, self.pile):
            self.winner = 1 - player
            return
        self.pile -= move
        self.last_take = move
        if self.pile == 0:
            self.winner = player
        self.turn = 1 - player

    async def resign(self, player: int) -> None:
        """``player`` leaves the game (its episode ended early): if the game is on, it loses."""
        await self.move(player, None)


class NimPlayer(TurnBasedPlayer[NimGame]):
    """One player of a :class:`NimGame`, as a message-level env; it sees the whole game so far."""

    def __init__(self, game: NimGame, player: int) -> None:
        super().__init__(game, player)
        self.history: list[Message] = [{"role": "system", "content": _RULES}]

    def _prompt(self) -> Message:
        lead = "" if self.game.last_take is None else f"Opponent took {self.game.last_take}. "
        return {"role": "user", "content": f"{lead}Pile: {self.game.pile}. Take 1, 2 or 3."}

    @property
    def won(self) -> bool:
        return self.game.winner == self.player

    def next_messages(self, reply: Message | None) -> list[Message]:
        if reply is not None:
            self.history.append(reply)
        self.history.append(self._prompt())
        return list(self.history)

    def parse(self, text: str) -> int | None:
        text = text.strip()
        return int(text) if text in {"1", "2", "3"} else None

    def final_metrics(self) -> Metrics:
        return {"game/won": int(self.won)}


@attrs.frozen
class NimGroupBuilder(TurnBasedGroupBuilder[NimPlayer]):
    """``n_games`` games of Nim from a pile of ``pile``; both players of each game are members
    of the group (turn-taking, validation and rewards: :class:`TurnBasedGroupBuilder`).

    Example::

        check_env_group_builder(NimGroupBuilder(renderer, pile=5, turn_timeout_s=0.05))
    """

    player_type: ClassVar[type[NimPlayer]] = NimPlayer
    unfinished_metrics: ClassVar[Metrics] = {"game/won": 0}
    pile: int = 7
    tag: str = "nim"

    def new_game(self) -> NimGame:
        return NimGame(self.pile, self.turn_timeout_s)

    def outcome(self, player: NimPlayer) -> tuple[float, Metrics]:
        return (1.0 if player.won else -1.0, {"game/won": int(player.won)})

"""Environments written at the level of chat messages, made token-level through a renderer.

A :class:`MessageEnv` sees the assistant's parsed reply and answers with the whole conversation
so far (and a reward). :class:`MessageEnvAdapter` turns it into a token-level
:class:`tempering_protocols.Env`: it renders each conversation as a generation prompt and parses
each sampled action with the renderer. With a renderer that extends prefixes
(``renderer.extends_prefix``), every observation extends the previous observation plus action,
so a multi-turn trajectory packs into one datum.

Two failures are handled by policy (:data:`OnFailure`):

=======================  =================================================================
failure                  ``"penalty"``                      ``"mask"``
=======================  =================================================================
unparseable response     end the episode, reward ``penalty``  end the episode, reward 0, the
                                                              turn masked (no gradient)
context overflow         end the episode, reward + ``penalty``  end the episode, the turn masked
=======================  =================================================================

Overflow: the next prompt plus ``max_tokens_per_turn`` would exceed ``max_context_tokens``.
Metrics: ``message/parse_error``, ``message/context_overflow`` (1 when it happened).

Example::

    env = MessageEnvAdapter(MyChatEnv(), renderer, max_context_tokens=4096,
                            max_tokens_per_turn=256, on_parse_error="mask")
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, Literal, Protocol, TypeVar, runtime_checkable

import attrs
import tinker

from tempering_protocols import (
    Action,
    Env,
    Message,
    Metrics,
    Observation,
    Renderer,
    StepResult,
    StopCondition,
)
from tempering_protocols.rl import MASK_TURN

__all__ = [
    "GameEnvAdapter",
    "GameWithUnparsedReplies",
    "MessageEnv",
    "MessageEnvAdapter",
    "MessageStepResult",
    "OnFailure",
    "PrefixedFigures",
]

OnFailure = Literal["penalty", "mask"]


class PrefixedFigures:
    """For an attrs class of episode figures (games played, rates, means): :meth:`as_dict`."""

    def as_dict(self, prefix: str) -> dict[str, float]:
        """The figures as ``{f"{prefix}_{name}": value}``."""
        assert attrs.has(type(self)), "PrefixedFigures is for attrs classes"
        return {f"{prefix}_{k}": float(v) for k, v in attrs.asdict(self).items()}


@attrs.frozen
class MessageStepResult:
    """What :meth:`MessageEnv.step` returns: ``next_messages`` is the whole conversation so far
    (including the assistant's reply) when the episode goes on."""

    reward: float
    episode_done: bool
    next_messages: Sequence[Message] = ()
    metrics: Metrics = attrs.field(factory=dict[str, float | int])


@runtime_checkable
class MessageEnv(Protocol):
    """A single-use environment that talks in chat messages.

    Example::

        class Echo:
            async def initial_messages(self):
                return [{"role": "user", "content": "say hi"}]
            async def step(self, message):
                return MessageStepResult(reward=float(message["content"] == "hi"), episode_done=True)
    """

    async def initial_messages(self) -> Sequence[Message]: ...

    async def step(self, message: Message, /) -> MessageStepResult: ...


class MessageEnvAdapter(Env):
    """A :class:`MessageEnv` as a token-level ``Env``; see the module docstring for policies."""

    def __init__(
        self,
        env: MessageEnv,
        renderer: Renderer,
        *,
        max_context_tokens: int | None = None,
        max_tokens_per_turn: int = 0,
        on_parse_error: OnFailure = "penalty",
        on_overflow: OnFailure = "penalty",
        penalty: float = -1.0,
    ) -> None:
        self.env = env
        self.renderer = renderer
        self.max_context_tokens = max_context_tokens
        self.max_tokens_per_turn = max_tokens_per_turn
        self.on_parse_error: OnFailure = on_parse_error
        self.on_overflow: OnFailure = on_overflow
        self.penalty = penalty
        self._done = False

    def _stop(self) -> StopCondition:
        return self.renderer.get_stop_sequences()

    def _end(self, reward: float, metrics: Metrics) -> StepResult:
        self._done = True
        return StepResult(
            reward=reward,
            episode_done=True,
            next_observation=tinker.ModelInput.empty(),
            next_stop_condition=self._stop(),
            metrics=metrics,
        )

    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        messages = await self.env.initial_messages()
        return self.renderer.build_generation_prompt(messages), self._stop()

    async def step(self, action: Action, /) -> StepResult:
        if self._done:
            raise RuntimeError("the episode is over; envs are single-use")
        message, parsed = self.renderer.parse_response(action)
        if not parsed:
            metrics: Metrics = {"message/parse_error": 1}
            if self.on_parse_error == "mask":
                return self._end(0.0, {**metrics, MASK_TURN: 1})
            return self._end(self.penalty, metrics)
        result = await self.env.step(message)
        metrics = {**result.metrics, "message/parse_error": 0}
        if result.episode_done:
            return self._end(result.reward, metrics)
        observation = self.renderer.build_generation_prompt(result.next_messages)
        if (
            self.max_context_tokens is not None
            and observation.length + self.max_tokens_per_turn > self.max_context_tokens
        ):
            metrics["message/context_overflow"] = 1
            if self.on_overflow == "mask":
                return self._end(result.reward, {**metrics, MASK_TURN: 1})
            return self._end(result.reward + self.penalty, metrics)
        return StepResult(
            reward=result.reward,
            episode_done=False,
            next_observation=observation,
            next_stop_condition=self._stop(),
            metrics=metrics,
        )


class GameWithUnparsedReplies(MessageEnv, Protocol):
    """A :class:`MessageEnv` game that a reply which does not parse ends (an invalid move)."""

    @property
    def done(self) -> bool: ...

    def unparsed_reply(self, reward: float, /) -> MessageStepResult:
        """End the game for a reply that did not parse, with ``reward``; its final result."""
        ...


_Game = TypeVar("_Game", bound=GameWithUnparsedReplies)


class GameEnvAdapter(MessageEnvAdapter, Generic[_Game]):
    """A game through a renderer: a reply that does not parse ends the game with ``penalty``,
    and the game's final metrics join the step's (see :class:`GameWithUnparsedReplies`)."""

    def __init__(self, game: _Game, renderer: Renderer, *, penalty: float) -> None:
        super().__init__(game, renderer, on_parse_error="penalty", penalty=penalty)
        self.game = game

    async def step(self, action: Action, /) -> StepResult:
        result = await super().step(action)
        if result.metrics.get("message/parse_error", 0) and not self.game.done:
            ended = self.game.unparsed_reply(result.reward)
            return attrs.evolve(result, metrics={**result.metrics, **ended.metrics})
        return result

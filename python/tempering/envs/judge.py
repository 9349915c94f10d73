"""Rewards from an LLM judge: a rubric prompt, a parsed score, and clear failures.

:class:`LLMJudge` asks a :class:`~tempering_protocols.MessageCompleter` (an
:class:`~tempering.envs.completer.SamplingMessageCompleter`, or any other) to grade a reply by a
rubric. The judge must end its verdict with a line ``Score: N``, ``N`` between ``min_score`` and
``max_score``; :func:`parse_score` reads the last such line and raises :class:`JudgeParseError`
(which says what was expected and quotes the judge) when there is none or it is out of range.
:meth:`LLMJudge.judge` never raises for the judge's own failures: it returns a
:class:`Verdict` whose ``status`` is ``ok``, ``unparsed`` (no score in the output), ``timeout``
(no answer within ``timeout_s``) or ``error`` (the completer raised), with ``reward`` the score
scaled to ``[0, 1]`` when ``ok`` and ``None`` otherwise.

:class:`RubricEnv` is a single-turn env graded by a judge; a verdict without a score gives no
reward (0) and, by default, masks the turn (no gradient from a reply nobody graded); metrics
``judge/ok``, ``judge/unparsed``, ``judge/timeout``, ``judge/error``, ``judge/score``.

Example::

    judge = LLMJudge(completer, rubric="Award 10 for a correct, concise answer, 0 for a wrong one.")
    verdict = await judge.judge("What is 2+2?", "4", reference="4")
    verdict.reward        # 1.0 when the judge wrote "Score: 10"
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from typing import Literal

import attrs

from tempering.envs.message import MessageEnvAdapter, MessageStepResult, OnFailure
from tempering_protocols import Env, EnvGroupBuilder, Message, MessageCompleter, Metrics, Renderer
from tempering_protocols.rl import MASK_TURN

__all__ = [
    "JUDGE_TEMPLATE",
    "JudgeParseError",
    "LLMJudge",
    "RubricEnv",
    "RubricGroupBuilder",
    "Verdict",
    "VerdictStatus",
    "parse_score",
    "verdict_metrics",
]

VerdictStatus = Literal["ok", "unparsed", "timeout", "error"]

JUDGE_TEMPLATE = """Grade the reply by the rubric.
Rubric: {rubric}
Question: {prompt}
{reference}Reply: {response}
End with a line "Score: N", N from {min_score:g} to {max_score:g}."""
"""The judge's user message; ``{reference}`` is ``"Reference answer: …\\n"`` or empty."""

_SCORE = re.compile(r"score\s*[:=]\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)


class JudgeParseError(ValueError):
    """The judge's output has no ``Score: N`` line in range."""


def parse_score(text: str, min_score: float = 0.0, max_score: float = 10.0) -> float:
    """The number of the last ``Score: N`` in ``text``; :class:`JudgeParseError` when there is
    none or it is outside ``[min_score, max_score]``.

    Example::

        parse_score("Correct and concise.\\nScore: 9")     # 9.0
    """
    found = _SCORE.findall(text)
    excerpt = text if len(text) <= 200 else f"{text[:200]}..."
    if not found:
        raise JudgeParseError(f"the judge's output has no 'Score: N' line; it wrote: {excerpt!r}")
    score = float(found[-1])
    if not min_score <= score <= max_score:
        raise JudgeParseError(
            f"the judge's score {score:g} is outside {min_score:g}..{max_score:g}; it wrote: {excerpt!r}"
        )
    return score


@attrs.frozen
class Verdict:
    """A judge's verdict: ``status``, ``score`` (the parsed number), ``reward`` (``score``
    scaled to ``[0, 1]``; ``None`` unless ``ok``), the judge's ``text`` and, on failure, ``error``."""

    status: VerdictStatus
    score: float | None
    reward: float | None
    text: str
    error: str = ""


@attrs.frozen
class LLMJudge:
    """A rubric judge over a message completer (see the module docstring)."""

    completer: MessageCompleter = attrs.field(eq=False)
    rubric: str
    min_score: float = 0.0
    max_score: float = 10.0
    timeout_s: float = 60.0
    system_prompt: str = "You are a strict, fair grader."

    def __attrs_post_init__(self) -> None:
        if not self.max_score > self.min_score:
            raise ValueError(
                f"LLMJudge: max_score ({self.max_score}) must exceed min_score ({self.min_score})"
            )
        if not self.timeout_s > 0:
            raise ValueError(f"LLMJudge: timeout_s must be > 0, got {self.timeout_s}")

    def messages(self, prompt: str, response: str, reference: str | None = None) -> list[Message]:
        """The conversation the judge answers."""
        ref = "" if reference is None else f"Reference answer: {reference}\n"
        text = JUDGE_TEMPLATE.format(
            rubric=self.rubric,
            prompt=prompt,
            reference=ref,
            response=response,
            min_score=self.min_score,
            max_score=self.max_score,
        )
        system: list[Message] = (
            [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        )
        return [*system, {"role": "user", "content": text}]

    async def judge(self, prompt: str, response: str, reference: str | None = None) -> Verdict:
        """Grade ``response`` to ``prompt``; never raises for the judge's failures."""
        try:
            async with asyncio.timeout(self.timeout_s):
                reply = await self.completer(self.messages(prompt, response, reference))
        except TimeoutError:
            return Verdict(
                "timeout", None, None, "", f"the judge gave no verdict within {self.timeout_s:g} s"
            )
        except Exception as exc:
            return Verdict("error", None, None, "", f"the judge raised {type(exc).__name__}: {exc}")
        text = reply["content"]
        try:
            score = parse_score(text, self.min_score, self.max_score)
        except JudgeParseError as exc:
            return Verdict("unparsed", None, None, text, str(exc))
        return Verdict("ok", score, (score - self.min_score) / (self.max_score - self.min_score), text)


def verdict_metrics(verdict: Verdict) -> Metrics:
    """``judge/<status>`` counts (1 for this verdict's, 0 for the others) and ``judge/score``."""
    metrics: Metrics = {
        f"judge/{s}": int(verdict.status == s) for s in ("ok", "unparsed", "timeout", "error")
    }
    if verdict.reward is not None:
        metrics["judge/score"] = verdict.reward
    return metrics


class RubricEnv:
    """One reply to ``prompt``, graded by ``judge`` (with ``reference`` when given); single-turn.
    ``on_judge_failure``: ``"mask"`` (default) gives reward 0 and masks the turn, ``"penalty"``
    gives reward 0 and keeps it (the reply is trained towards as a 0)."""

    def __init__(
        self,
        prompt: str,
        judge: LLMJudge,
        *,
        reference: str | None = None,
        on_judge_failure: OnFailure = "mask",
    ) -> None:
        self.prompt = prompt
        self.judge = judge
        self.reference = reference
        self.on_judge_failure: OnFailure = on_judge_failure
        self.verdict: Verdict | None = None

    async def initial_messages(self) -> Sequence[Message]:
        return [{"role": "user", "content": self.prompt}]

    async def step(self, message: Message, /) -> MessageStepResult:
        if self.verdict is not None:
            raise RuntimeError("RubricEnv is single-use and this episode is over")
        self.verdict = await self.judge.judge(self.prompt, message["content"], self.reference)
        metrics = verdict_metrics(self.verdict)
        if self.verdict.reward is None and self.on_judge_failure == "mask":
            metrics[MASK_TURN] = 1
        return MessageStepResult(reward=self.verdict.reward or 0.0, episode_done=True, metrics=metrics)


@attrs.frozen
class RubricGroupBuilder(EnvGroupBuilder):
    """``group_size`` judged replies to one prompt.

    Example::

        builder = RubricGroupBuilder("What is 2+2?", renderer, judge, reference="4", group_size=8)
    """

    prompt: str
    renderer: Renderer = attrs.field(eq=False)
    judge: LLMJudge = attrs.field(eq=False)
    reference: str | None = None
    group_size: int = 8
    on_judge_failure: OnFailure = "mask"
    tag: str = "rubric"

    async def make_envs(self) -> Sequence[Env]:
        return [
            MessageEnvAdapter(
                RubricEnv(
                    self.prompt, self.judge, reference=self.reference, on_judge_failure=self.on_judge_failure
                ),
                self.renderer,
                on_parse_error="penalty",
                penalty=0.0,
            )
            for _ in range(self.group_size)
        ]

    def logging_tags(self) -> list[str]:
        return [self.tag]

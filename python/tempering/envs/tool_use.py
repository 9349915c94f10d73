"""Multi-turn tool use: the model calls tools until it gives a final answer or a budget runs out.

:class:`ToolEnv` is a :class:`~tempering.envs.message.MessageEnv`. Each assistant reply the
renderer parsed either calls tools (``tool_calls``; calls the renderer could not parse come as
``unparsed_tool_calls``) or, with no call, is the final answer, graded by ``grader(content,
answer)``. The calls of one reply run concurrently (:func:`tempering.tools.run_tool_call`, each
with ``tool_timeout_s``); each result, or its error as text, goes back as a ``tool`` message
(``tool_call_id`` and ``name`` set), capped at ``max_result_chars``. A tool that raises, hangs or
returns something other than text costs the model nothing but that error text; the episode goes
on.

Budgets (:class:`ToolBudget`) end the episode with ``no_answer_reward`` (default 0):
``max_turns`` assistant replies, ``max_tool_calls`` calls in all (a reply that would go past it
is not run), ``max_sampled_tokens`` tokens sampled in all (counted by :class:`ToolEnvAdapter`,
which is how the env gets to the model: it also declares the tools with
:func:`tempering.tools.tool_prefix`).

Metrics of each step (counts of that step): ``tools/calls``, ``tools/errors``,
``tools/timeouts``, ``tools/truncated``, ``tools/unparsed``, and per tool
``tools/<name>/calls|errors|timeouts|budget_stops`` (errors: every status but ``ok``); on the
last step ``tool_use/answered``, ``tool_use/correct`` (also as ``correct``, which the RL loop
logs as ``env/correct``), ``tool_use/turns``, ``tool_use/tool_calls`` and
``tool_use/budget_stop/<turns|tool_calls|tokens>``.

Example::

    env = ToolEnvAdapter(
        ToolEnv([{"role": "user", "content": "What is 17 * 23?"}], [calculator], "391",
                first_number_match),
        renderer, system_prompt="Use the tools, then answer with a number.")
"""

from __future__ import annotations

import asyncio
from collections.abc import Container, Sequence
from typing import Any, Literal, cast

import attrs

from tempering.envs.message import MessageEnvAdapter, MessageStepResult, OnFailure
from tempering.envs.problem import Grader, RepeatedEnvGroup
from tempering.tools import Tool, ToolOutcome, run_tool_call, tool_prefix
from tempering_protocols import (
    Action,
    Env,
    Message,
    Metrics,
    Renderer,
    StepResult,
    Trajectory,
)
from tempering_protocols.rl import TOOL_CALLS

__all__ = [
    "BudgetStop",
    "ToolBudget",
    "ToolEnv",
    "ToolEnvAdapter",
    "ToolUseGroupBuilder",
    "ToolUseStats",
    "tool_use_stats",
]

BudgetStop = Literal["turns", "tool_calls", "tokens"]


@attrs.frozen(kw_only=True)
class ToolBudget:
    """The limits of one tool-use episode (see the module docstring)."""

    max_turns: int = 4
    max_tool_calls: int = 8
    max_sampled_tokens: int | None = None
    tool_timeout_s: float = 10.0
    max_result_chars: int | None = 2000

    def __attrs_post_init__(self) -> None:
        for name in ("max_turns", "max_tool_calls", "max_sampled_tokens", "max_result_chars"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"ToolBudget.{name} must be >= 1, got {value}")
        if not self.tool_timeout_s > 0:
            raise ValueError(f"ToolBudget.tool_timeout_s must be > 0, got {self.tool_timeout_s}")


def _count(metrics: Metrics, key: str, n: int = 1) -> None:
    metrics[key] = metrics.get(key, 0) + n


UNDECLARED_TOOL = "undeclared"
"""The name under which calls of tools the env does not declare are counted
(``tools/undeclared/calls``): a model that invents names cannot add metric keys without bound."""


def _metric_name(name: str, declared: Container[str]) -> str:
    return name if name in declared else UNDECLARED_TOOL


def _outcome_metrics(outcomes: Sequence[ToolOutcome], declared: Container[str]) -> Metrics:
    metrics: Metrics = {
        "tools/calls": len(outcomes),
        "tools/errors": 0,
        "tools/timeouts": 0,
        "tools/truncated": 0,
    }
    for o in outcomes:
        name = _metric_name(o.name, declared)
        _count(metrics, f"tools/{name}/calls")
        if not o.ok:
            _count(metrics, "tools/errors")
            _count(metrics, f"tools/{name}/errors")
        if o.status == "timeout":
            _count(metrics, "tools/timeouts")
            _count(metrics, f"tools/{name}/timeouts")
        if o.truncated:
            _count(metrics, "tools/truncated")
    return metrics


class ToolEnv:
    """One tool-use episode: ``messages`` (the conversation to answer; the tool declaration is
    the adapter's), ``tools``, the reference ``answer`` and the ``grader`` of the final answer.
    Single-use. ``stats`` holds the episode's totals (the last step's metrics)."""

    def __init__(
        self,
        messages: Sequence[Message],
        tools: Sequence[Tool],
        answer: str,
        grader: Grader,
        *,
        budget: ToolBudget | None = None,
        no_answer_reward: float = 0.0,
        prefix: Sequence[Message] = (),
    ) -> None:
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise ValueError(f"ToolEnv: tool names must be unique, got {names}")
        self.messages: list[Message] = [*prefix, *messages]
        self.tools = {t.name: t for t in tools}
        self.answer = answer
        self.grader = grader
        self.budget = budget or ToolBudget()
        self.no_answer_reward = no_answer_reward
        self.turns = 0
        self.tool_calls = 0
        self.sampled_tokens = 0
        self.done = False

    def declare(self, renderer: Renderer, system_prompt: str = "") -> None:
        """Put the tool declaration (the renderer's format) before the conversation."""
        self.messages = [*tool_prefix(renderer, list(self.tools.values()), system_prompt), *self.messages]

    async def initial_messages(self) -> Sequence[Message]:
        return list(self.messages)

    def _end(
        self, reward: float, metrics: Metrics, *, answered: bool, correct: float = 0.0
    ) -> MessageStepResult:
        self.done = True
        metrics |= {
            "tool_use/answered": int(answered),
            "tool_use/correct": correct,
            "correct": correct,
            "tool_use/turns": self.turns,
            "tool_use/tool_calls": self.tool_calls,
        }
        return MessageStepResult(reward=reward, episode_done=True, metrics=metrics)

    def _stop(self, why: BudgetStop, metrics: Metrics, refused: Sequence[str] = ()) -> MessageStepResult:
        metrics[f"tool_use/budget_stop/{why}"] = 1
        for name in refused:
            _count(metrics, f"tools/{_metric_name(name, self.tools)}/budget_stops")
        return self._end(self.no_answer_reward, metrics, answered=False)

    async def step(self, message: Message, /) -> MessageStepResult:
        if self.done:
            raise RuntimeError("ToolEnv is single-use and this episode is over")
        self.turns += 1
        calls = cast("list[dict[str, Any]]", message.get("tool_calls") or [])
        unparsed = cast(
            "list[dict[str, Any]]", cast("dict[str, object]", message).get("unparsed_tool_calls") or []
        )
        metrics: Metrics = {"tools/unparsed": len(unparsed), TOOL_CALLS: len(calls)}
        if not calls and not unparsed:
            correct = float(self.grader(message["content"], self.answer))
            return self._end(correct, metrics, answered=True, correct=correct)
        names = [str(c.get("name", "")) for c in calls]
        if self.tool_calls + len(calls) > self.budget.max_tool_calls:
            return self._stop("tool_calls", metrics, names)
        self.tool_calls += len(calls)
        b = self.budget
        outcomes = await asyncio.gather(
            *(
                run_tool_call(self.tools, c, timeout_s=b.tool_timeout_s, max_result_chars=b.max_result_chars)
                for c in calls
            )
        )
        metrics |= _outcome_metrics(outcomes, self.tools)
        self.messages.append(message)
        for i, (call, outcome) in enumerate(zip(calls, outcomes, strict=True)):
            reply = Message(role="tool", content=outcome.text, name=outcome.name)
            reply["tool_call_id"] = str(call.get("id") or f"call_{self.turns}_{i}")
            self.messages.append(reply)
        for bad in unparsed:
            error = f"Error: could not parse this tool call ({bad.get('error', 'unknown error')})"
            self.messages.append(Message(role="tool", content=error))
        if self.turns >= b.max_turns:
            return self._stop("turns", metrics)
        if b.max_sampled_tokens is not None and self.sampled_tokens >= b.max_sampled_tokens:
            return self._stop("tokens", metrics)
        return MessageStepResult(
            reward=0.0, episode_done=False, next_messages=list(self.messages), metrics=metrics
        )


class ToolEnvAdapter(MessageEnvAdapter):
    """A :class:`ToolEnv` as a token-level env: declares its tools in the renderer's format
    (``system_prompt`` first), and counts the tokens the model samples for the token budget.

    A reply that does not parse ends the episode by ``on_parse_error`` (default ``penalty``
    with ``penalty``, as :class:`~tempering.envs.message.MessageEnvAdapter`)."""

    def __init__(
        self,
        env: ToolEnv,
        renderer: Renderer,
        *,
        system_prompt: str = "",
        max_context_tokens: int | None = None,
        max_tokens_per_turn: int = 0,
        on_parse_error: OnFailure = "penalty",
        penalty: float = 0.0,
    ) -> None:
        super().__init__(
            env,
            renderer,
            max_context_tokens=max_context_tokens,
            max_tokens_per_turn=max_tokens_per_turn,
            on_parse_error=on_parse_error,
            on_overflow="penalty",
            penalty=penalty,
        )
        self.tool_env = env
        env.declare(renderer, system_prompt)

    async def step(self, action: Action, /) -> StepResult:
        self.tool_env.sampled_tokens += len(action)
        result = await super().step(action)
        if result.episode_done and not self.tool_env.done:
            # ended by the adapter (a reply that did not parse, a context overflow)
            self.tool_env.done = True
            metrics = {**result.metrics, "tool_use/answered": 0, "tool_use/correct": 0.0, "correct": 0.0}
            metrics |= {
                "tool_use/turns": self.tool_env.turns + 1,
                "tool_use/tool_calls": self.tool_env.tool_calls,
            }
            return attrs.evolve(result, metrics=metrics)
        return result


@attrs.frozen
class ToolUseGroupBuilder(RepeatedEnvGroup):
    """``group_size`` tool-use episodes of one question (``messages`` → ``answer``), sharing the
    ``tools`` (one instance each: a search index is built once).

    Example::

        builder = ToolUseGroupBuilder([{"role": "user", "content": "17 * 23?"}], "391",
                                      renderer, [calculator], first_number_match, group_size=8)
    """

    messages: Sequence[Message]
    answer: str
    renderer: Renderer = attrs.field(eq=False)
    tools: Sequence[Tool] = attrs.field(eq=False)
    grader: Grader = attrs.field(eq=False)
    group_size: int = 8
    budget: ToolBudget = ToolBudget()
    system_prompt: str = ""
    max_context_tokens: int | None = None
    tag: str = "tool_use"

    def make_env(self) -> Env:
        return ToolEnvAdapter(
            ToolEnv(self.messages, self.tools, self.answer, self.grader, budget=self.budget),
            self.renderer,
            system_prompt=self.system_prompt,
            max_context_tokens=self.max_context_tokens,
        )


@attrs.frozen
class ToolUseStats:
    """Rates over finished episodes: ``correct`` (mean grade), ``answered`` (a final answer
    before a budget ran out), ``tool_calls`` and ``turns`` (means per episode), ``budget_stop``
    (episodes a budget ended)."""

    episodes: int
    correct: float
    answered: float
    tool_calls: float
    turns: float
    budget_stop: float


def tool_use_stats(trajectories: Sequence[Trajectory]) -> ToolUseStats:
    """:class:`ToolUseStats` from the metrics of each trajectory's last step."""
    rows: list[tuple[float, ...]] = []
    for traj in trajectories:
        if not traj.transitions:
            continue
        m = traj.transitions[-1].metrics
        stopped = any(k.startswith("tool_use/budget_stop/") for k in m)
        rows.append(
            (
                float(m.get("tool_use/correct", 0)),
                float(m.get("tool_use/answered", 0)),
                float(m.get("tool_use/tool_calls", 0)),
                float(m.get("tool_use/turns", len(traj.transitions))),
                float(stopped),
            )
        )
    if not rows:
        nan = float("nan")
        return ToolUseStats(0, nan, nan, nan, nan, nan)
    n = len(rows)
    means = [sum(r[i] for r in rows) / n for i in range(5)]
    return ToolUseStats(n, *means)

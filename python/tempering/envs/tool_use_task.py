"""The tool-use task: questions about a shipped corpus of fictional towns
(``tempering-assets:agents/tool_use_corpus.jsonl``) whose answers are numbers no model knows or
can work out in its head, answered with a calculator and BM25 search.

- ``calc``: "What is 73 * 58?" (the calculator);
- ``search``: "How many people live in Lakouk?" (search, then read the number off the result);
- ``both``: "How many years after 1000 was Lakouk founded?" (search, then the calculator).

:class:`ToolUseTask` splits the towns (``test_towns`` held out), builds the questions and their
:class:`~tempering.envs.tool_use.ToolUseGroupBuilder` groups (reward 1 when the first number of
the final answer is right); :func:`scripted_episode` is a scripted agent's conversation (the SFT
data of ``tempering recipe tool-use``).

Example::

    task = ToolUseTask(test_towns=15, batch_size=8, group_size=8)
    train, test = task.split()
    index, tools = task.tools()
    messages = scripted_episode(train[0], index)
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any, Literal

import attrs

from tempering.envs.agent_data import AgentTask
from tempering.envs.problem import first_number_match
from tempering.envs.tool_use import ToolBudget, ToolUseGroupBuilder, tool_use_stats
from tempering.tools import Tool
from tempering.tools.calculator import calculator, evaluate_expression
from tempering.tools.search import BM25Search
from tempering_protocols import Message, RLDataset, ToolCall, Trajectory

__all__ = [
    "KINDS",
    "SYSTEM",
    "Question",
    "ToolUseTask",
    "make_questions",
    "scripted_episode",
    "tool_use_figures",
]

Kind = Literal["calc", "search", "both"]
KINDS: tuple[Kind, ...] = ("calc", "search", "both")
SYSTEM = "Use the tools. Answer with the number only."
CORPUS = "agents/tool_use_corpus.jsonl"


@attrs.frozen
class Question:
    """A question, its answer, its kind and the scripted tool calls that answer it."""

    text: str
    answer: str
    kind: Kind
    calls: tuple[tuple[str, str], ...]
    """``(tool, argument)`` in order: calculator expressions, search queries."""


def _facts() -> list[dict[str, Any]]:
    from tempering import assets

    return [json.loads(line) for line in assets.path(CORPUS).read_text(encoding="utf-8").splitlines()]


def make_questions(towns: Sequence[dict[str, Any]], kind: Kind, n: int, rng: random.Random) -> list[Question]:
    """``n`` questions of ``kind`` about ``towns`` (calc questions use no town)."""
    out: list[Question] = []
    for _ in range(n):
        if kind == "calc":
            a, b, op = rng.randint(12, 99), rng.randint(12, 99), rng.choice("+-*")
            expr = f"{a} {op} {b}"
            out.append(
                Question(f"What is {expr}?", evaluate_expression(expr), "calc", (("calculator", expr),))
            )
            continue
        town = rng.choice(towns)
        if kind == "search":
            text = f"How many people live in {town['town']}?"
            out.append(Question(text, str(town["population"]), "search", (("search", text),)))
        else:
            text = f"How many years after 1000 was {town['town']} founded?"
            expr = f"{town['founded']} - 1000"
            out.append(
                Question(
                    text,
                    str(town["founded"] - 1000),
                    "both",
                    (("search", f"{town['town']} founded"), ("calculator", expr)),
                )
            )
    return out


def _run_tool(index: BM25Search, tool: str, argument: str) -> str:
    return evaluate_expression(argument) if tool == "calculator" else index.search(argument)


def scripted_episode(question: Question, index: BM25Search) -> list[Message]:
    """The conversation of a scripted agent that answers ``question`` with its calls (one call a
    turn, the tools' real results), then the answer."""
    messages: list[Message] = [{"role": "user", "content": question.text}]
    for tool, argument in question.calls:
        key = "expression" if tool == "calculator" else "query"
        call = ToolCall(name=tool, arguments=json.dumps({key: argument}))
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        messages.append({"role": "tool", "content": _run_tool(index, tool, argument), "name": tool})
    messages.append({"role": "assistant", "content": question.answer})
    return messages


@attrs.frozen(kw_only=True)
class ToolUseTask(AgentTask):
    """The RL task as an ``RLDatasetBuilder``: training questions (``n_per_kind`` per kind about
    the training towns) and one test batch of ``eval_questions`` held-out questions per kind."""

    test_towns: int = 15
    n_per_kind: int = 200
    eval_questions: int = 10
    max_turns: int = 4

    def split(self) -> tuple[list[Question], list[Question]]:
        """``(train, test)`` questions."""
        towns = _facts()
        random.Random(f"tool-use-towns/{self.seed}").shuffle(towns)
        test_towns, train_towns = towns[: self.test_towns], towns[self.test_towns :]
        train_rng, test_rng = (
            random.Random(f"tool-use-train/{self.seed}"),
            random.Random(f"tool-use-test/{self.seed}"),
        )
        train = [q for k in KINDS for q in make_questions(train_towns, k, self.n_per_kind, train_rng)]
        test = [q for k in KINDS for q in make_questions(test_towns, k, self.eval_questions, test_rng)]
        return train, test

    def tools(self) -> tuple[BM25Search, list[Tool]]:
        from tempering import assets
        from tempering.tools.search import load_corpus

        index = BM25Search(load_corpus(assets.path(CORPUS)), top_k=1)
        return index, [calculator, index.as_tool()]

    def builders(self, questions: Sequence[Question], group_size: int) -> list[ToolUseGroupBuilder]:
        renderer = self.renderer()
        _, tools = self.tools()
        budget = ToolBudget(max_turns=self.max_turns, max_tool_calls=self.max_turns, tool_timeout_s=10.0)
        return [
            ToolUseGroupBuilder(
                [{"role": "user", "content": q.text}],
                q.answer,
                renderer,
                tools,
                first_number_match,
                group_size=group_size,
                budget=budget,
                system_prompt=SYSTEM,
                tag=f"tool_use_{q.kind}",
            )
            for q in questions
        ]

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        train, test = self.split()
        test_builders = self.builders(test, self.eval_samples) if self.test else []
        return self.datasets(self.builders(train, self.group_size), test_builders)


def tool_use_figures(
    stage: str, groups: Sequence[ToolUseGroupBuilder], trajectories: Sequence[Sequence[Trajectory]]
) -> dict[str, float]:
    """``<stage>_correct``, ``_tool_calls``, ``_budget_stop`` over every episode, and
    ``<stage>_correct_<kind>`` per kind of question (``trajectories[i]``: group ``i``'s)."""
    out: dict[str, float] = {}
    every = [t for ts in trajectories for t in ts]
    stats = tool_use_stats(every)
    out |= {
        f"{stage}_correct": stats.correct,
        f"{stage}_tool_calls": stats.tool_calls,
        f"{stage}_budget_stop": stats.budget_stop,
    }
    for kind in KINDS:
        mine = [
            t for b, ts in zip(groups, trajectories, strict=True) if b.tag == f"tool_use_{kind}" for t in ts
        ]
        out[f"{stage}_correct_{kind}"] = tool_use_stats(mine).correct
    return out

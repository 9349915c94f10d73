"""``tempering recipe tool-use``: multi-turn RL with tools: a calculator and BM25 search over a
shipped corpus of fictional towns (``tempering-assets:agents/tool_use_corpus.jsonl``).

Questions, of three kinds, whose answers are numbers no model knows or can work out in its head:

- ``calc``: "What is 73 * 58?" (the calculator);
- ``search``: "How many people live in Lakouk?" (search, then read the number off the result);
- ``both``: "How many years after 1000 was Lakouk founded?" (search, then the calculator).

The towns are split (``test_towns`` held out of SFT and RL), so the evaluation asks about towns
the model never saw: it must use the tools. Reward: 1 when the first number of the final answer
is right, else 0 (also when a budget runs out, :class:`~tempering.envs.tool_use.ToolBudget`).

1. Data: a scripted agent answers ``sft_examples`` training questions with the right tool calls
   and the tools' real results (chat JSONL in ``<out>/data``).
2. SFT (every assistant turn): the tool-call format, which tool for which question, copying the
   arguments and reading the results. Run directory ``<out>/sft``.
3. RL (:func:`tempering.rl.train`) from the SFT checkpoint, ``rl_batch_size`` questions ×
   ``group_size`` episodes a step. Run directory ``<out>/rl``.
4. Evaluation of the SFT and the RL weights on ``eval_questions`` held-out questions per kind,
   ``eval_samples`` episodes each, temperature 1, seeded: accuracy per kind, tool calls and
   budget stops per episode.

Example::

    tempering recipe tool-use                            # defaults: docs/recipes/tool-use.md
    tempering recipe tool-use --sft-steps 20 --rl-steps 2 --out /tmp/tools
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any, Literal

import attrs

from tempering.envs.problem import first_number_match
from tempering.envs.tool_use import ToolBudget, ToolUseGroupBuilder, tool_use_stats
from tempering.recipes._agents import AgentRecipe, Evaluate, FixedGroups, play, recipe_renderer, write_chats
from tempering.recipes._common import TINY_MODEL, RecipeResult, prepare_run_dir, recipe_service
from tempering.tools import Tool
from tempering.tools.calculator import calculator, evaluate_expression
from tempering.tools.search import BM25Search
from tempering_protocols import Message, RLDataset, RLDatasetBuilder, SamplingClient, ToolCall

__all__ = ["KINDS", "Question", "ToolUseRecipe", "ToolUseTask", "make_questions", "scripted_episode"]

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
class ToolUseTask:
    """The RL task as an ``RLDatasetBuilder``: training questions (``n_per_kind`` per kind about
    the training towns) and one test batch of held-out questions."""

    base_model: str = TINY_MODEL
    renderer_name: str | None = None
    test_towns: int = 15
    n_per_kind: int = 200
    eval_questions: int = 10
    batch_size: int = 8
    group_size: int = 8
    eval_samples: int = 4
    n_batches: int = 30
    max_turns: int = 4
    seed: int = 0
    test: bool = True
    """Build the test set (the recipe evaluates by itself and passes ``False``)."""

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
        renderer = recipe_renderer(self.base_model, self.renderer_name)
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
        return (
            FixedGroups(
                self.builders(train, self.group_size),
                batch_size=self.batch_size,
                n_batches=self.n_batches,
                seed=self.seed,
            ),
            FixedGroups(test_builders, batch_size=len(test_builders), n_batches=1, seed=self.seed)
            if test_builders
            else None,
        )


def _figures(
    stage: str, groups: Sequence[ToolUseGroupBuilder], trajectories: Sequence[Sequence[Any]]
) -> dict[str, float]:
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


@attrs.frozen(kw_only=True)
class ToolUseRecipe(AgentRecipe):
    """Tool use: SFT on scripted tool-using episodes, then multi-turn RL; calling it runs it.
    Figures: docs/recipes/tool-use.md; the test runs a tiny budget."""

    test_towns: int = 15
    """Towns held out of SFT and RL (of 60); the evaluation asks about them."""
    sft_examples: int = 600
    sft_steps: int = 150
    sft_learning_rate: float = 2e-3
    rl_steps: int = 8
    max_turns: int = 4
    """Assistant replies per episode (the turn budget); tool calls are capped at the same number."""
    max_tokens: int = 96
    """Tokens per reply."""
    eval_questions: int = 5
    """Held-out questions per kind."""
    eval_samples: int = 2

    def __attrs_post_init__(self) -> None:
        self.check_positive("sft_examples", "max_turns", "eval_questions", "eval_samples")
        if not 1 <= self.test_towns <= 50:
            raise ValueError(
                f"ToolUseRecipe: test_towns must be in 1..50 (the corpus has 60), got {self.test_towns}"
            )

    def task(self) -> ToolUseTask:
        return ToolUseTask(
            base_model=self.base_model,
            renderer_name=self.renderer_name,
            test_towns=self.test_towns,
            eval_questions=self.eval_questions,
            batch_size=self.rl_batch_size,
            group_size=self.group_size,
            eval_samples=self.eval_samples,
            n_batches=self.rl_steps,
            max_turns=self.max_turns,
            seed=self.seed,
            test=False,
        )

    async def __call__(self) -> RecipeResult:
        from tempering.tools import tool_prefix

        out = prepare_run_dir("tool-use", self.out)
        service = recipe_service(self.base_model)
        task = self.task()
        train, test = task.split()
        index, tools = task.tools()
        prefix = tool_prefix(recipe_renderer(self.base_model, self.renderer_name), tools, SYSTEM)
        rng = random.Random(f"tool-use-sft/{self.seed}")
        episodes = [[*prefix, *scripted_episode(rng.choice(train), index)] for _ in range(self.sft_examples)]
        train_path = write_chats(out / "data" / "train.jsonl", episodes)
        test_path = write_chats(
            out / "data" / "test.jsonl", [[*prefix, *scripted_episode(q, index)] for q in test]
        )
        eval_builders = task.builders(test, self.eval_samples)

        async def evaluate(stage: str, sampler: SamplingClient) -> dict[str, float]:
            played = await play(sampler, eval_builders, max_tokens=self.max_tokens, seed=self.seed + 7919)
            return _figures(stage, eval_builders, played)

        async def make_task(sft: object) -> tuple[RLDatasetBuilder, Evaluate]:
            return task, evaluate

        return await self.sft_then_rl(
            "tool-use",
            out,
            service,
            train_path=train_path,
            test_path=test_path,
            make_task=make_task,
            extra={"eval_episodes": len(test) * self.eval_samples},
        )

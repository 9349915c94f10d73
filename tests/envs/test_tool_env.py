"""The tool-use env: calls run concurrently and come back as tool messages, faults become error
text and the episode goes on, budgets stop episodes, metrics count per tool."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from tempering.envs.problem import first_number_match
from tempering.envs.tool_use import ToolBudget, ToolEnv, ToolEnvAdapter, ToolUseGroupBuilder, tool_use_stats
from tempering.renderers import BaseRenderer
from tempering.tools import tool
from tempering.tools.calculator import calculator
from tempering_protocols import StepResult, TokensWithLogprobs, Trajectory, Transition
from tempering_protocols.rendering import decode_text
from tempering_protocols.rl import TOOL_CALLS
from tempering_protocols.testing import check_env_group_builder


@tool
def explode(x: int) -> str:
    """Always fails."""
    raise RuntimeError("boom")


@tool(timeout_s=0.2)
def hang(x: int) -> str:
    """Hangs."""
    time.sleep(30)
    return "late"


@tool
def not_text(x: int) -> str:
    """Returns a number."""
    return 7  # type: ignore[return-value]


TOOLS = [calculator, explode, hang, not_text]


def _say(renderer: BaseRenderer, text: str) -> list[int]:
    stop = renderer.get_stop_sequences()[0]
    assert isinstance(stop, int)
    return [*renderer.tokenizer.encode(text, add_special_tokens=False), stop]


def _call(name: str, **arguments: object) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def _env(renderer: BaseRenderer, budget: ToolBudget | None = None) -> ToolEnvAdapter:
    inner = ToolEnv(
        [{"role": "user", "content": "What is 17 * 23?"}], TOOLS, "391", first_number_match, budget=budget
    )
    return ToolEnvAdapter(inner, renderer, system_prompt="Answer with a number.")


@pytest.mark.timeout(30)
def test_an_episode_with_every_kind_of_fault_goes_on_to_a_graded_answer(renderer: BaseRenderer) -> None:
    env = _env(renderer)

    async def play() -> tuple[str, StepResult, StepResult]:
        ob, _ = await env.initial_observation()
        first = decode_text(renderer.tokenizer, ob.to_ints())
        reply = "".join([_call("calculator", expression="17 * 23"), _call("explode", x=1), _call("hang", x=1),
                         _call("not_text", x=1), _call("nope")])  # fmt: skip
        mid = await env.step(_say(renderer, reply))
        end = await env.step(_say(renderer, "391"))
        return first, mid, end

    first, mid, end = asyncio.run(play())
    assert first.startswith(
        "<|im_start|>system\nAnswer with a number.\n\nTools:\ncalculator(expression: string)"
    )
    assert not mid.episode_done
    assert mid.reward == 0
    text = decode_text(renderer.tokenizer, mid.next_observation.to_ints())
    for expected in [
        "<|im_start|>tool\n391<|im_end|>",
        "<|im_start|>tool\nError: explode raised RuntimeError: boom<|im_end|>",
        "<|im_start|>tool\nError: hang timed out after 0.2 s<|im_end|>",
        "<|im_start|>tool\nError: not_text returned int, not text (a tool must return str)<|im_end|>",
        "<|im_start|>tool\nError: no tool named 'nope'",
    ]:
        assert expected in text
    m = mid.metrics
    assert (m["tools/calls"], m["tools/errors"], m["tools/timeouts"]) == (5, 4, 1)
    assert m[TOOL_CALLS] == 5  # what RolloutConfig.max_tool_calls sums
    assert end.metrics[TOOL_CALLS] == 0
    assert (m["tools/calculator/calls"], m["tools/explode/errors"], m["tools/hang/timeouts"]) == (1, 1, 1)
    assert "tools/calculator/errors" not in m
    # a name the env does not declare is counted under one fixed key, not a key of its own
    assert m["tools/undeclared/calls"] == m["tools/undeclared/errors"] == 1
    assert not any("nope" in k for k in m)
    assert end.episode_done
    assert end.reward == 1.0
    assert end.metrics["tool_use/correct"] == 1.0
    assert end.metrics["tool_use/tool_calls"] == 5
    assert end.metrics["tool_use/turns"] == 2


def _play(env: ToolEnvAdapter, renderer: BaseRenderer, replies: list[str]) -> list[StepResult]:
    async def go() -> list[StepResult]:
        await env.initial_observation()
        out = []
        for r in replies:
            out.append(await env.step(_say(renderer, r)))
            if out[-1].episode_done:
                break
        return out

    return asyncio.run(go())


def test_budgets_stop_the_episode(renderer: BaseRenderer) -> None:
    call = _call("calculator", expression="1+1")
    steps = _play(_env(renderer, ToolBudget(max_turns=2)), renderer, [call, call, call])
    assert len(steps) == 2
    assert steps[-1].episode_done
    assert steps[-1].reward == 0
    assert steps[-1].metrics["tool_use/budget_stop/turns"] == 1
    assert steps[-1].metrics["tool_use/answered"] == 0

    steps = _play(_env(renderer, ToolBudget(max_tool_calls=3)), renderer, [call + call, call + call])
    assert len(steps) == 2
    assert steps[-1].metrics["tool_use/budget_stop/tool_calls"] == 1
    assert steps[-1].metrics["tools/calculator/budget_stops"] == 2
    assert "tools/calculator/calls" not in steps[-1].metrics  # the refused calls did not run

    steps = _play(_env(renderer, ToolBudget(max_sampled_tokens=10)), renderer, [call, call])
    assert len(steps) == 1
    assert steps[0].metrics["tool_use/budget_stop/tokens"] == 1


def test_result_cap_and_a_wrong_answer(renderer: BaseRenderer) -> None:
    steps = _play(
        _env(renderer, ToolBudget(max_result_chars=2)),
        renderer,
        [_call("calculator", expression="17*23"), "390"],
    )
    text = decode_text(renderer.tokenizer, steps[0].next_observation.to_ints())
    assert "<|im_start|>tool\n39\n[truncated: 1 more characters]<|im_end|>" in text
    assert steps[0].metrics["tools/truncated"] == 1
    assert steps[1].reward == 0
    assert steps[1].metrics["tool_use/answered"] == 1


def test_an_unparseable_reply_ends_the_episode(renderer: BaseRenderer) -> None:
    env = _env(renderer)

    async def go() -> StepResult:
        await env.initial_observation()
        return await env.step(list(renderer.tokenizer.encode("no stop token", add_special_tokens=False)))

    result = asyncio.run(go())
    assert result.episode_done
    assert result.metrics["message/parse_error"] == 1
    assert result.metrics["tool_use/answered"] == 0


def test_group_builder_conformance_and_stats(renderer: BaseRenderer) -> None:
    builder = ToolUseGroupBuilder(
        [{"role": "user", "content": "2+2?"}], "4", renderer, [calculator], first_number_match, group_size=2
    )
    check_env_group_builder(builder)

    def traj(metrics: dict[str, float | int]) -> Trajectory:
        ac = TokensWithLogprobs(tokens=[1], maybe_logprobs=[0.0])
        ob = renderer.build_generation_prompt([])
        return Trajectory([Transition(ob, ac, 0.0, True, metrics)], ob)

    a = {"tool_use/correct": 1.0, "tool_use/answered": 1, "tool_use/tool_calls": 2, "tool_use/turns": 3}
    b = {"tool_use/correct": 0.0, "tool_use/answered": 0, "tool_use/tool_calls": 0, "tool_use/turns": 1}
    stats = tool_use_stats([traj(a), traj({**b, "tool_use/budget_stop/turns": 1})])
    got = (stats.episodes, stats.correct, stats.answered, stats.tool_calls, stats.turns, stats.budget_stop)
    assert got == (2, 0.5, 0.5, 1.0, 2.0, 0.5)

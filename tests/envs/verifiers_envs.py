"""Small verifiers environments for tests/envs/test_verifiers_env.py, written as installable
modules (each defines ``load_environment``), so ``vf.load_environment(NAME)`` finds them the way
it finds a hub environment's package. :func:`install` writes them into a directory for
``sys.path`` (or ``PYTHONPATH``)."""

from __future__ import annotations

from pathlib import Path

SINGLE = """
import verifiers as vf
from datasets import Dataset


def load_environment(n: int = 4):
    rows = [{"question": f"What is {i}+{i}?", "answer": str(2 * i)} for i in range(n)]
    parser = vf.XMLParser(["answer"], answer_field="answer")

    def correct(completion, answer, parser) -> float:
        return float((parser.parse_answer(completion) or "").strip() == answer)

    def lowercase(completion) -> float:  # dense, so an untrained model's groups vary
        letters = [ch for ch in completion[-1].content or "" if ch.isalpha()]
        return sum(ch.islower() for ch in letters) / len(letters) if letters else 0.0

    rubric = vf.Rubric(
        funcs=[correct, parser.get_format_reward_func(), lowercase], weights=[1.0, 0.25, 0.1], parser=parser
    )
    return vf.SingleTurnEnv(
        dataset=Dataset.from_list(rows),
        eval_dataset=Dataset.from_list(rows[: max(2, n // 2)]),
        system_prompt="Answer inside <answer></answer>.",
        parser=parser,
        rubric=rubric,
    )
"""

MULTI = """
import verifiers as vf
from datasets import Dataset


class Guess(vf.MultiTurnEnv):
    async def setup_state(self, state):
        state["secret"] = int(state["answer"])
        state["guessed"] = False
        return state

    async def env_response(self, messages, state, **kwargs):
        text = messages[-1].content or ""
        digits = "".join(ch for ch in text if ch.isdigit())
        if digits and int(digits) == state["secret"]:
            state["guessed"] = True
            state["final_env_response"] = [vf.UserMessage(content="correct")]
            return state["final_env_response"]
        hint = "higher" if digits and int(digits) < state["secret"] else "lower"
        return [vf.UserMessage(content=hint)]

    @vf.stop
    async def guessed(self, state) -> bool:
        return state.get("guessed", False)


def load_environment(max_turns: int = 4):
    rows = [{"question": "Guess my number (1-9).", "answer": "7"}]

    def won(state) -> float:
        return float(state.get("guessed", False))

    def turns_used(state) -> float:
        return float(len(state["trajectory"]))

    return Guess(
        dataset=Dataset.from_list(rows),
        rubric=vf.Rubric(funcs=[won, turns_used], weights=[1.0, 0.0]),
        max_turns=max_turns,
    )
"""

TOOLS = '''
import verifiers as vf
from datasets import Dataset


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


def load_environment():
    rows = [{"question": "Use the add tool: what is 17 + 25?", "answer": "42"}]

    def correct(completion, answer) -> float:
        last = completion[-1].content or ""
        return float(answer in last)

    def used_tool(completion) -> float:
        return float(any(m.role == "tool" and "42" in str(m.content) for m in completion))

    return vf.ToolEnv(
        dataset=Dataset.from_list(rows),
        tools=[add],
        rubric=vf.Rubric(funcs=[correct, used_tool], weights=[1.0, 0.5]),
        max_turns=3,
    )
'''

FAULTY = """
import asyncio
import math

import verifiers as vf
from datasets import Dataset


class Faulty(vf.MultiTurnEnv):
    def __init__(self, mode, **kwargs):
        super().__init__(**kwargs)
        self.mode = mode

    async def setup_state(self, state):
        if self.mode == "raise_setup":
            raise KeyError("no such resource")
        return state

    async def env_response(self, messages, state, **kwargs):
        if self.mode == "raise":
            raise ValueError("the env broke")
        if self.mode == "hang":
            await asyncio.sleep(60)
        if self.mode == "vf_error":
            raise vf.ToolCallError("a tool failed for good")
        return [vf.UserMessage(content="again")]


def load_environment(mode: str = "ok"):
    def score(state) -> float:
        return math.nan if mode == "nan" else 1.0

    return Faulty(
        mode,
        dataset=Dataset.from_list([{"question": "Say something.", "answer": ""}]),
        rubric=vf.Rubric(funcs=[score]),
        max_turns=2,
    )
"""

GROUPED = """
import verifiers as vf
from datasets import Dataset


def load_environment():
    def longest(completions) -> list[float]:
        lengths = [len(c[-1].content or "") for c in completions]
        return [float(n == max(lengths)) for n in lengths]

    def nonempty(completion) -> float:
        return float(bool(completion[-1].content))

    return vf.SingleTurnEnv(
        dataset=Dataset.from_list([{"question": "Say a word.", "answer": ""}]),
        rubric=vf.Rubric(funcs=[longest, nonempty], weights=[1.0, 0.5]),
    )
"""

ENVS = {
    "vf_test_single": SINGLE,
    "vf_test_multi": MULTI,
    "vf_test_tools": TOOLS,
    "vf_test_faulty": FAULTY,
    "vf_test_grouped": GROUPED,
}


def install(directory: Path) -> Path:
    """Write every test environment as a module into ``directory``; returns it."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, source in ENVS.items():
        (directory / f"{name}.py").write_text(source, encoding="utf-8")
    return directory

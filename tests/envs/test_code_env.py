"""The code env: rewards from tests run in the local sandbox, the format penalty, faults in the
generated code as failed grades (never exceptions), the shipped problems, the task."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tempering.envs.code import (
    CodeEnv,
    CodeGrading,
    CodeGroupBuilder,
    CodeProblem,
    CodeTask,
    load_code_problems,
    split_code_problems,
)
from tempering.renderers import BaseRenderer
from tempering.tools.sandbox import LocalSandbox, grade_program
from tempering_protocols import StepResult
from tempering_protocols.testing import check_env_group_builder, check_rl_dataset_builder

SANDBOX = LocalSandbox(wall_seconds=5, cpu_seconds=2, memory_bytes=512 << 20, max_processes=8)
ADD = CodeProblem("add", "Write add(a, b).", ("assert add(1, 2) == 3", "assert add(2, 2) == 4"))


def _step(renderer: BaseRenderer, text: str, grading: CodeGrading | None = None) -> StepResult:
    stop = renderer.get_stop_sequences()[0]
    assert isinstance(stop, int)
    action = [*renderer.tokenizer.encode(text, add_special_tokens=False), stop]
    env = CodeEnv(ADD, renderer, grading or CodeGrading(sandbox=SANDBOX))

    async def play() -> StepResult:
        await env.initial_observation()
        return await env.step(action)

    return asyncio.run(play())


@pytest.mark.timeout(60)
def test_rewards_pass_fraction_all_pass_and_format(renderer: BaseRenderer) -> None:
    right = _step(renderer, "Here:\n```python\ndef add(a, b):\n    return a + b\n```")
    assert right.reward == 1.0
    assert right.metrics["all_pass"] == 1.0
    half = _step(renderer, "```python\ndef add(a, b):\n    return 4\n```")
    assert half.reward == 0.5
    assert half.metrics["pass_fraction"] == 0.5
    strict = _step(
        renderer, "```python\ndef add(a, b):\n    return 4\n```", CodeGrading(sandbox=SANDBOX, reward="all")
    )
    assert strict.reward == 0.0
    no_block = _step(renderer, "def add(a, b): return a + b")
    assert no_block.reward == pytest.approx(-0.1)
    assert no_block.metrics["format"] == 0.0


@pytest.mark.timeout(60)
def test_faulty_code_is_a_failed_grade_not_an_exception(renderer: BaseRenderer) -> None:
    for program in (
        "while True:\n    pass\n",
        "x = bytearray(10 * 1024**3)\n",
        "import os\nwhile True:\n    os.fork()\n",
    ):
        result = _step(renderer, f"```python\n{program}```")
        assert result.episode_done
        assert result.reward == 0.0
        assert result.metrics["sandbox_limit"] == 1.0, program


@pytest.mark.timeout(120)
def test_every_shipped_solution_passes_its_tests() -> None:
    problems = load_code_problems()
    assert len(problems) == 40

    async def grade_all() -> list[float]:
        grades = await asyncio.gather(*(grade_program(SANDBOX, p.solution or "", p.tests) for p in problems))
        return [g.fraction for g in grades]

    assert asyncio.run(grade_all()) == [1.0] * len(problems)


def test_bad_problem_files_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(
        json.dumps({"id": "a", "prompt": "x", "tests": ["assert 1"]}) + "\n" + '{"id": "b", "prompt": "y"}\n'
    )
    with pytest.raises(ValueError, match=r"p\.jsonl:2: 'tests' must be a non-empty list"):
        load_code_problems(str(path))
    path.write_text('{"id": "a", "prompt": "x", "tests": ["assert 1"]}\n' * 2)
    with pytest.raises(ValueError, match="duplicate problem id 'a'"):
        load_code_problems(str(path))
    with pytest.raises(FileNotFoundError, match="no file"):
        load_code_problems(str(tmp_path / "missing.jsonl"))


def test_split_holds_out_problems_by_seed() -> None:
    problems = load_code_problems()
    train, test = split_code_problems(problems, n_test=8, seed=0)
    assert len(test) == 8
    assert len(train) == 32
    assert not {p.id for p in train} & {p.id for p in test}
    assert split_code_problems(problems, n_test=8, seed=0) == (train, test)
    with pytest.raises(ValueError, match=r"n_test must be in 0\.\.39"):
        split_code_problems(problems, n_test=40, seed=0)


@pytest.mark.timeout(120)
def test_conformance(renderer: BaseRenderer) -> None:
    check_env_group_builder(CodeGroupBuilder(ADD, renderer, CodeGrading(sandbox=SANDBOX), group_size=2))
    check_rl_dataset_builder(
        CodeTask(batch_size=2, group_size=2, n_batches=2, grading=CodeGrading(sandbox=SANDBOX))
    )

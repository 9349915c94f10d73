"""Grading a reply to a benchmark item, for each kind of benchmark.

=========== =======================================================================================
kind        grader
=========== =======================================================================================
``math``    :class:`~tempering.grading.MathGrader`: final answer extracted, normalised, checked
``choice``  :func:`extract_choice`: the letter after the last ``Answer:`` (or ``answer is``), or
            a ``\\boxed{X}``, or a reply that is only a letter; a letter that is not an option, a
            hedge (``A or B``) or no letter is wrong
``ifeval``  :mod:`tempering.evals.ifeval`: correct when every instruction is followed (strict,
            prompt-level); ``score`` is the fraction of instructions followed; ``loose`` the
            prompt-level loose verdict
``code``    the last fenced Python block, run against the item's asserts in a sandbox
            (:func:`~tempering.tools.sandbox.grade_program`, default :class:`LocalSandbox`);
            correct when every assert passes; ``score`` is the fraction that passed
=========== =======================================================================================

Example::

    grader = item_grader(get_benchmark("mmlu_pro"))
    graded = await grader(reply_text, item)
    graded.correct, graded.extracted
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence

import attrs

from tempering.evals import ifeval
from tempering.evals.benchmarks import Benchmark
from tempering.evals.items import BenchmarkItem
from tempering.grading import MathGrader
from tempering.tools.sandbox import LocalSandbox, extract_program, grade_program
from tempering_protocols.sandbox import Sandbox

__all__ = [
    "ChoiceGrader",
    "CodeGrader",
    "IFEvalGrader",
    "ItemGrade",
    "ItemGrader",
    "MathItemGrader",
    "extract_choice",
    "item_grader",
]


@attrs.frozen
class ItemGrade:
    """One graded reply: correct or not, what was extracted (None: no answer found), a partial
    score where the benchmark has one (IFEval's instructions, code's tests), whether the
    checker timed out, and IFEval's loose verdict (None for other kinds)."""

    correct: bool
    extracted: str | None
    score: float | None = None
    timed_out: bool = False
    loose: bool | None = None


ItemGrader = Callable[[str, BenchmarkItem], Awaitable[ItemGrade]]
"""``await grader(reply_text, item)``."""

_ANSWER = re.compile(
    r"(?i:answer)\s*(?:is\s*:?|:|：)[\s\(\[*]*(?:(?i:option)\s*)?[\(\[*]*([A-Z])(?![A-Za-z0-9])"
)
_HEDGE = re.compile(r"^[\)\]*.]*\s*(?:or|and|/|,)\s*(?:option\s*)?[\(\[]?[A-Z](?![A-Za-z0-9])")
_BOXED = re.compile(r"\\boxed\{\s*(?:\\text\{)?\s*([A-Z])\s*\}?\s*\}")
_BARE = re.compile(r"^[\(\[*]*([A-Z])[\)\]*.]*$")


def extract_choice(text: str, letters: Sequence[str]) -> str | None:
    """The option letter a reply chose, or None (no letter, a letter that is not an option, or
    a hedge between two).

    Example::

        extract_choice("... so it is 4.\\nAnswer: C", "ABCD")   # 'C'
        extract_choice("Answer: A or B", "ABCD")                # None
    """
    matches = list(_ANSWER.finditer(text))
    if matches:
        last = matches[-1]
        if _HEDGE.match(text[last.end(1) :]):
            return None
        letter = last.group(1)
    elif boxed := _BOXED.findall(text):
        letter = boxed[-1]
    elif bare := _BARE.match(text.strip()):
        letter = bare.group(1)
    else:
        return None
    return letter if letter in letters else None


def _letters(item: BenchmarkItem) -> str:
    letters = item.meta.get("letters")
    if not isinstance(letters, str):
        raise ValueError(f"item {item.id}: a multiple-choice item needs meta['letters']")
    return letters


@attrs.frozen
class MathItemGrader:
    """A math answer, checked by ``math`` (:class:`MathGrader`)."""

    math: MathGrader = attrs.field(factory=MathGrader)

    async def __call__(self, text: str, item: BenchmarkItem) -> ItemGrade:
        graded = await self.math.agrade(text, item.answer)
        return ItemGrade(graded.correct, graded.extracted, timed_out=graded.timed_out)


@attrs.frozen
class ChoiceGrader:
    """The option letter of a reply (:func:`extract_choice`) against the item's answer."""

    async def __call__(self, text: str, item: BenchmarkItem) -> ItemGrade:
        chosen = extract_choice(text, _letters(item))
        return ItemGrade(chosen == item.answer, chosen)


@attrs.frozen
class IFEvalGrader:
    """Every instruction of the item, strict (correct), counted (score) and loose."""

    async def __call__(self, text: str, item: BenchmarkItem) -> ItemGrade:
        ids = item.meta["ids"]
        kwargs = item.meta["kwargs"]
        assert isinstance(ids, list)
        assert isinstance(kwargs, list)
        verdicts = ifeval.check_all(ids, kwargs, text)  # pyright: ignore[reportUnknownArgumentType]
        followed = sum(verdicts)
        extracted = f"{followed}/{len(verdicts)}" if text.strip() else None
        loose = all(ifeval.check_all_loose(ids, kwargs, text))  # pyright: ignore[reportUnknownArgumentType]
        return ItemGrade(all(verdicts), extracted, score=followed / len(verdicts), loose=loose)


@attrs.frozen
class CodeGrader:
    """The reply's last fenced Python block, after the item's setup code, run against its
    asserts in ``sandbox`` (each run limited to ``timeout_s``)."""

    sandbox: Sandbox
    timeout_s: float = 10.0

    async def __call__(self, text: str, item: BenchmarkItem) -> ItemGrade:
        program = extract_program(text)
        tests = item.meta["tests"]
        setup = item.meta.get("setup") or ""
        assert isinstance(tests, list)
        assert isinstance(setup, str)
        if program is None or not program.strip():
            return ItemGrade(False, None, score=0.0)
        code = f"{setup}\n{program}" if setup else program
        graded = await grade_program(self.sandbox, code, [str(t) for t in tests], timeout=self.timeout_s)  # pyright: ignore[reportUnknownArgumentType, reportUnknownVariableType]
        return ItemGrade(
            graded.all_passed, program, score=graded.fraction, timed_out=graded.status == "timeout"
        )


def item_grader(
    bench: Benchmark,
    math: MathGrader | None = None,
    sandbox: Sandbox | None = None,
    code_timeout_s: float = 10.0,
) -> ItemGrader:
    """The grader of ``bench``'s kind (``math``: ``math`` or a default :class:`MathGrader`;
    ``code``: ``sandbox``, default a :class:`LocalSandbox`, each run limited to
    ``code_timeout_s``). Every grader is a picklable value."""
    if bench.kind == "math":
        return MathItemGrader(math or MathGrader())
    if bench.kind == "choice":
        return ChoiceGrader()
    if bench.kind == "ifeval":
        return IFEvalGrader()
    box = sandbox or LocalSandbox(wall_seconds=code_timeout_s, cpu_seconds=max(1, int(code_timeout_s)))
    return CodeGrader(box, code_timeout_s)

"""Answer-graded math benchmarks: what each one is, where its data comes from, how it is asked.

A :class:`Benchmark` names a hub dataset (its config, split and fields) and the instruction that
turns a problem into a prompt; :data:`BENCHMARKS` holds the known ones (``gsm8k``, ``math500``,
``aime24``, ``aime25``). :func:`load_items` reads a benchmark's items from the hub (Hugging Face
``datasets.load_dataset``, the ``data`` extra) or, with ``data=``, from a local file or
directory in the same schema (``tempering-assets:`` names a shipped file), so a benchmark runs
offline on a copy of its data.

Schemas: ``gsm8k`` rows have ``question`` and ``answer`` (a worked solution ending in
``#### 42``); ``math500`` rows ``problem``, ``solution`` and ``answer``; ``aime24`` / ``aime25``
rows ``problem`` and ``answer``.

Example::

    bench = get_benchmark("gsm8k")
    items = load_items(bench, data="gsm8k_test.jsonl", limit=50)
    items[0].prompt, items[0].answer     # ('Natalia sold clips ...', '72')
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Literal, TypeAlias

import attrs

from tempering.assets import resolve_data_path
from tempering.data import RowError, parse_rows
from tempering.data.hub import hub_rows
from tempering.evals import schemas
from tempering.evals.items import BenchmarkItem, text_field

__all__ = [
    "BENCHMARKS",
    "BENCHMARK_DIR_ENV",
    "KIND_INSTRUCTIONS",
    "Benchmark",
    "BenchmarkDataMissingError",
    "BenchmarkItem",
    "BenchmarkKind",
    "UnknownBenchmarkError",
    "get_benchmark",
    "load_items",
    "local_copy_dir",
]

BOXED_INSTRUCTION = "Reason step by step, and put your final answer within \\boxed{}."
"""Appended to every problem (the usual instruction of answer-graded math benchmarks)."""

CHOICE_INSTRUCTION = (
    "Think it through, then end your reply with a line 'Answer: X', where X is the letter of the "
    "correct option."
)
"""Appended to every multiple-choice question (graded by the letter after the last 'Answer:')."""

CODE_INSTRUCTION = "Write the Python function in one ```python code block."
"""Appended to every code problem (the last fenced Python block is run against the tests)."""

BenchmarkKind: TypeAlias = Literal["math", "choice", "ifeval", "code"]
"""How a benchmark's replies are graded: a math answer (``MathGrader``), an option letter, IFEval's
instruction checkers, or a program run against tests in a sandbox."""

KIND_INSTRUCTIONS: Mapping[BenchmarkKind, str] = {
    "math": BOXED_INSTRUCTION,
    "choice": CHOICE_INSTRUCTION,
    "ifeval": "",
    "code": CODE_INSTRUCTION,
}
"""The instruction a benchmark's problems get by default, by kind (IFEval's prompts carry their own)."""

RowParser: TypeAlias = Callable[[Mapping[str, object], int], BenchmarkItem | None]
"""Row → item; None leaves out a row the benchmark excludes (MMLU-Redux's mislabelled ones)."""


def _kind_instruction(benchmark: Benchmark) -> str:
    return KIND_INSTRUCTIONS[benchmark.kind]


@attrs.frozen(kw_only=True)
class Benchmark:
    """An answer-graded benchmark: hub dataset ``hub_name`` (config ``hub_config``, split
    ``split``), the row fields that hold the problem and the answer, and how a prompt is made.

    ``answer_after_hashes``: the answer field is a worked solution whose final answer follows
    ``####`` (GSM8K). ``kind``: how replies are graded; ``instruction`` is appended to the problem
    after a blank line (default: the kind's, :data:`KIND_INSTRUCTIONS`); ``parse`` reads a row of a
    non-math schema (:mod:`tempering.evals.schemas`; the field names above are then unused). ``hub_configs``:
    several configs read one after the other (MMLU-Redux's subjects), instead of ``hub_config``.
    """

    name: str
    description: str
    hub_name: str
    hub_config: str | None = None
    split: str = "test"
    problem_field: str = "problem"
    answer_field: str = "answer"
    answer_after_hashes: bool = False
    kind: BenchmarkKind = "math"
    instruction: str = attrs.field(default=attrs.Factory(_kind_instruction, takes_self=True))
    parse: RowParser | None = None
    hub_configs: tuple[str, ...] = ()
    source: str = ""
    """Where the data and the grader come from, for docs/evals.md and ``tempering eval --list``."""

    def item(self, row: object, index: int) -> BenchmarkItem | None:
        """The item of one dataset row (None: a row the benchmark leaves out);
        :class:`~tempering.data.RowError` names a missing or malformed field."""
        if not isinstance(row, Mapping):
            raise RowError(f"{self.name}: a row must be an object, got {type(row).__name__}")
        fields: Mapping[str, object] = row  # pyright: ignore[reportUnknownVariableType]
        if self.parse is not None:
            return self.parse(fields, index)
        problem = text_field(fields, self.problem_field, self.name)
        answer = text_field(fields, self.answer_field, self.name)
        if self.answer_after_hashes:
            if "####" not in answer:
                raise RowError(f"{self.name}: field {self.answer_field!r} has no '#### <answer>' line")
            answer = answer.rsplit("####", 1)[1].strip().replace(",", "")
        ident = fields.get("id", fields.get("unique_id", index))
        return BenchmarkItem(str(ident), problem, answer)

    def prompt(self, item: BenchmarkItem) -> str:
        """The user message for ``item``: the problem, then the instruction."""
        return f"{item.prompt}\n\n{self.instruction}" if self.instruction else item.prompt


MMLU_SUBJECTS = tuple(
    [
        "abstract_algebra",
        "anatomy",
        "astronomy",
        "business_ethics",
        "clinical_knowledge",
        "college_biology",
        "college_chemistry",
        "college_computer_science",
        "college_mathematics",
        "college_medicine",
        "college_physics",
        "computer_security",
        "conceptual_physics",
        "econometrics",
        "electrical_engineering",
        "elementary_mathematics",
        "formal_logic",
        "global_facts",
        "high_school_biology",
        "high_school_chemistry",
        "high_school_computer_science",
        "high_school_european_history",
        "high_school_geography",
        "high_school_government_and_politics",
        "high_school_macroeconomics",
        "high_school_mathematics",
        "high_school_microeconomics",
        "high_school_physics",
        "high_school_psychology",
        "high_school_statistics",
        "high_school_us_history",
        "high_school_world_history",
        "human_aging",
        "human_sexuality",
        "international_law",
        "jurisprudence",
        "logical_fallacies",
        "machine_learning",
        "management",
        "marketing",
        "medical_genetics",
        "miscellaneous",
        "moral_disputes",
        "moral_scenarios",
        "nutrition",
        "philosophy",
        "prehistory",
        "professional_accounting",
        "professional_law",
        "professional_medicine",
        "professional_psychology",
        "public_relations",
        "security_studies",
        "sociology",
        "us_foreign_policy",
        "virology",
        "world_religions",
    ]
)
"""The 57 MMLU subjects: MMLU-Redux's hub configs."""

BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark(
            name="gsm8k",
            description="grade-school word problems, 1319 test items (openai/gsm8k, main, test)",
            hub_name="openai/gsm8k",
            hub_config="main",
            problem_field="question",
            answer_after_hashes=True,
        ),
        Benchmark(
            name="math500",
            description="500 competition problems from MATH (HuggingFaceH4/MATH-500, test)",
            hub_name="HuggingFaceH4/MATH-500",
        ),
        Benchmark(
            name="aime24",
            description="AIME 2024, 30 problems, integer answers (HuggingFaceH4/aime_2024, train)",
            hub_name="HuggingFaceH4/aime_2024",
            split="train",
        ),
        Benchmark(
            name="aime25",
            description="AIME 2025, 30 problems, integer answers (math-ai/aime25, test)",
            hub_name="math-ai/aime25",
        ),
        Benchmark(
            name="ifeval",
            description="541 prompts with verifiable instructions (google/IFEval, train)",
            hub_name="google/IFEval",
            split="train",
            kind="ifeval",
            parse=schemas.ifeval_item,
        ),
        Benchmark(
            name="mmlu_pro",
            description="12,032 ten-option knowledge questions (TIGER-Lab/MMLU-Pro, test)",
            hub_name="TIGER-Lab/MMLU-Pro",
            kind="choice",
            parse=schemas.mmlu_pro_item,
        ),
        Benchmark(
            name="gpqa",
            description="GPQA diamond, 198 graduate science questions (Idavidrein/gpqa, gpqa_diamond, train)",
            hub_name="Idavidrein/gpqa",
            hub_config="gpqa_diamond",
            split="train",
            kind="choice",
            parse=schemas.gpqa_item,
        ),
        Benchmark(
            name="supergpqa",
            description="26,529 graduate questions in 285 disciplines (m-a-p/SuperGPQA, train)",
            hub_name="m-a-p/SuperGPQA",
            split="train",
            kind="choice",
            parse=schemas.supergpqa_item,
        ),
        Benchmark(
            name="mmlu_redux",
            description=(
                "MMLU-Redux 2.0, 5,700 re-annotated MMLU questions, 57 subjects "
                "(edinburgh-dawg/mmlu-redux-2.0, test)"
            ),
            hub_name="edinburgh-dawg/mmlu-redux-2.0",
            hub_configs=MMLU_SUBJECTS,
            kind="choice",
            parse=schemas.mmlu_redux_item,
        ),
        Benchmark(
            name="mbpp",
            description=(
                "500 basic Python problems, run against their asserts in a sandbox "
                "(google-research-datasets/mbpp, full, test)"
            ),
            hub_name="google-research-datasets/mbpp",
            hub_config="full",
            kind="code",
            parse=schemas.mbpp_item,
        ),
    )
}
"""The known benchmarks by name."""


class UnknownBenchmarkError(ValueError):
    """A benchmark name that is not in :data:`BENCHMARKS` (the message lists the known ones)."""


def get_benchmark(name: str, known: Iterable[str] | None = None) -> Benchmark:
    """The benchmark called ``name``; :class:`UnknownBenchmarkError` lists the known names
    (``known``, default those of :data:`BENCHMARKS`)."""
    if name in BENCHMARKS:
        return BENCHMARKS[name]
    names = sorted(BENCHMARKS if known is None else known)
    raise UnknownBenchmarkError(f"unknown benchmark {name!r}; known benchmarks: {', '.join(names)}")


BENCHMARK_DIR_ENV = "TEMPERING_BENCHMARK_DIR"
"""Environment variable naming the directory of local benchmark copies (default
``~/.cache/tempering/benchmarks``)."""

_SUFFIXES = (".jsonl", ".json", ".parquet")


def local_copy_dir() -> Path:
    """Where local copies of benchmarks are looked for: ``$TEMPERING_BENCHMARK_DIR``, else
    ``~/.cache/tempering/benchmarks``. A copy is ``<dir>/<name>.jsonl`` (or ``.json``,
    ``.parquet``) in the benchmark's hub schema."""
    env = os.environ.get(BENCHMARK_DIR_ENV)
    return Path(env) if env else Path.home() / ".cache" / "tempering" / "benchmarks"


def _local_copy(bench: Benchmark) -> Path | None:
    for suffix in _SUFFIXES:
        path = local_copy_dir() / f"{bench.name}{suffix}"
        if path.is_file():
            return path
    return None


class BenchmarkDataMissingError(FileNotFoundError):
    """A benchmark whose hub dataset cannot be read and that has no local copy; the message says
    where to place one."""


def _hub_rows(bench: Benchmark) -> Iterable[object]:
    """The rows of ``bench``'s hub split (every config of ``hub_configs`` in turn) through
    :func:`tempering.data.hub.hub_rows` (not streamed: the whole split is downloaded and cached,
    as a benchmark is read again)."""
    if importlib.util.find_spec("datasets") is None:  # the `data` extra
        raise ImportError(
            f"benchmark {bench.name} reads {bench.hub_name} through Hugging Face datasets: "
            "pip install 'tempering[data]' (or pass data= a local copy)"
        )
    for config in bench.hub_configs or (bench.hub_config,):
        yield from hub_rows(bench.hub_name, split=bench.split, config=config, streaming=False)


def _missing(bench: Benchmark, exc: Exception) -> BenchmarkDataMissingError:
    where = local_copy_dir() / f"{bench.name}.jsonl"
    return BenchmarkDataMissingError(
        f"benchmark {bench.name}: cannot read {bench.hub_name} ({bench.split}) from the Hugging Face "
        f"hub ({type(exc).__name__}: {exc}) and there is no local copy. Place its rows, in the hub "
        f"schema, at {where} (or .json/.parquet; directory: ${BENCHMARK_DIR_ENV}), or pass "
        f"--data {bench.name}=PATH (data= in Python)"
    )


def load_items(
    bench: Benchmark, data: str | os.PathLike[str] | None = None, limit: int | None = None
) -> list[BenchmarkItem]:
    """The items of ``bench``, in dataset order, at most ``limit`` of them.

    ``data``: a local ``.jsonl`` / ``.json`` / ``.parquet`` file in the benchmark's schema
    (``tempering-assets:NAME`` for a shipped one) instead of the hub dataset. Without it, a local
    copy in :func:`local_copy_dir` is read if there is one, else the hub; with neither,
    :class:`BenchmarkDataMissingError` says where to place the files. A row without a needed
    field raises :class:`~tempering.data.DataError` naming the file, the row and the field.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"{bench.name}: limit must be at least 1, got {limit}")
    items: list[BenchmarkItem] = []
    if data is None:
        data = _local_copy(bench)
    if data is not None:
        path = resolve_data_path(os.fspath(data))
        if not Path(path).is_file():
            raise FileNotFoundError(
                f"{bench.name}: no data file {path!r} (give a .jsonl/.json/.parquet file)"
            )
        counter = iter(range(1 << 62))
        for _, item in parse_rows(path, lambda row: bench.item(row, next(counter))):
            if item is None:
                continue
            items.append(item)
            if limit is not None and len(items) >= limit:
                break
    else:
        rows = iter(_hub_rows(bench))
        index = 0
        while limit is None or len(items) < limit:
            try:
                row = next(rows)
            except StopIteration:
                break
            except (ValueError, OSError, ConnectionError) as exc:
                raise _missing(bench, exc) from exc
            try:
                item = bench.item(row, index)
            except RowError as exc:
                raise ValueError(f"{bench.hub_name} ({bench.split}): row {index + 1}: {exc}") from exc
            if item is not None:
                items.append(item)
            index += 1
    if not items:
        raise ValueError(f"{bench.name}: no items in {data if data is not None else bench.hub_name}")
    return items

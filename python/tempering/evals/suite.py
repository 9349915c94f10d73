"""Which evaluations to run, as a config: :class:`EvalSuite` builds the evaluators.

A suite names benchmarks (:data:`~tempering.evals.benchmarks.BENCHMARKS`, plus ``nll``: NLL and
bits per byte of a chat file, plus ``inspect:SPEC``: any inspect-ai task,
:mod:`tempering.evals.inspect_eval`) and the sampling settings; :meth:`EvalSuite.build` returns one
``SamplingClientEvaluator`` per benchmark for a model's renderer and tokenizer. The same suite
is ``tempering eval``'s and the one the SFT and RL configs take as ``evals`` (run every
``run.eval_every`` steps), e.g. ``tempering rl --evals.benchmarks gsm8k --evals.limit 50``.

Example::

    suite = EvalSuite(benchmarks=("gsm8k", "nll"), data=("gsm8k=gsm8k.jsonl",), limit=20)
    for evaluator in suite.build(ModelConfig()):
        print(await evaluator(sampling_client))
"""

from __future__ import annotations

from pathlib import Path

import attrs

from tempering.assets import ASSET_PREFIX, resolve_data_path
from tempering.backend import ModelConfig, load_tokenizer
from tempering.data import load_chat
from tempering.evals.benchmarks import BENCHMARKS, get_benchmark, load_items
from tempering.evals.graders import item_grader
from tempering.evals.inspect_eval import (
    INSPECT_PREFIX,
    LOG_SUBDIR,
    InspectEvaluator,
    build_inspect_evaluators,
    inspect_spec,
    parse_task_args,
    require_inspect,
)
from tempering.evals.math_bench import BenchmarkEvaluator
from tempering.evals.nll import ChatNLLEvaluator
from tempering.grading import MathGrader
from tempering.renderers import get_renderer

__all__ = ["NLL_BENCHMARK", "EvalSuite", "Evaluator", "known_benchmarks"]

NLL_BENCHMARK = "nll"
"""The benchmark name of NLL and bits per byte on a chat file (default data: the shipped
held-out arithmetic conversations)."""

NLL_DEFAULT_DATA = ASSET_PREFIX + "arithmetic_chat_test.jsonl"

Evaluator = BenchmarkEvaluator | ChatNLLEvaluator | InspectEvaluator


def known_benchmarks() -> list[str]:
    """Every name :class:`EvalSuite` accepts (and ``inspect:SPEC``, any inspect task)."""
    return [*BENCHMARKS, NLL_BENCHMARK]


@attrs.frozen(kw_only=True)
class EvalSuite:
    """Benchmarks to evaluate a sampling client on, and how (empty ``benchmarks``: none).

    ``data``: where a benchmark's items come from instead of the hub: ``PATH`` (with one
    benchmark) or ``NAME=PATH`` entries; a local ``.jsonl``/``.json``/``.parquet`` file in the
    benchmark's schema, or ``tempering-assets:NAME``. ``limit``: the first ``limit`` items of
    each. Each item is sampled ``num_samples`` times at ``temperature`` (at most ``max_tokens``
    tokens), with a seed derived from ``seed``, the item's index and the sample's index.
    """

    benchmarks: tuple[str, ...] = ()
    """Benchmarks to run: gsm8k, math500, aime24, aime25, ifeval, mmlu_pro, gpqa, supergpqa,
    mmlu_redux, mbpp, nll (tempering eval --list), and inspect:TASK for any inspect-ai task
    (a registered name, FILE.py@TASK or FILE.py; with the eval extra)."""
    data: tuple[str, ...] = ()
    """Local data instead of the hub: PATH (one benchmark) or NAME=PATH entries; a .jsonl/.json/
    .parquet file in the benchmark's schema, or tempering-assets:NAME."""
    limit: int | None = None
    """Evaluate the first LIMIT items of each benchmark."""
    num_samples: int = 1
    """Samples per item, each with its own seed."""
    temperature: float = 0.6
    """Sampling temperature of the answers."""
    max_tokens: int = 1024
    """Tokens per reply."""
    seed: int = 0
    """The evaluation's seed: each item's and sample's seed derives from it."""
    grader_timeout_s: float = 5.0
    """Time limit of one answer check, or of one program run for code benchmarks (a timeout is
    a wrong answer, and counted)."""
    system_prompt: str | None = None
    """A system message before each problem (not for inspect tasks, which write their own)."""
    inspect_args: tuple[str, ...] = ()
    """Arguments of the inspect tasks, as inspect eval's -T: KEY=VALUE (a value that parses as
    JSON is that, e.g. 5, true, [1, 2]; any other is text); each must be a parameter of a task."""

    def __attrs_post_init__(self) -> None:
        for name in self.benchmarks:
            if inspect_spec(name) is not None:
                require_inspect(f"benchmark {name!r}")
            elif name != NLL_BENCHMARK:
                get_benchmark(name, known_benchmarks())
        self.data_paths()  # refuse a bad data entry now, not at the first evaluation
        parse_task_args(self.inspect_args)
        if self.inspect_args and not any(inspect_spec(name) is not None for name in self.benchmarks):
            raise ValueError(f"inspect_args {list(self.inspect_args)}: no inspect task (inspect:TASK) is run")

    def data_paths(self) -> dict[str, str]:
        """The data override of each benchmark that has one."""
        out: dict[str, str] = {}
        for entry in self.data:
            name, sep, path = entry.partition("=")
            if sep and name in known_benchmarks():
                if name not in self.benchmarks:
                    raise ValueError(f"data entry {entry!r}: benchmark {name!r} is not being run")
                out[name] = path
            elif len(self.benchmarks) == 1:
                if self.benchmarks[0].startswith(INSPECT_PREFIX):
                    raise ValueError(
                        f"data entry {entry!r}: {self.benchmarks[0]!r} is an inspect task, which reads "
                        "its own dataset"
                    )
                out[self.benchmarks[0]] = entry
            else:
                raise ValueError(
                    f"data entry {entry!r}: with several benchmarks ({', '.join(self.benchmarks)}) "
                    "give each data file as NAME=PATH"
                )
        return out

    def build(self, model: ModelConfig, log_dir: str | None = None) -> list[Evaluator]:
        """One evaluator per benchmark, for ``model``'s renderer and tokenizer (the data is read
        now, inspect tasks are built now). ``log_dir``: the run directory; inspect tasks write
        their logs in its ``inspect/`` folder (``None``: inspect's default, ``./logs``)."""
        if not self.benchmarks:
            return []
        if self.num_samples < 1:
            raise ValueError(f"num_samples must be at least 1, got {self.num_samples}")
        tokenizer = load_tokenizer(model.base_model)
        renderer = get_renderer(model.renderer(), tokenizer)
        grader = MathGrader(timeout_s=self.grader_timeout_s)
        paths = self.data_paths()
        out: list[Evaluator] = []
        specs = [spec for spec in map(inspect_spec, self.benchmarks) if spec is not None]
        inspect_evaluators = iter(
            build_inspect_evaluators(
                specs,
                parse_task_args(self.inspect_args),
                base_model=model.base_model,
                renderer=renderer,
                log_dir=None if log_dir is None else str(Path(log_dir) / LOG_SUBDIR),
                limit=self.limit,
                num_samples=self.num_samples,
                temperature=self.temperature,
                max_tokens=self.max_tokens,
                seed=self.seed,
            )
        )
        for name in self.benchmarks:
            if inspect_spec(name) is not None:
                out.append(next(inspect_evaluators))
                continue
            if name == NLL_BENCHMARK:
                path = resolve_data_path(paths.get(name, NLL_DEFAULT_DATA))
                conversations = load_chat(path).items[: self.limit]
                out.append(ChatNLLEvaluator(conversations, renderer, tokenizer, name=name))
                continue
            bench = get_benchmark(name, known_benchmarks())
            out.append(
                BenchmarkEvaluator(
                    bench,
                    load_items(bench, paths.get(name), self.limit),
                    renderer,
                    grader=grader,
                    item_grader=item_grader(bench, grader, code_timeout_s=self.grader_timeout_s),
                    num_samples=self.num_samples,
                    temperature=self.temperature,
                    max_tokens=self.max_tokens,
                    seed=self.seed,
                    system_prompt=self.system_prompt,
                )
            )
        return out

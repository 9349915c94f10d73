"""Any inspect-ai task as an evaluation of a sampling client: periodic evaluation inside a run.

:class:`InspectEvaluator` runs inspect tasks (``inspect_ai.eval``, in-process, no network of its
own) against a sampling client through the ``tempering`` model provider
(:mod:`tempering.evals.inspect_model`), writes inspect's log file into ``log_dir`` and returns
each scorer's metrics as floats, keyed ``inspect/<task>/<scorer>/<metric>`` (e.g.
``inspect/add_one/match/accuracy`` and ``…/stderr``), plus a 95% Wilson interval
(``…/accuracy_ci_low``, ``…/accuracy_ci_high``) for an ``accuracy`` metric, which is a
proportion over the scored replies. It satisfies ``SamplingClientEvaluator``, so the SFT and RL
loops run it every ``run.eval_every`` steps; in a suite it is the benchmark ``inspect:SPEC``
(:class:`~tempering.evals.suite.EvalSuite`).

A task is a registry name (a package's task once installed, ``inspect_evals/gsm8k``; a ``@task``
function once its module is imported, ``my_task``), a ``FILE.py@TASK`` or ``FILE.py`` spec, or a
``Task`` object. The tasks are resolved once (:func:`load_inspect_tasks`, inspect's own loader)
and run on the newest weights at each evaluation. The suite's ``temperature`` and ``max_tokens``
are the model's defaults (a task's own generate config wins), ``num_samples`` is inspect's
``epochs`` and ``limit`` its ``limit``. Each request's sampling seed is derived from the
evaluation's seed, the task's name, the prompt's tokens and how many times that prompt was asked
(:func:`~tempering.evals.inspect_model.request_seed`), so items draw independent streams, epochs
differ, and the evaluation at every step repeats the same seeds.

Example::

    evaluator = InspectEvaluator(
        load_inspect_tasks("tasks.py@add_one"), base_model="tempering/tiny", renderer=renderer,
        log_dir="runs/sft/inspect", max_tokens=64,
    )
    await evaluator(sampling_client)   # {"inspect/add_one/match/accuracy": 0.25, ...}
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from tempering.evals.stats import item_seed, wilson_interval
from tempering_protocols import Renderer, SamplingClient

if TYPE_CHECKING:
    from inspect_ai import Task
    from inspect_ai.log import EvalLog
    from inspect_ai.model import Model

__all__ = [
    "INSPECT_PREFIX",
    "LOG_SUBDIR",
    "InspectEvaluator",
    "InspectResult",
    "InspectTaskError",
    "InspectUnavailableError",
    "UnknownInspectTaskError",
    "build_inspect_evaluators",
    "inspect_metrics",
    "inspect_spec",
    "load_inspect_tasks",
    "parse_task_args",
    "require_inspect",
    "used_task_args",
]

INSPECT_PREFIX = "inspect:"
"""A suite's benchmark name ``inspect:SPEC`` runs the inspect task ``SPEC``."""

LOG_SUBDIR = "inspect"
"""Where in a run directory the inspect logs go (and ``evaluations.jsonl``, their index)."""


class InspectUnavailableError(ImportError):
    """An inspect task was asked for, but inspect-ai is not installed."""


class UnknownInspectTaskError(ValueError):
    """A task spec names no inspect task."""


class InspectTaskError(RuntimeError):
    """An inspect task raised while being built, or its evaluation ended in error."""


def inspect_spec(name: str) -> str | None:
    """The task spec of a suite's benchmark name ``inspect:SPEC``; ``None`` for other names."""
    if not name.startswith(INSPECT_PREFIX):
        return None
    spec = name.removeprefix(INSPECT_PREFIX).strip()
    if not spec:
        raise UnknownInspectTaskError(
            f"benchmark {name!r}: give the inspect task after 'inspect:' (a registered name such as "
            "inspect_evals/gsm8k, FILE.py@TASK or FILE.py)"
        )
    return spec


def require_inspect(what: str) -> None:
    """Refuse, naming ``what`` needed it, when inspect-ai cannot be imported."""
    try:
        import inspect_ai  # noqa: F401  # pyright: ignore[reportUnusedImport]
    except ImportError as exc:
        raise InspectUnavailableError(
            f"{what} needs inspect-ai, which is not installed: pip install 'tempering[eval]'"
        ) from exc


def parse_task_args(entries: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` entries (inspect eval's ``-T``) as task arguments: a value that parses as
    JSON is that (``5``, ``0.5``, ``true``, ``[1, 2]``, ``"5"``), any other is text."""
    out: dict[str, Any] = {}
    for entry in entries:
        key, sep, text = entry.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise ValueError(f"inspect task argument {entry!r}: give KEY=VALUE, e.g. fewshot=0")
        if key in out:
            raise ValueError(f"inspect task argument {key!r} is given twice")
        try:
            out[key] = json.loads(text)
        except json.JSONDecodeError:
            out[key] = text
    return out


def load_inspect_tasks(
    spec: str | Task, task_args: Mapping[str, Any] | None = None, *, check_args: bool = True
) -> list[Task]:
    """The tasks ``spec`` names (a ``Task``, a registry name, ``FILE.py@TASK``, ``FILE.py``),
    built now with ``task_args`` (the parameters of the task function), through the loader
    ``inspect eval`` uses.

    Raises :class:`UnknownInspectTaskError` when nothing matches, :class:`InspectTaskError` when
    building the task raises, ``ValueError`` for an argument no task takes (unless not
    ``check_args``: :func:`used_task_args` tells which were taken) or any argument with a
    ``Task`` object, :class:`InspectUnavailableError` without inspect-ai.
    """
    require_inspect(f"inspect task {spec!r}")
    from inspect_ai import Task
    from inspect_ai._eval.loader import load_tasks  # the resolver of `inspect eval` (private)
    from inspect_ai._util.error import PrerequisiteError

    args = dict(task_args or {})
    if isinstance(spec, Task):
        if args:
            raise ValueError(
                f"inspect task {spec.name!r} is a built Task: it takes no arguments ({sorted(args)})"
            )
        return [spec]
    hint = (
        "give a registered name (a package's task, e.g. inspect_evals/gsm8k after pip install "
        "inspect-evals, or a @task function whose module is imported), FILE.py@TASK or FILE.py"
    )
    if "@" not in spec and spec.endswith(".py") and os.path.isabs(spec):
        spec = os.path.relpath(spec)  # inspect globs a bare FILE.py, and only relative patterns
    try:
        tasks = load_tasks([spec], args)
    except FileNotFoundError as exc:
        raise UnknownInspectTaskError(
            f"inspect task {spec!r}: no such file {exc.filename!r}; {hint}"
        ) from exc
    except PrerequisiteError as exc:  # inspect's "Task named 'x' not found."
        raise UnknownInspectTaskError(f"inspect task {spec!r}: {exc}; {hint}") from exc
    except Exception as exc:
        raise InspectTaskError(
            f"inspect task {spec!r} raised while being built: {type(exc).__name__}: {exc}"
        ) from exc
    if not tasks:
        raise UnknownInspectTaskError(f"inspect task {spec!r}: no such task; {hint}")
    unused = sorted(set(args) - used_task_args(tasks))
    if check_args and unused:
        names = ", ".join(repr(t.name) for t in tasks)
        raise ValueError(f"inspect task {spec!r}: argument(s) {unused} are not parameters of task {names}")
    return tasks


def used_task_args(tasks: Sequence[Task]) -> set[str]:
    """The arguments the task functions of ``tasks`` took (none for a ``Task`` built directly)."""
    from inspect_ai._eval.loader import resolve_task_args

    return {key for task in tasks for key in resolve_task_args(task)}


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def inspect_metrics(log: EvalLog, prefix: str | None = None) -> dict[str, float]:
    """A finished log's scores as floats, keyed ``<prefix>/<scorer>/<metric>`` (default prefix
    ``inspect/<task>``), with ``…/accuracy_ci_low``/``_ci_high`` (95% Wilson) where a scorer
    reports an ``accuracy`` in [0, 1], and ``<prefix>/samples`` (samples completed).

    The interval's trials are the scored replies: samples × epochs when epochs are reduced by
    their mean (inspect's default; the epochs of one sample count as independent trials, so the
    interval is a little narrow), the scored samples otherwise. Non-numeric metrics are left out.
    """
    p = f"inspect/{log.eval.task}" if prefix is None else prefix
    results = log.results
    if results is None:
        return {}
    epochs = max(log.eval.config.epochs or 1, 1)
    pre = f"{p}/" if p else ""
    out: dict[str, float] = {f"{pre}samples": float(results.completed_samples)}
    for score in results.scores:
        mean_reduced = score.reducer in (None, "mean")
        trials = score.scored_samples * (epochs if mean_reduced else 1) if score.scored_samples else 0
        for name, metric in score.metrics.items():
            value = _number(metric.value)
            if value is None:
                continue
            key = f"{pre}{score.name}/{name}"
            out[key] = value
            if name == "accuracy" and trials > 0 and 0.0 <= value <= 1.0 and math.isfinite(value):
                low, high = wilson_interval(value * trials, trials)
                out[f"{key}_ci_low"] = low
                out[f"{key}_ci_high"] = high
    return out


def _check_positive(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    del instance
    if value < 1:
        raise ValueError(f"InspectEvaluator: {attribute.name} must be at least 1, got {value}")


def _check_limit(instance: object, attribute: attrs.Attribute[int | None], value: int | None) -> None:
    del instance
    if value is not None and value < 1:
        raise ValueError(f"InspectEvaluator: {attribute.name} must be at least 1 (or None), got {value}")


def _non_empty(instance: object, attribute: attrs.Attribute[Sequence[Task]], value: Sequence[Task]) -> None:
    del instance
    if not value:
        raise ValueError(f"InspectEvaluator: {attribute.name} is empty; give at least one inspect task")


@attrs.frozen
class InspectResult:
    """One task's evaluation: its finished inspect log (``log.location``: the log file)."""

    log: EvalLog

    @property
    def task(self) -> str:
        return self.log.eval.task

    def metrics(self, prefix: str | None = None) -> dict[str, float]:
        """:func:`inspect_metrics` of the log (default prefix ``inspect/<task>``)."""
        return inspect_metrics(self.log, prefix)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready summary for ``tempering eval``'s results file (the replies stay in the log)."""
        return {
            "kind": "inspect",
            "benchmark": f"{INSPECT_PREFIX}{self.task}",
            "log": self.log.location,
            "model": self.log.eval.model,
            "metrics": self.metrics(""),
        }


@attrs.define
class InspectEvaluator:
    """Runs inspect tasks on a sampling client (see the module docstring).

    ``tasks``: built tasks (:func:`load_inspect_tasks`). ``base_model``: the provider's model
    name (``tempering/<base_model>`` in the log). ``log_dir``: where inspect writes its logs
    (``None``: inspect's default, ``./logs``), with ``evaluations.jsonl`` beside them (one line
    per task per evaluation: the evaluation's number, the task, the log file, the metrics).
    ``limit``: the first ``limit`` samples of each task. ``num_samples``: inspect's epochs.
    ``temperature``, ``max_tokens``: the model's defaults; a task's own config wins. Each call
    appends its logs to ``logs``.
    """

    tasks: Sequence[Task] = attrs.field(validator=_non_empty)
    base_model: str
    renderer: Renderer
    log_dir: str | None = None
    limit: int | None = attrs.field(default=None, validator=_check_limit)
    num_samples: int = attrs.field(default=1, validator=_check_positive)
    temperature: float = 1.0
    max_tokens: int = attrs.field(default=512, validator=_check_positive)
    seed: int = 0
    logs: list[EvalLog] = attrs.field(factory=list["EvalLog"])
    _first: int | None = attrs.field(default=None, init=False)

    async def run(self, sampling_client: SamplingClient) -> list[InspectResult]:
        """Evaluate every task on ``sampling_client``; one result (a finished log) per task.

        inspect's ``eval`` runs in a worker thread with its own event loop (it may not nest in
        the caller's), with no console display. A task whose evaluation ends in error raises
        :class:`InspectTaskError` naming the task, the error and the log file.
        """
        require_inspect("InspectEvaluator")
        from inspect_ai import eval as inspect_eval

        if self._first is None:
            self._first = self._recorded()
        evaluation = self._first + len(self.logs) // len(self.tasks)
        logs: list[EvalLog] = []
        for task in self.tasks:  # one eval per task: each has its own model, seeded by its name
            model = self._model(sampling_client, task.name)
            (log,) = await asyncio.to_thread(
                inspect_eval,
                task,
                model=model,
                log_dir=self.log_dir,
                limit=self.limit,
                epochs=self.num_samples,
                display="none",
                ctl_server=False,
            )
            if log.status != "success":
                message = log.error.message if log.error is not None else "no error recorded"
                raise InspectTaskError(
                    f"inspect task {task.name!r}: the evaluation ended with status {log.status!r}: "
                    f"{message} (its log: {log.location})"
                )
            logs.append(log)
            self._index(evaluation, log)
        self.logs.extend(logs)
        return [InspectResult(log) for log in logs]

    def _model(self, sampling_client: SamplingClient, task_name: str) -> Model:
        from inspect_ai.model import GenerateConfig, get_model

        import tempering.evals.inspect_model  # noqa: F401  # pyright: ignore[reportUnusedImport] - registers the provider

        return get_model(
            f"tempering/{self.base_model}",
            config=GenerateConfig(temperature=self.temperature, max_tokens=self.max_tokens),
            memoize=False,
            sampling_client=sampling_client,
            renderer=self.renderer,
            seed=item_seed(self.seed, "inspect", task_name),
        )

    def _recorded(self) -> int:
        """How many evaluations of these tasks ``evaluations.jsonl`` already records (a resumed
        run's), so the numbers go on; unreadable lines (a write cut by a kill) are skipped."""
        if self.log_dir is None:
            return 0
        path = Path(self.log_dir) / "evaluations.jsonl"
        names = {task.name for task in self.tasks}
        last = -1
        if path.is_file():
            for text in path.read_text(encoding="utf-8").splitlines():
                try:
                    line = json.loads(text)
                except json.JSONDecodeError:
                    continue
                if (
                    isinstance(line, dict)
                    and line.get("task") in names
                    and isinstance(line.get("evaluation"), int)
                ):
                    last = max(last, int(line["evaluation"]))
        return last + 1

    def _index(self, evaluation: int, log: EvalLog) -> None:
        if self.log_dir is None:
            return
        line = {
            "evaluation": evaluation,
            "task": log.eval.task,
            "log": Path(log.location).name,
            "metrics": inspect_metrics(log, ""),
        }
        path = Path(self.log_dir) / "evaluations.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a+b") as f:  # appends go to the end whatever the position read from
            size = f.seek(0, os.SEEK_END)
            if size:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    f.write(b"\n")  # end the line a killed write left unfinished
            f.write((json.dumps(line) + "\n").encode())

    async def __call__(self, sampling_client: SamplingClient, /) -> dict[str, float]:
        out: dict[str, float] = {}
        for result in await self.run(sampling_client):
            out |= result.metrics()
        return out


def build_inspect_evaluators(
    specs: Sequence[str | Task],
    task_args: Mapping[str, Any],
    *,
    base_model: str,
    renderer: Renderer,
    log_dir: str | None = None,
    limit: int | None = None,
    num_samples: int = 1,
    temperature: float = 1.0,
    max_tokens: int = 512,
    seed: int = 0,
) -> list[InspectEvaluator]:
    """One evaluator per spec (a suite's ``inspect:`` benchmarks), its tasks built now with
    ``task_args``; each argument must be taken by some task, and no task may come twice (its
    metrics would share a name)."""
    out: list[InspectEvaluator] = []
    seen: dict[str, str | Task] = {}  # task name -> the spec that brought it
    used: set[str] = set()
    for spec in specs:
        tasks = load_inspect_tasks(spec, task_args, check_args=False)
        used |= used_task_args(tasks)
        for task in tasks:
            if task.name in seen:
                raise ValueError(
                    f"inspect task {task.name!r} of {spec!r} is already run by {seen[task.name]!r} "
                    "(their metrics would share a name)"
                )
            seen[task.name] = spec
        out.append(
            InspectEvaluator(
                tasks,
                base_model=base_model,
                renderer=renderer,
                log_dir=log_dir,
                limit=limit,
                num_samples=num_samples,
                temperature=temperature,
                max_tokens=max_tokens,
                seed=seed,
            )
        )
    unused = sorted(set(task_args) - used)
    if unused:
        raise ValueError(
            f"inspect task arguments {unused}: not a parameter of any inspect task run "
            f"({', '.join(repr(name) for name in seen)})"
        )
    return out

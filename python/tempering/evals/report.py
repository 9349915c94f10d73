"""An evaluation's results as a JSON file and as a table.

The JSON file (``tempering eval --output``) is one object::

    {"format": "tempering-eval/1", "model": {...}, "settings": {...},
     "results": [{"kind": "benchmark", "benchmark": "gsm8k", "metrics": {"pass@1": ...}, "items": [...]},
                 {"kind": "nll", "benchmark": "nll", "metrics": {"nll": ..., "bits_per_byte": ...}}]}

Example::

    write_report("eval.json", model={"base_model": "tempering/tiny"}, settings={}, results=results)
    print_table(results)
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tempering.evals.inspect_eval import INSPECT_PREFIX, InspectResult
from tempering.evals.math_bench import BenchmarkResult
from tempering.evals.nll import NLLResult

__all__ = ["FORMAT", "print_table", "read_report", "write_report"]

FORMAT = "tempering-eval/1"
"""The ``format`` field of a results file."""

Result = BenchmarkResult | NLLResult | InspectResult


def write_report(
    path: str | os.PathLike[str],
    *,
    model: Mapping[str, Any],
    settings: Mapping[str, Any],
    results: Sequence[Result],
) -> Path:
    """Write the results file (through a temporary file, so a failed write leaves no half file)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "format": FORMAT,
        "model": dict(model),
        "settings": dict(settings),
        "results": [r.to_json() for r in results],
    }
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(body, indent=1) + "\n", encoding="utf-8")
    tmp.replace(out)
    return out


def read_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A results file, checked to be one."""
    body = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise ValueError(f"{path}: not a tempering eval results file (format {FORMAT!r})")
    return body  # pyright: ignore[reportUnknownVariableType]


def print_table(results: Sequence[Result], *, title: str = "evaluation") -> None:
    """Print one row per benchmark (rich): accuracy with its 95% interval and spread, or NLL."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in ("benchmark", "items", "samples", "metric", "value", "95% CI", "std over samples"):
        table.add_column(column, overflow="fold")
    for r in results:
        if isinstance(r, BenchmarkResult):
            spread = f"{r.std_over_samples:.4f}" if r.num_samples > 1 else "-"
            ci = f"[{r.ci_low:.4f}, {r.ci_high:.4f}]"
            row = (
                r.benchmark,
                str(r.n_items),
                str(r.num_samples),
                "pass@1",
                f"{r.pass_at_1:.4f}",
                ci,
                spread,
            )
            table.add_row(*row)
        elif isinstance(r, InspectResult):
            figures = r.metrics("")
            for key, value in figures.items():
                if key.endswith(("_ci_low", "_ci_high")) or key == "samples":
                    continue
                ci = (
                    f"[{figures[key + '_ci_low']:.4f}, {figures[key + '_ci_high']:.4f}]"
                    if key + "_ci_low" in figures
                    else "-"
                )
                name = f"{INSPECT_PREFIX}{r.task}"
                table.add_row(name, str(int(figures["samples"])), "-", key, f"{value:.4f}", ci, "-")
        else:
            table.add_row(r.name, str(r.conversations), "-", "nll (nats/token)", f"{r.nll:.4f}", "-", "-")
            table.add_row("", "", "", "bits/byte", f"{r.bits_per_byte:.4f}", "-", "-")
    Console().print(table)

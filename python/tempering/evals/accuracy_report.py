"""Reports of :class:`~tempering.evals.accuracy.AccuracyEvaluator` runs over an SFT-then-RL
pipeline (``tempering demo``'s): a PNG plot and a self-contained HTML report.

- :func:`plot_curves`: held-out accuracy against step for both stages (SFT, then RL), the RL
  training reward, and the SFT training loss (matplotlib, Agg backend, imported lazily: the
  ``recipes`` extra).
- :func:`write_html_report`: per evaluation (:class:`~tempering.evals.accuracy.EvalRecord`), its
  accuracies with their 95% intervals and a few held-out problems with their sampled answers:
  prompt, response, reward, and each token coloured by its advantage (reward minus the mean
  reward of the problem's samples: green above the mean, red below).

Example::

    plot_curves(lines, out / "curves.png", sft_steps=600)
    write_html_report(records, out / "report.html", title="tempering demo")
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from tempering.evals.accuracy import EvalRecord, SampledAnswer

__all__ = ["plot_curves", "write_html_report"]


def _series(lines: Sequence[Mapping[str, object]], stage: str, key: str) -> tuple[list[float], list[float]]:
    xs: list[float] = []
    ys: list[float] = []
    for line in lines:
        value = line.get(key)
        step = line.get("global_step")
        if line.get("stage") != stage or not isinstance(value, int | float) or not isinstance(step, int):
            continue
        if math.isfinite(float(value)):
            xs.append(float(step))
            ys.append(float(value))
    return xs, ys


def plot_curves(
    lines: Sequence[Mapping[str, object]],
    path: str | Path,
    *,
    sft_steps: int,
    accuracy_points: Sequence[tuple[str, int, float, float]] = (),
) -> Path:
    """Write the curves of the demo's combined metrics lines (``stage``, ``global_step`` and
    the stage's metrics) to a PNG at ``path``.

    ``accuracy_points``: ``(stage, global step, sampled accuracy, greedy accuracy)`` of every
    held-out evaluation (SFT's periodic ones, and RL's at each periodic checkpoint).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_acc, ax_rew, ax_loss) = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    for stage, color in (("sft", "tab:blue"), ("rl", "tab:orange")):
        points = sorted((s, a, g) for st, s, a, g in accuracy_points if st == stage)
        if points:
            ax_acc.plot(
                [p[0] for p in points],
                [p[1] for p in points],
                "o-",
                color=color,
                label=f"{stage.upper()}: accuracy (sampled, T=1)",
            )
            ax_acc.plot(
                [p[0] for p in points],
                [p[2] for p in points],
                "s--",
                color=color,
                alpha=0.5,
                label=f"{stage.upper()}: accuracy (greedy)",
            )
    xs, ys = _series(lines, "rl", "env/reward/mean")
    ax_rew.plot(xs, ys, color="tab:orange", label="RL: training reward (mean over the batch)")
    xs, ys = _series(lines, "sft", "loss")
    ax_loss.plot(xs, ys, color="tab:blue", label="SFT: training loss (nats per answer token)")
    for ax, label in ((ax_acc, "held-out accuracy"), (ax_rew, "reward"), (ax_loss, "loss")):
        ax.axvline(sft_steps, color="gray", linestyle="--", linewidth=1)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    ax_acc.set_ylim(-0.02, 1.02)
    ax_rew.set_ylim(-0.02, 1.02)
    ax_loss.set_xlabel(f"step (SFT: 0..{sft_steps}, then RL)")
    ax_acc.set_title("tempering demo: SFT warm start, then RL with verifiable rewards")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _interval(ci: tuple[float, float] | None) -> str:
    return "" if ci is None else f" (95% CI {ci[0]:.3f}-{ci[1]:.3f})"


def _color(advantage: float) -> str:
    """Green for a positive advantage, red for a negative one, white at zero."""
    a = max(-1.0, min(1.0, advantage))
    if a >= 0:
        return f"rgba(40, 160, 60, {0.15 + 0.6 * a:.2f})"
    return f"rgba(210, 50, 40, {0.15 + 0.6 * -a:.2f})"


def _token_span(piece: str, logprob: float | None, advantage: float) -> str:
    shown = piece.replace("\n", "\\n") or "\u2205"
    title = f"advantage {advantage:+.2f}" + (f", logprob {logprob:.2f}" if logprob is not None else "")
    return (
        f'<span class="tok" style="background:{_color(advantage)}" title="{html.escape(title)}">'
        f"{html.escape(shown)}</span>"
    )


def _answer_row(answer: SampledAnswer) -> str:
    tokens = "".join(
        _token_span(piece, answer.logprobs[i] if i < len(answer.logprobs) else None, answer.advantage)
        for i, piece in enumerate(answer.pieces)
    )
    mark = "✓" if answer.reward > 0 else "✗"
    return (
        f"<tr><td class='resp'>{html.escape(answer.text)}</td><td>{mark} {answer.reward:.0f}</td>"
        f"<td>{answer.advantage:+.2f}</td><td class='toks'>{tokens}</td></tr>"
    )


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
h2 { margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em 0; }
td, th { border: 1px solid #ddd; padding: 2px 8px; text-align: left; }
.tok { font-family: monospace; padding: 1px 2px; margin: 0 1px; border-radius: 3px; }
.resp, .prompt { font-family: monospace; }
.meta { color: #666; }
"""


def write_html_report(
    records: Sequence[EvalRecord],
    path: str | Path,
    *,
    title: str = "tempering demo: sampled rollouts",
    summary: Mapping[str, float] | None = None,
    ci95: Mapping[str, tuple[float, float]] | None = None,
) -> Path:
    """One self-contained HTML file: the ``summary`` figures (with their 95% intervals from
    ``ci95``), then for each evaluation its accuracies with their 95% Wilson intervals and the
    sampled answers of a few held-out problems (all text html-escaped; tokens coloured by
    advantage)."""
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        "<p class='meta'>Each answer's tokens are coloured by its advantage: its reward minus the mean "
        "reward of the problem's samples (green: better than the group, red: worse). Hover a token "
        "for its logprob.</p>",
    ]
    if summary:
        intervals = ci95 or {}
        items = "".join(
            f"<li>{html.escape(k)}: {v:.3f}{_interval(intervals.get(k))}</li>" for k, v in summary.items()
        )
        parts.append(f"<ul>{items}</ul>")
    for record in records:
        parts.append(
            f"<h2>{html.escape(record.stage.upper())}, step {record.step}</h2>"
            f"<p>held-out accuracy {record.accuracy:.3f}{_interval(record.accuracy_ci95)} (sampled), "
            f"{record.greedy_accuracy:.3f}{_interval(record.greedy_accuracy_ci95)} (greedy)</p>"
        )
        for problem, answers in record.problems:
            parts.append(
                f"<p>prompt <span class='prompt'>{html.escape(problem.question)}</span> "
                f"<span class='meta'>(answer {html.escape(problem.answer)})</span></p>"
                "<table><tr><th>response</th><th>reward</th><th>advantage</th><th>tokens</th></tr>"
            )
            parts.extend(_answer_row(a) for a in answers)
            parts.append("</table>")
    parts.append("</body></html>")
    out = Path(path)
    out.write_text("\n".join(parts), encoding="utf-8")
    return out

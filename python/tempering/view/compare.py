"""Held-out answers before and after training, side by side (the page's evaluation comparison).

Evaluation rollouts (:func:`~tempering.view.data.write_eval_rollouts`) of two steps are matched
by their prompt (the first turn's observation): the same held-out item, its answers at each
step, and what changed (``fixed``: a higher mean reward after, ``broken``: lower, ``same``).

Example::

    comparison(run, "", 0, "", 44)["items"][0]["change"]   # "fixed"
"""

from __future__ import annotations

from typing import Any

from tempering.view.data import Run, rollout_steps, step_episodes

__all__ = ["comparison", "default_comparison", "eval_steps"]


def eval_steps(run: Run) -> list[dict[str, Any]]:
    """The run's steps with evaluation rollouts (``{"stage", "step", "global", "kinds"}``), in
    the order of the run's step axis."""
    return [s for s in rollout_steps(run) if "eval" in s["kinds"]]


def _items(run: Run, stage: str, step: int, notes: list[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for ep in step_episodes(run, step, stage, notes):
        if "eval" not in ep["tags"] and ep.get("trained") is not False:
            continue  # training rollouts are not held-out items
        turns = ep.get("turns") or [{}]
        prompt = str(turns[0].get("observation") or "")
        if not prompt:
            continue
        item = out.setdefault(prompt, {"prompt": prompt, "note": ep.get("note") or "", "answers": []})
        item["answers"].append(
            {"text": str(turns[-1].get("action") or ""), "reward": float(ep.get("total_reward") or 0.0)}
        )
    return out


def _mean(answers: list[dict[str, Any]]) -> float:
    return sum(a["reward"] for a in answers) / max(1, len(answers))


def comparison(run: Run, before_stage: str, before: int, after_stage: str, after: int) -> dict[str, Any]:
    """The held-out items evaluated at both steps: ``items`` (``prompt``, ``note``, ``before``
    and ``after``: the answers with their rewards, ``before_mean`` / ``after_mean``, and
    ``change``), the changed ones first (fixed, then broken), and the mean reward over the
    matched items at each step; ``only_before`` / ``only_after``: items evaluated at one step."""
    notes: list[str] = []
    a = _items(run, before_stage, before, notes)
    b = _items(run, after_stage, after, notes)
    items: list[dict[str, Any]] = []
    for prompt in [p for p in a if p in b]:
        mb, ma = _mean(a[prompt]["answers"]), _mean(b[prompt]["answers"])
        change = "fixed" if ma > mb else "broken" if ma < mb else "same"
        items.append(
            {
                "prompt": prompt,
                "note": a[prompt]["note"] or b[prompt]["note"],
                "before": a[prompt]["answers"],
                "after": b[prompt]["answers"],
                "before_mean": mb,
                "after_mean": ma,
                "change": change,
            }
        )
    order = {"fixed": 0, "broken": 1, "same": 2}
    items.sort(key=lambda it: order[it["change"]])
    n = max(1, len(items))
    return {
        "before": {"stage": before_stage, "step": before},
        "after": {"stage": after_stage, "step": after},
        "items": items,
        "before_mean": sum(it["before_mean"] for it in items) / n,
        "after_mean": sum(it["after_mean"] for it in items) / n,
        "fixed": sum(it["change"] == "fixed" for it in items),
        "broken": sum(it["change"] == "broken" for it in items),
        "only_before": len([p for p in a if p not in b]),
        "only_after": len([p for p in b if p not in a]),
        "notes": notes,
    }


def default_comparison(run: Run) -> dict[str, Any] | None:
    """The comparison of the run's first and last evaluation steps (``None``: fewer than two)."""
    steps = eval_steps(run)
    if len(steps) < 2:
        return None
    first, last = steps[0], steps[-1]
    return comparison(run, first["stage"], first["step"], last["stage"], last["step"])

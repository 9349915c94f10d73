"""Tiny budgets for the docs test: ``TEMPERING_DOCS_TEST=1`` caps a parsed config's budgets.

``tests/test_docs_commands.py`` runs every ``tempering …`` line of the docs' code blocks as
written; with this variable set, the CLI lowers (never raises) the fields that set how much work
a run does, wherever they sit in the config tree (``--data.batch-size``, ``--rl-steps``, ...):

================================================  ======================================
fields (by name)                                  capped to
================================================  ======================================
``*steps`` (``num_steps``, ``max_steps``,         2 (a ``None`` ``num_steps`` /
``sft_steps``, ...), ``n_batches``                ``max_steps`` / ``n_batches`` becomes 2)
``num_epochs``                                    1
``*batch_size``, ``*group_size``,                 2
``games_per_group``, ``rl_prompts``
evaluation sizes (``n_test``, ``test_size``,      2 (``eval_samples``: 1)
``test_pairs``, ``eval_games``, ``n_test_batches``,
``n_test_secrets``, ``eval_samples``, ``show``)
generated data (``sft_games``,                    16
``warmup_problems``)
================================================  ======================================

Everything else (paths, models, learning rates, ``max_tokens``) stays as written.
"""

from __future__ import annotations

import os
from typing import Any

import attrs

__all__ = ["DOCS_TEST_ENV", "apply_docs_test_budgets", "tiny_budgets"]

DOCS_TEST_ENV = "TEMPERING_DOCS_TEST"

_EXACT: dict[str, int] = {
    "num_epochs": 1,
    "n_batches": 2,
    "games_per_group": 2,
    "rl_prompts": 2,
    "n_test": 2,
    "test_size": 2,
    "test_pairs": 2,
    "eval_games": 2,
    "n_test_batches": 1,
    "n_test_secrets": 2,
    "eval_samples": 1,
    "show": 1,
    "sft_games": 16,
    "warmup_problems": 16,
}
_FILL_NONE = frozenset({"num_steps", "max_steps", "n_batches"})


def _cap(name: str) -> int | None:
    if name in _EXACT:
        return _EXACT[name]
    if name.endswith(("steps", "batch_size", "group_size")) and name != "max_steps_off_policy":
        return 2
    return None


def _over(value: object, cap: int, *, fill_none: bool) -> bool:
    if value is None:
        return fill_none
    return isinstance(value, int) and not isinstance(value, bool) and value > cap


def tiny_budgets(config: Any) -> Any:
    """``config`` (an attrs instance) with every budget field of its tree capped (see above).

    Example::

        tiny_budgets(SFTConfig(run=RunConfig(log_dir="runs/sft"))).max_steps   # 2
    """
    if not attrs.has(type(config)):
        return config
    changes: dict[str, Any] = {}
    for field in attrs.fields(type(config)):
        if not field.init:
            continue
        value = getattr(config, field.name)
        cap = _cap(field.name)
        if attrs.has(type(value)):
            capped = tiny_budgets(value)
            if capped is not value:
                changes[field.alias or field.name] = capped
        elif cap is not None and _over(value, cap, fill_none=field.name in _FILL_NONE):
            changes[field.alias or field.name] = cap
    return attrs.evolve(config, **changes) if changes else config


def apply_docs_test_budgets(config: Any) -> Any:
    """``tiny_budgets(config)`` when ``TEMPERING_DOCS_TEST`` is set (non-empty, not ``0``)."""
    if os.environ.get(DOCS_TEST_ENV, "0") in ("", "0"):
        return config
    return tiny_budgets(config)

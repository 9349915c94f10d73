"""Which check applies to an object: by an explicit kind, or detected from its members."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Final, Literal, TypeAlias, cast

import tinker

from tempering_protocols.testing._base import name_of
from tempering_protocols.testing._policies import check_message_completer, check_token_completer
from tempering_protocols.testing._rendering import check_renderer
from tempering_protocols.testing._rl import (
    check_env,
    check_env_group_builder,
    check_rl_dataset,
    check_rl_dataset_builder,
)
from tempering_protocols.testing._sandbox import check_sandbox
from tempering_protocols.testing._supervised import check_supervised_dataset, check_supervised_dataset_builder

__all__ = ["CHECKS", "Kind", "check_conformance", "detect_kind"]

Kind: TypeAlias = Literal[
    "env",
    "env_group_builder",
    "rl_dataset",
    "rl_dataset_builder",
    "supervised_dataset",
    "supervised_dataset_builder",
    "renderer",
    "token_completer",
    "message_completer",
    "sandbox",
]
"""The kinds of implementation the kit checks (the keys of ``CHECKS``).

Example::

    check_conformance(my_policy, "token_completer")
"""

CHECKS: Final[Mapping[str, Callable[[object], object]]] = {
    "env": check_env,
    "env_group_builder": check_env_group_builder,
    "rl_dataset": check_rl_dataset,
    "rl_dataset_builder": check_rl_dataset_builder,
    "supervised_dataset": check_supervised_dataset,
    "supervised_dataset_builder": check_supervised_dataset_builder,
    "renderer": check_renderer,
    "token_completer": check_token_completer,
    "message_completer": check_message_completer,
    "sandbox": check_sandbox,
}
"""The check for each kind of implementation (each runs with its default settings)."""


def _first_item_is_datum(dataset: object) -> bool:
    get_batch = cast(Callable[[int], Sequence[object]], getattr(dataset, "get_batch"))  # noqa: B009
    try:
        batch = get_batch(0)
        return len(batch) > 0 and isinstance(batch[0], tinker.Datum)
    except Exception:
        return True  # let the supervised check report the failure


def _callable_kind(obj: object) -> Kind | None:
    """The ``__call__``-only protocols, told apart by arity and ``async``."""
    if not callable(obj):
        return None
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    required = [
        p
        for p in signature.parameters.values()
        if p.default is inspect.Parameter.empty
        and p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    call: object = obj if inspect.isfunction(obj) or inspect.ismethod(obj) else getattr(obj, "__call__")  # noqa: B004, B009
    while isinstance(call, functools.partial):
        call = cast(functools.partial[object], call).func
    is_async = inspect.iscoroutinefunction(call)
    match len(required), is_async:
        case 0, True:
            return "rl_dataset_builder"
        case 0, False:
            return "supervised_dataset_builder"
        case 1, True:
            return "message_completer"
        case 2, True:
            return "token_completer"
        case _:
            return None


def detect_kind(obj: object, /) -> Kind:
    """The kind of implementation ``obj`` is, from the members it has.

    Envs have ``initial_observation``; builders ``make_envs``; renderers
    ``build_generation_prompt``; sandboxes an async ``run``; datasets ``get_batch`` (supervised
    when batch 0 holds ``tinker.Datum``). Objects that are only callable are told apart by their arguments and
    ``async``: no argument, async → RL dataset builder, sync → supervised dataset builder; one
    argument → message completer; two → token completer. Raises ``TypeError`` otherwise.

    Example::

        detect_kind(ReverseGroup(prompt=(1, 2)))  # "env_group_builder"
    """
    if hasattr(obj, "initial_observation"):
        return "env"
    if hasattr(obj, "make_envs"):
        return "env_group_builder"
    if hasattr(obj, "build_generation_prompt") or hasattr(obj, "parse_response"):
        return "renderer"
    if inspect.iscoroutinefunction(getattr(obj, "run", None)):
        return "sandbox"
    if hasattr(obj, "get_batch"):
        if hasattr(obj, "set_epoch") and _first_item_is_datum(obj):
            return "supervised_dataset"
        return "rl_dataset"
    kind = _callable_kind(obj)
    if kind is None:
        raise TypeError(
            f"cannot tell which tempering protocol {name_of(obj)} implements; name it explicitly "
            f"(one of {', '.join(CHECKS)})"
        )
    return kind


def check_conformance(obj: object, /, kind: Kind | None = None) -> None:
    """Run the check for ``kind`` (detected with :func:`detect_kind` when ``None``) on ``obj``.

    Example::

        check_conformance(ReverseGroup(prompt=(1, 2)))
        check_conformance(my_policy, "token_completer")
    """
    CHECKS[detect_kind(obj) if kind is None else kind](obj)

"""The policy's model handed to the builders that render: one model, one chat format per run.

A run names its model once (``--model.base-model``, ``--model.renderer-name``: the trainer's
:class:`~tempering.backend.ModelConfig`). Builders that render prompts with a tokenizer carry
model fields of their own: tempering's RL tasks (:class:`~tempering.envs.task_base.PolicyTask`:
``base_model``, ``renderer_name``) and the Tinker Cookbook's builders
(``model_name_for_tokenizer``, ``renderer_name``). :func:`bind_policy` fills the fields a builder
left unset from the run's model, and refuses, naming the field, a builder that names another
model or chat format: a task rendered with one tokenizer and trained with another would train on
token ids that mean other words.

Example::

    task = bind_policy(ArithmeticTask(), ModelConfig(base_model="HuggingFaceTB/SmolLM2-135M-Instruct"))
    task.base_model                       # "HuggingFaceTB/SmolLM2-135M-Instruct"
    task.renderer_name                    # "smollm2"
    bind_policy(ArithmeticTask(base_model="Qwen/Qwen3-8B"), ModelConfig())   # ValueError
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar, cast

import attrs

from tempering.backend import ModelConfig

__all__ = ["MODEL_FIELDS", "PolicyMismatchError", "bind_policy"]

T = TypeVar("T")

MODEL_FIELDS: tuple[tuple[str, str], ...] = (
    ("base_model", "model"),
    ("model_name_for_tokenizer", "model"),
    ("renderer_name", "renderer"),
)
"""A builder's field name → what of the policy it holds: its base model or its renderer name."""

_NESTED = ("builders", "sources")
"""Fields holding further builders (an interleaved RL dataset's sources): bound one by one."""


class PolicyMismatchError(ValueError):
    """A builder names another model or chat format than the run's policy."""


def _fields_of(builder: object) -> dict[str, Any]:
    if attrs.has(type(builder)):
        return {f.name: getattr(builder, f.name) for f in attrs.fields(type(builder))}  # pyright: ignore[reportArgumentType]
    if dataclasses.is_dataclass(builder) and not isinstance(builder, type):
        return {f.name: getattr(builder, f.name) for f in dataclasses.fields(builder)}
    return {name: getattr(builder, name) for name, _ in MODEL_FIELDS if hasattr(builder, name)}


def _replace(builder: T, changes: dict[str, Any]) -> T:
    if not changes:
        return builder
    if attrs.has(type(builder)):
        return attrs.evolve(builder, **changes)  # pyright: ignore[reportArgumentType]
    if dataclasses.is_dataclass(builder) and not isinstance(builder, type):
        return dataclasses.replace(builder, **changes)  # pyright: ignore[reportReturnType]
    names = ", ".join(changes)
    raise PolicyMismatchError(
        f"{type(builder).__qualname__} leaves {names} unset and is not an attrs class or dataclass, "
        f"so tempering cannot fill it from the run's model: set {names} yourself"
    )


def bind_policy(builder: T, model: ModelConfig, *, where: str = "dataset") -> T:
    """``builder`` with its model fields (:data:`MODEL_FIELDS`) unset (``None``) filled from
    ``model``, its nested builders bound too; a field naming another model or renderer is
    refused with :class:`PolicyMismatchError` (``where`` names the builder in the message,
    e.g. ``"dataset"`` for ``--dataset.*`` flags). A builder without such fields comes back
    unchanged."""
    fields = _fields_of(builder)
    wanted = {"model": model.base_model, "renderer": model.renderer()}
    changes: dict[str, Any] = {}
    for name, holds in MODEL_FIELDS:
        if name not in fields:
            continue
        value = fields[name]
        if value is None:
            changes[name] = wanted[holds]
        elif value != wanted[holds]:
            what = "base model" if holds == "model" else "renderer"
            given = "--model.base-model" if holds == "model" else "--model.renderer-name"
            raise PolicyMismatchError(
                f"{where}.{name} is {value!r} but the run's {what} is {wanted[holds]!r}: the "
                f"{where}'s prompts would be rendered for another model than the one trained. "
                f"Leave {where}.{name} unset (the run's model fills it), or set {given} {value}"
            )
    for name in _NESTED:
        value = fields.get(name)
        if isinstance(value, Mapping):
            items = cast("Mapping[object, object]", value)
            bound_map = {k: bind_policy(b, model, where=f"{where}.{name}[{k!r}]") for k, b in items.items()}
            if any(bound_map[k] is not b for k, b in items.items()):
                changes[name] = bound_map
        elif isinstance(value, tuple | list):
            seq = cast("Sequence[object]", value)
            bound = [bind_policy(b, model, where=f"{where}.{name}[{i}]") for i, b in enumerate(seq)]
            if any(b is not o for b, o in zip(bound, seq, strict=True)):
                changes[name] = tuple(bound) if isinstance(value, tuple) else bound
    return _replace(builder, changes)

"""The flat spellings of a recipe's nested stage flags: ``--sft-steps`` for ``--sft.steps``.

A recipe holds its stages as nested configs (``sft: SFTStage``, ``rl: RLStage``; declared with
:func:`tempering.recipes.stages.stage_field`), so tyro's flags are ``--sft.steps``,
``--rl.learning-rate``. Recipes used to have flat fields (``sft_steps``, ``rl_learning_rate``)
and the docs and scripts spell them so; :func:`flat_aliases` generates the table of those old
spellings from the config class itself, and :func:`expand_aliases` rewrites a command line with
it before tyro reads it. The table is the one place the old names live: for every stage field
``<name>`` with flat prefix ``<flat>`` (default: the field's name; ``""``: none), each of the
stage's fields ``<x>`` is also ``--<flat>-<x>``, plus the stage's ``renamed`` older names. A
flat spelling that is a real flag of the config is left alone (the real flag wins).

Example::

    flat_aliases(GuessNumberRecipe)["sft-steps"]            # 'sft.steps'
    expand_aliases(GuessNumberRecipe, ["--rl-steps=3", "--seed", "1"])   # ['--rl.steps=3', '--seed', '1']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

__all__ = ["expand_aliases", "flat_aliases"]

_FLAT = "tempering_flat"
_RENAMED = "tempering_renamed"
"""Field metadata keys set by :func:`tempering.recipes.stages.stage_field` (kept in step by
``tests/recipes/test_stage_flags.py``)."""


def _dashed(name: str) -> str:
    return name.replace("_", "-")


def _flags(cls: type[Any]) -> set[str]:
    """The config's own top-level flags (without ``--``), booleans both ways."""
    out: set[str] = set()
    for field in attrs.fields(cls):
        out.add(_dashed(field.name))
        if isinstance(field.default, bool):
            out.add("no-" + _dashed(field.name))
    return out


def flat_aliases(cls: type[Any]) -> dict[str, str]:
    """Old flat flag → nested flag (both without ``--``) for every stage field of ``cls`` (an
    attrs config; empty for a config without stage fields)."""
    if not attrs.has(cls):
        return {}
    table: dict[str, str] = {}
    for field in attrs.fields(cls):
        if _FLAT not in field.metadata or not attrs.has(type(field.default)):
            continue
        group = _dashed(field.name)
        flat: str | None = field.metadata[_FLAT]
        prefix = _dashed(field.name if flat is None else flat)
        for sub in attrs.fields(type(field.default)):
            leaf = _dashed(sub.name)
            table[f"{prefix}-{leaf}" if prefix else leaf] = f"{group}.{leaf}"
            if isinstance(sub.default, bool):
                table[f"no-{prefix}-{leaf}" if prefix else f"no-{leaf}"] = f"{group}.no-{leaf}"
        renamed: Mapping[str, str] = field.metadata.get(_RENAMED) or {}
        for old, leaf in renamed.items():
            table[old] = f"{group}.{_dashed(leaf)}"
    real = _flags(cls)
    return {old: new for old, new in table.items() if old not in real}


def expand_aliases(cls: type[Any], argv: Sequence[str]) -> list[str]:
    """``argv`` with every flat stage flag of ``cls`` (``--sft-steps 3``, ``--sft-steps=3``)
    written as its nested flag (``--sft.steps``); everything after ``--`` is left alone. One
    setting given in both spellings (``--sft-steps 3 --sft.steps 4``) is refused with both names
    (``FlagError``); one spelling given twice is left to ``check_flags``."""
    from tempering.cli._checks import FlagError

    table = flat_aliases(cls)
    out: list[str] = []
    spelled: dict[str, str] = {}
    for i, token in enumerate(argv):
        if token == "--":
            return [*out, *argv[i:]]
        name, eq, value = token.partition("=")
        if name.startswith("--"):
            target = "--" + table.get(name[2:], name[2:])
            first = spelled.setdefault(target, name)
            if first != name:
                raise FlagError(f"{first} and {name} are both given; they set the same {target}, give one")
            token = f"{target}{eq}{value}"
        out.append(token)
    return out

"""``--dataset-builder module.path:Name``: train on your own dataset builder from the command line.

``tempering rl|sft|dpo --dataset-builder pkg.mod:MyBuilder [flags]`` imports ``MyBuilder`` (an
attrs class or dataclass, or an instance of one, whose fields become flags:
``--dataset.FIELD`` for ``rl``, ``--data.FIELD`` for the others), checks it against the
trainer's builder protocol and trains on it:

=======  ===============================================  ======================================
command  protocol (``tempering_protocols``)                 what ``__call__`` must be
=======  ===============================================  ======================================
``rl``   :class:`~tempering_protocols.RLDatasetBuilder`   ``async def __call__(self)`` returning
                                                          ``(train RLDataset, test or None)``
``sft``  :class:`~tempering_protocols.SupervisedDatasetBuilder`  ``def __call__(self)`` returning
                                                          ``(train SupervisedDataset, test or None)``
``dpo``  :class:`~tempering_protocols.ComparisonDatasetBuilder`  ``def __call__(self)`` returning
                                                          ``(train ComparisonDataset, test or None)``
=======  ===============================================  ======================================

These are the Tinker Cookbook's builder shapes too (its builders are ``chz`` classes; write yours
as attrs classes or dataclasses). A path that does not import, or an object that does not
conform, is refused with a :class:`BuilderError` naming the module, the attribute or what is
missing, before anything runs.

Example::

    tempering rl --dataset-builder my_envs:CountdownBuilder --dataset.group-size 8 --num-steps 20
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from tempering_protocols import ComparisonDatasetBuilder, RLDatasetBuilder, SupervisedDatasetBuilder

__all__ = ["FLAG", "BuilderError", "flag_help", "load_builder", "split_builder_flag", "with_dataset_builder"]

FLAG = "--dataset-builder"

_PROTOCOLS: dict[str, tuple[type, str]] = {
    "rl": (RLDatasetBuilder, "dataset"),
    "sft": (SupervisedDatasetBuilder, "data"),
    "dpo": (ComparisonDatasetBuilder, "data"),
}
"""command → (the builder protocol, the config field the builder goes in)."""


def flag_help(command: str) -> str:
    """A line for ``tempering COMMAND --help`` about the flag ("" for a command without it)."""
    if command not in _PROTOCOLS:
        return ""
    protocol, field = _PROTOCOLS[command]
    return (
        f"\n{FLAG} module.path:Name trains on your own {protocol.__name__} (an attrs class or "
        f"dataclass), its fields as --{field}.FIELD flags."
    )


class BuilderError(ValueError):
    """A ``--dataset-builder`` that cannot be used; the message says why and what to do."""


def split_builder_flag(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """``(PATH, the other arguments)`` of ``--dataset-builder PATH`` (or ``=PATH``) in ``argv``,
    anywhere in it; ``(None, argv)`` without one."""
    rest: list[str] = []
    spec: str | None = None
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == FLAG or arg.startswith(FLAG + "="):
            if spec is not None:
                raise BuilderError(f"{FLAG} is given twice; give one builder")
            if arg == FLAG:
                if i + 1 >= len(args) or args[i + 1].startswith("-"):
                    raise BuilderError(f"{FLAG} needs a value: module.path:Name")
                spec, i = args[i + 1], i + 2
                continue
            spec = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    return spec, rest


def _import(spec: str) -> object:
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise BuilderError(f"{FLAG} {spec!r}: expected module.path:Name (e.g. my_envs:CountdownBuilder)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BuilderError(
            f"{FLAG} {spec!r}: cannot import module {module_name!r} ({exc}); is its directory on "
            "PYTHONPATH (or the package installed)?"
        ) from exc
    except Exception as exc:  # the module's own code failed: SyntaxError, a bad top-level call...
        raise BuilderError(
            f"{FLAG} {spec!r}: importing module {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    obj: object = module
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise BuilderError(f"{FLAG} {spec!r}: module {module_name!r} has no attribute {attribute!r}")
        obj = getattr(obj, part)
    return obj


def _missing(cls: type, protocol: type) -> list[str]:
    """What ``cls`` lacks to satisfy ``protocol`` (whose only member is ``__call__``)."""
    wanted = protocol.__dict__["__call__"]
    want_async = inspect.iscoroutinefunction(wanted)
    shape = f"{'async ' if want_async else ''}def __call__(self)"
    own = next((k.__dict__["__call__"] for k in cls.__mro__[:-1] if "__call__" in k.__dict__), None)
    if own is None:
        return [f"a `{shape}` method returning (train dataset, test dataset or None)"]
    problems: list[str] = []
    if want_async and not inspect.iscoroutinefunction(own):
        problems.append(f"its __call__ must be async (`{shape}`): the RL loop awaits it")
    if not want_async and inspect.iscoroutinefunction(own):
        problems.append(f"its __call__ must not be async (`{shape}`)")
    try:
        params = list(inspect.signature(own).parameters.values())[1:]
    except (TypeError, ValueError):
        params = []
    required = [
        p.name
        for p in params
        if p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    if required:
        problems.append(
            f"its __call__ takes required arguments ({', '.join(required)}); it is called with none"
        )
    return problems


def load_builder(spec: str, command: str) -> tuple[type, object | None]:
    """``(builder class, default instance or None)`` of ``spec`` for ``command``; raises
    :class:`BuilderError` naming what does not import or what the object lacks."""
    protocol = _PROTOCOLS[command][0]
    obj = _import(spec)
    if isinstance(obj, type):
        cls, default = obj, None
    elif _is_config(type(obj)):
        cls, default = type(obj), obj
    else:
        raise BuilderError(
            f"{FLAG} {spec!r} is a {type(obj).__name__}, not a builder: name an attrs class or a "
            f"dataclass (or an instance of one) that is a {protocol.__name__}"
        )
    what = f"{FLAG} {spec!r}: {cls.__module__}.{cls.__qualname__}"
    problems = _missing(cls, protocol)
    if not _is_config(cls):
        problems.insert(0, "it is not an attrs class or a dataclass (its fields become the command's flags)")
    if problems:
        raise BuilderError(
            f"{what} is not a {protocol.__name__} (tempering_protocols): " + "; ".join(problems) + "."
        )
    return cls, default


def _is_config(cls: type) -> bool:
    return attrs.has(cls) or dataclasses.is_dataclass(cls)


def with_dataset_builder(
    command: str, base: type[Any], argv: Sequence[str]
) -> tuple[type[Any], list[str], Callable[[Any], Any]]:
    """``(class for tyro, argv without the flag, parsed → config to run)`` for ``command``.

    Without ``--dataset-builder``: ``base``, ``argv`` and the identity. With it: a subclass of
    ``base`` whose dataset field has the builder's type (so tyro exposes its fields), and a
    function that turns what tyro parsed back into a plain ``base`` config holding the builder.
    """
    spec, rest = split_builder_flag(argv)
    if spec is None:
        return base, rest, lambda parsed: parsed
    if command not in _PROTOCOLS:
        raise BuilderError(f"{FLAG} is not taken by `tempering {command}`")
    builder_cls, default = load_builder(spec, command)
    field = _PROTOCOLS[command][1]
    plain = _plain_base(command, base)
    spec_field = (
        attrs.field(type=builder_cls) if default is None else attrs.field(type=builder_cls, default=default)
    )
    cls = attrs.make_class(
        f"{plain.__name__}[{builder_cls.__name__}]",
        {field: spec_field},
        bases=(plain,),
        frozen=True,
        kw_only=True,
        slots=True,
    )
    cls.__doc__ = plain.__doc__

    def finish(parsed: Any) -> Any:
        values = {a.name: getattr(parsed, a.name) for a in attrs.fields(plain) if a.init}
        if command == "sft":
            values[field] = _Built(builder=values[field])
        return plain(**values)

    return cls, rest, finish


def _plain_base(command: str, base: type[Any]) -> type[Any]:
    """The trainer's own config class (``tempering rl``'s CLI class narrows ``dataset``)."""
    if command == "rl":
        from tempering.rl.train import RLConfig

        return RLConfig
    return base


@attrs.frozen
class _Built:
    """A ready :class:`~tempering_protocols.SupervisedDatasetBuilder` where ``SFTConfig.data``
    (which is called with the model) expects a :class:`~tempering.sft.ChatData`."""

    builder: SupervisedDatasetBuilder

    def __call__(self, model: object) -> SupervisedDatasetBuilder:
        del model
        return self.builder

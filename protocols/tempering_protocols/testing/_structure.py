"""Structural conformance at run time: does a class (or object) provide a protocol's members?

``isinstance`` with a ``runtime_checkable`` protocol only looks for member names. These checks
also compare each method's signature with the protocol's: every argument the protocol lets a
caller pass must bind, the implementation must not require more, and ``async def`` members
must be coroutine functions (and plain ones must not be).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import NamedTuple

from tempering_protocols.testing._base import ConformanceError, name_of

__all__ = ["check_class_implements", "protocol_members"]

# Names typing.Protocol itself puts in a protocol's namespace; they are not members.
_NOT_MEMBERS = frozenset(
    {
        "__abstractmethods__",
        "__annotations__",
        "__annotate__",
        "__annotate_func__",
        "__annotations_cache__",
        "__class_getitem__",
        "__dict__",
        "__doc__",
        "__firstlineno__",
        "__init__",
        "__init_subclass__",
        "__module__",
        "__new__",
        "__non_callable_proto_members__",
        "__orig_bases__",
        "__parameters__",
        "__protocol_attrs__",
        "__qualname__",
        "__slots__",
        "__static_attributes__",
        "__subclasshook__",
        "__type_params__",
        "__weakref__",
        "_is_protocol",
        "_is_runtime_protocol",
    }
)


class _Placeholder:
    """A stand-in argument; only its position or keyword matters to ``Signature.bind``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


class _Shape(NamedTuple):
    """How a member is called once bound: its signature without ``self``, and whether it is async."""

    signature: inspect.Signature
    is_async: bool


def protocol_members(protocol: type) -> list[str]:
    """The member names of a ``typing.Protocol`` class, including those of protocol bases, sorted.

    Example::

        protocol_members(Env)  # ['initial_observation', 'step']
    """
    if not getattr(protocol, "_is_protocol", False):
        raise TypeError(f"{name_of(protocol)} is not a typing.Protocol class")
    names: set[str] = set()
    for base in protocol.__mro__:
        if base is object or not getattr(base, "_is_protocol", False) or base.__module__ == "typing":
            continue
        annotations = inspect.get_annotations(base)
        for name in (*base.__dict__, *annotations):
            if name not in _NOT_MEMBERS and not name.startswith("_abc_"):
                names.add(name)
    return sorted(names)


def _drop_first(signature: inspect.Signature) -> inspect.Signature:
    params = list(signature.parameters.values())
    if params and params[0].kind in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        params = params[1:]
    return signature.replace(parameters=params)


def _is_async(fn: object) -> bool:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn)


def _class_member_shape(cls: type, name: str) -> _Shape | None:
    """The shape of ``cls.name`` as called on an instance; ``None`` if it is not callable."""
    try:
        static = inspect.getattr_static(cls, name)
    except AttributeError:
        return None  # declared by annotation only
    if isinstance(static, staticmethod):
        fn: Callable[..., object] = static.__func__
        return _Shape(inspect.signature(fn), _is_async(fn))
    if isinstance(static, classmethod):
        bound = getattr(cls, name)
        return _Shape(inspect.signature(bound), _is_async(bound))
    if inspect.isfunction(static):
        return _Shape(_drop_first(inspect.signature(static)), _is_async(static))
    if isinstance(static, functools.partialmethod):
        bound_on_class = getattr(cls, name)
        return _Shape(_drop_first(inspect.signature(bound_on_class)), _is_async(static.func))
    if callable(static) and not isinstance(static, type):
        # Some other descriptor or callable object stored on the class (e.g. a C method).
        try:
            signature = inspect.signature(getattr(cls, name))
        except (TypeError, ValueError):
            return _Shape(inspect.Signature([_var_positional(), _var_keyword()]), False)
        return _Shape(_drop_first(signature), _is_async(static))
    return None


def _object_member_shape(obj: object, name: str) -> _Shape | None:
    """The shape of ``obj.name`` as called; a plain function is its own ``__call__``."""
    member: object
    if name == "__call__" and (
        inspect.isfunction(obj) or inspect.ismethod(obj) or isinstance(obj, functools.partial)
    ):
        member = obj
    else:
        member = getattr(obj, name)
    if not callable(member):
        return None
    try:
        signature = inspect.signature(member)
    except (TypeError, ValueError):
        signature = inspect.Signature([_var_positional(), _var_keyword()])
    return _Shape(signature, _is_async(member))


def _var_positional() -> inspect.Parameter:
    return inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL)


def _var_keyword() -> inspect.Parameter:
    return inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)


def _signature_problem(expected: inspect.Signature, actual: inspect.Signature) -> str | None:
    """Why a callable with signature ``actual`` cannot stand in for ``expected``, or ``None``."""
    kinds = {p.kind for p in actual.parameters.values()}
    all_args: list[_Placeholder] = []
    all_kwargs: dict[str, _Placeholder] = {}
    required_args: list[_Placeholder] = []
    required_kwargs: dict[str, _Placeholder] = {}
    for param in expected.parameters.values():
        arg = _Placeholder(param.name)
        required = param.default is inspect.Parameter.empty
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            if inspect.Parameter.VAR_POSITIONAL not in kinds:
                return f"the protocol accepts *{param.name} but the implementation has no *args"
        elif param.kind is inspect.Parameter.VAR_KEYWORD:
            if inspect.Parameter.VAR_KEYWORD not in kinds:
                return f"the protocol accepts **{param.name} but the implementation has no **kwargs"
        elif param.kind is inspect.Parameter.KEYWORD_ONLY:
            all_kwargs[param.name] = arg
            if required:
                required_kwargs[param.name] = arg
        else:
            all_args.append(arg)
            if required:
                required_args.append(arg)

    n_positional = len(all_args)
    try:
        actual.bind(*all_args, **all_kwargs)
    except TypeError as exc:
        return f"it cannot be called with the protocol's {n_positional} positional argument(s) ({exc})"
    try:
        actual.bind(*required_args, **required_kwargs)
    except TypeError as exc:
        return (
            f"it requires more than the protocol's {len(required_args)} required positional "
            f"argument(s) ({exc})"
        )
    # Parameters the protocol does not make positional-only may be passed by name.
    positional_only = [
        _Placeholder(p.name)
        for p in expected.parameters.values()
        if p.kind is inspect.Parameter.POSITIONAL_ONLY
    ]
    by_name = {
        p.name: _Placeholder(p.name)
        for p in expected.parameters.values()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    if len(by_name) > len(all_kwargs):
        try:
            actual.bind(*positional_only, **by_name)
        except TypeError as exc:
            return f"it does not accept {sorted(by_name)} by keyword as the protocol does ({exc})"
    return None


def _find_problem(
    target: object, protocol: type, shape_of: Callable[[str], _Shape | None]
) -> tuple[str, str] | None:
    """The first (rule, detail) that ``target`` breaks, or ``None`` when it conforms."""
    for name in protocol_members(protocol):
        if not hasattr(target, name):
            annotations: dict[str, object] = getattr(target, "__annotations__", {})
            if isinstance(target, type) and name in annotations:
                continue  # a data member declared on the class, set per instance
            return "protocol/missing-member", f"it has no {name!r}"
        expected = _class_member_shape(protocol, name)
        if expected is None:
            continue  # a data member: presence is all that can be checked
        actual = shape_of(name)
        if actual is None:
            return "protocol/signature", f"{name!r} is not callable"
        if expected.is_async != actual.is_async:
            want = "an `async def` coroutine function" if expected.is_async else "a plain (not async) method"
            return "protocol/async", f"{name!r} must be {want}"
        problem = _signature_problem(expected.signature, actual.signature)
        if problem is not None:
            return (
                "protocol/signature",
                f"{name}{actual.signature} does not fit the protocol's {name}{expected.signature}: {problem}",
            )
    return None


def check_class_implements(cls: type, protocol: type, /) -> None:
    """Check at run time that instances of ``cls`` provide every member of ``protocol``.

    Each protocol method must exist on ``cls``, accept the protocol's positional (and keyword)
    arguments, require no more than the protocol does, and be ``async`` exactly when the
    protocol's is. Return annotations are not compared (that is a static check's job).

    Rules: ``protocol/missing-member``, ``protocol/signature``, ``protocol/async``.

    Example::

        check_class_implements(tinker.TrainingClient, tempering_protocols.TrainingClient)
    """
    problem = _find_problem(cls, protocol, functools.partial(_class_member_shape, cls))
    if problem is not None:
        rule, detail = problem
        raise ConformanceError(rule, f"{name_of(cls)} does not implement {name_of(protocol)}: {detail}")


def check_object_implements(obj: object, protocol: type, where: str = "", /) -> None:
    """Like :func:`check_class_implements`, for one object (members it set on itself count).

    A plain function or bound method stands for its own ``__call__``.

    Example::

        async def policy(model_input, stop): ...
        check_object_implements(policy, TokenCompleter)
    """
    if isinstance(obj, type):
        raise TypeError(
            f"{name_of(obj)} is a class; pass an instance (check_class_implements checks classes)"
        )
    problem = _find_problem(obj, protocol, functools.partial(_object_member_shape, obj))
    if problem is not None:
        rule, detail = problem
        raise ConformanceError(
            rule, f"{name_of(obj)}{where} does not implement {name_of(protocol)}: {detail}"
        )


def object_problem(obj: object, protocol: type) -> str | None:
    """Why ``obj`` does not implement ``protocol`` (one line), or ``None`` when it does."""
    problem = _find_problem(obj, protocol, functools.partial(_object_member_shape, obj))
    return None if problem is None else f"{name_of(obj)} does not implement {name_of(protocol)}: {problem[1]}"

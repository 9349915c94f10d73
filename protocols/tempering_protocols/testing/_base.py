"""What every check shares: the error type, type checks, naming, and the sync entry point."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Awaitable, Callable, Coroutine
from typing import TypeVar

from typeguard import CollectionCheckStrategy, TypeCheckError, check_type

__all__ = ["ConformanceError"]

_T = TypeVar("_T")

STOP_CONDITION_TYPE = list[str] | list[int]
"""``StopCondition`` as a runtime type expression (the alias itself is a string)."""

METRICS_TYPE = dict[str, float | int]
"""``Metrics`` as a runtime type expression."""


class ConformanceError(AssertionError):
    """An implementation broke a rule of its protocol.

    The message starts with the rule id in brackets and names the object, so a failing test
    says what to fix. ``rule`` holds the id alone.

    Example::

        try:
            check_env(MyEnv())
        except ConformanceError as err:
            err.rule   # "env/step-after-done"
            str(err)   # "[env/step-after-done] MyEnv accepted step() after episode_done ..."
    """

    rule: str
    detail: str

    def __init__(self, rule: str, detail: str) -> None:
        super().__init__(f"[{rule}] {detail}")
        self.rule = rule
        self.detail = detail

    def __reduce__(self) -> tuple[type[ConformanceError], tuple[str, str]]:
        return (ConformanceError, (self.rule, self.detail))


def name_of(obj: object) -> str:
    """A short name for messages: the qualified name of a class or function, else of its type.

    The function a local class was defined in is left out (``Outer.Inner``, not
    ``test_x.<locals>.Inner``).
    """
    qualname = getattr(obj, "__qualname__", None)
    if not (isinstance(qualname, str) and (isinstance(obj, type) or callable(obj))):
        qualname = type(obj).__qualname__
    return qualname.rpartition("<locals>.")[2]


def short_repr(value: object, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def expect_type(value: object, expected: object, *, rule: str, what: str) -> None:
    """Raise ``ConformanceError(rule)`` unless ``value`` matches the type expression ``expected``.

    Every item of every collection is checked, not only the first.
    """
    try:
        check_type(value, expected, collection_check_strategy=CollectionCheckStrategy.ALL_ITEMS)
    except TypeCheckError as exc:
        raise ConformanceError(rule, f"{what}: got {short_repr(value)} ({exc})") from None


def raised(rule: str, what: str, exc: Exception) -> ConformanceError:
    """The error for an implementation that raised where the contract says it returns."""
    return ConformanceError(rule, f"{what} raised {type(exc).__name__}: {exc}")


def call(rule: str, what: str, fn: Callable[[], _T]) -> _T:
    """``fn()``, turning an exception from the implementation into ``ConformanceError(rule)``."""
    try:
        return fn()
    except ConformanceError:
        raise
    except Exception as exc:
        raise raised(rule, what, exc) from exc


async def acall(rule: str, what: str, fn: Callable[[], Awaitable[_T]]) -> _T:
    """``await fn()``, turning an exception from the implementation into ``ConformanceError(rule)``."""
    try:
        return await fn()
    except ConformanceError:
        raise
    except Exception as exc:
        raise raised(rule, what, exc) from exc


def pickle_round_trip(obj: _T, *, rule: str, what: str) -> _T:
    """``obj`` through ``pickle.dumps``/``pickle.loads``; ``ConformanceError(rule)`` if that fails."""
    try:
        clone: _T = pickle.loads(pickle.dumps(obj))
    except Exception as exc:
        raise ConformanceError(
            rule, f"{what} does not pickle ({type(exc).__name__}: {exc}); it may be sent to a worker process"
        ) from exc
    return clone


def run_sync(coro: Coroutine[object, object, _T], name: str) -> _T:
    """Run a check coroutine to completion from synchronous code.

    Refuses (and closes the coroutine) when an event loop is already running in this thread:
    ``asyncio.run`` cannot nest, and the caller should ``await`` the ``a``-prefixed variant.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    coro.close()
    raise RuntimeError(f"{name}() was called inside a running event loop; use `await a{name}(...)` there")

"""What every check shares: the error type, type checks, naming, and the sync entry point."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import math
import pickle
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Final, TypeVar

from typeguard import CollectionCheckStrategy, TypeCheckError, check_type

__all__ = ["DEFAULT_CALL_TIMEOUT_S", "ConformanceError", "call_timeout"]

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


DEFAULT_CALL_TIMEOUT_S: Final = 60.0
"""The time limit of each awaited call into an implementation (``initial_observation()``,
``step()``, ``make_envs()``, a completer, ...); change it with :func:`call_timeout`."""

_CALL_TIMEOUT: contextvars.ContextVar[float] = contextvars.ContextVar(
    "tempering_conformance_call_timeout", default=DEFAULT_CALL_TIMEOUT_S
)

_TIMEOUT_RULES: Final = {
    "env/raised": "env/timeout",
    "builder/raised": "builder/timeout",
    "rl-dataset-builder/raised": "rl-dataset-builder/timeout",
    "completer/raised": "completer/timeout",
    "message-completer/raised": "message-completer/timeout",
}
"""The rule an awaited call breaks by not returning in time, by the rule it breaks by raising."""


@contextlib.contextmanager
def call_timeout(seconds: float) -> Generator[None]:
    """Within the block, each awaited call into an implementation must return within
    ``seconds`` (default :data:`DEFAULT_CALL_TIMEOUT_S`), or the check fails with the call's
    ``*/timeout`` rule (``env/timeout``, ``builder/timeout``, ...) instead of hanging.

    Example::

        with call_timeout(5):
            check_env(MyEnv())
    """
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"call_timeout: seconds must be a finite number > 0, got {seconds}")
    token = _CALL_TIMEOUT.set(seconds)
    try:
        yield
    finally:
        _CALL_TIMEOUT.reset(token)


async def acall(rule: str, what: str, fn: Callable[[], Awaitable[_T]]) -> _T:
    """``await fn()``, turning an exception from the implementation into ``ConformanceError(rule)``
    and a call that does not return within the kit's time limit into the rule's ``*/timeout``."""
    seconds = _CALL_TIMEOUT.get()
    limit = asyncio.timeout(seconds)
    try:
        async with limit:
            return await fn()
    except ConformanceError:
        raise
    except TimeoutError as exc:
        if not limit.expired():
            raise raised(rule, what, exc) from exc
        raise ConformanceError(
            _TIMEOUT_RULES.get(rule, rule),
            f"{what} did not return within {seconds:g} s (the kit's time limit per call; "
            "`with tempering_protocols.testing.call_timeout(seconds):` changes it)",
        ) from None
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

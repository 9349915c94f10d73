"""pytest plugin of the conformance kit, registered as the ``pytest11`` entry point
``tempering_protocols``: installing ``tempering-protocols`` activates it (disable it with
``-p no:tempering_protocols``).

It gives downstream test suites two things:

- the fixture ``conformance``, a :class:`~tempering_protocols.testing.Conformance` carrying
  every check function;
- the option ``--tempering-conformance=pkg.module:obj[@kind][,...]`` (repeatable; also the ini
  key ``tempering_conformance``, one spec per line), which adds one test item per named object
  running the check for its protocol. A class is instantiated with no arguments; any other
  object is checked as it is. The kind (``env``, ``env_group_builder``, ``rl_dataset``, ...) is
  detected from the object's members unless given after ``@``.

Example::

    # tests/test_envs.py
    def test_reverse(conformance):
        conformance.check_env_group_builder(ReverseGroup(prompt=(5, 6, 7)))

    # or, with no test code at all:
    #   pytest --tempering-conformance=mypkg.envs:ReverseGroupDefaults,mypkg.policy:POLICY@token_completer
"""

from __future__ import annotations

import importlib
from typing import cast, get_args

import pytest

from tempering_protocols.testing import CHECKS, Conformance, ConformanceError, Kind, detect_kind

__all__ = ["ConformanceItem", "conformance", "resolve_spec"]

_OPTION = "--tempering-conformance"
_INI = "tempering_conformance"
_ITEM_PREFIX = "tempering-conformance["


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tempering", "tempering protocol conformance")
    group.addoption(
        _OPTION,
        action="append",
        default=[],
        metavar="MODULE:OBJECT[@KIND][,...]",
        help="run the tempering conformance kit on these objects, one test item each; "
        f"KIND is one of {', '.join(CHECKS)} (detected when left out)",
    )
    parser.addini(
        _INI, type="linelist", default=[], help=f"like {_OPTION}, one MODULE:OBJECT[@KIND] per line"
    )


@pytest.fixture
def conformance() -> Conformance:
    """The tempering conformance kit: ``conformance.check_env(MyEnv())`` and friends.

    Example::

        def test_my_dataset(conformance):
            conformance.check_supervised_dataset(MyDataset(batch_size=2))
    """
    return Conformance()


def _specs(config: pytest.Config) -> list[str]:
    raw = [*cast(list[str], config.getini(_INI)), *cast(list[str], config.getoption(_OPTION))]
    return [spec.strip() for value in raw for spec in value.split(",") if spec.strip()]


class SpecError(Exception):
    """A ``--tempering-conformance`` spec that names nothing checkable."""


def resolve_spec(spec: str) -> tuple[object, Kind | None]:
    """The object a ``MODULE:OBJECT[@KIND]`` spec names (classes instantiated) and its kind.

    Example::

        resolve_spec("mypkg.envs:ReverseGroupDefaults@env_group_builder")
    """
    target, _, kind = spec.partition("@")
    if kind and kind not in get_args(Kind):
        raise SpecError(f"{spec!r}: unknown kind {kind!r}; use one of {', '.join(CHECKS)}")
    module_name, sep, attr_path = target.partition(":")
    if not sep or not module_name or not attr_path:
        raise SpecError(f"{spec!r}: expected MODULE:OBJECT[@KIND], e.g. mypkg.envs:MyGroup")
    try:
        obj: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise SpecError(f"{spec!r}: cannot import {module_name!r}: {exc}") from exc
    for attr in attr_path.split("."):
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            raise SpecError(f"{spec!r}: {module_name}:{attr_path} does not exist") from None
    if isinstance(obj, type):
        try:
            obj = obj()
        except Exception as exc:
            raise SpecError(
                f"{spec!r}: cannot instantiate {obj.__qualname__} with no arguments ({exc}); "
                "name a ready instance instead"
            ) from exc
    return obj, cast(Kind, kind) if kind else None


class ConformanceItem(pytest.Item):
    """One ``--tempering-conformance`` spec, run as a test; a failure shows the rule's message.

    Example::

        # pytest -v --tempering-conformance=mypkg.envs:MyGroup
        # tempering-conformance[mypkg.envs:MyGroup] PASSED
    """

    @property
    def spec(self) -> str:
        return self.name.removeprefix(_ITEM_PREFIX).removesuffix("]")

    def runtest(self) -> None:
        try:
            obj, kind = resolve_spec(self.spec)
            if kind is None:
                kind = detect_kind(obj)
        except (SpecError, TypeError) as exc:
            pytest.fail(str(exc), pytrace=False)
        try:
            CHECKS[kind](obj)
        except ConformanceError as exc:
            pytest.fail(str(exc), pytrace=False)

    def reportinfo(self) -> tuple[str, int | None, str]:
        return str(self.path), None, f"tempering conformance of {self.spec}"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, items: list[pytest.Item]) -> None:
    # tryfirst: the items exist before -k / -m deselection runs.
    for spec in _specs(session.config):
        items.append(ConformanceItem.from_parent(session, name=f"{_ITEM_PREFIX}{spec}]"))

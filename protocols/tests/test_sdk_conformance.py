"""Run-time proof that the official SDK clients provide tempering's backend protocols.

``sdk_static_conformance.py`` proves the same statically (pyright). Here every protocol member
must exist on the SDK class, accept the protocol's arguments, require no more, and be async
exactly when the protocol's is; ``check_class_implements`` is itself tested below on classes
that break each of those.
"""

from __future__ import annotations

import inspect
from collections.abc import Generator

import pytest
import tinker

from tempering_protocols import Env, Future, RLDataset, SamplingClient, TokenCompleter, TrainingClient
from tempering_protocols.testing import (
    ConformanceError,
    check_class_implements,
    check_object_implements,
    protocol_members,
)
from tempering_protocols.types import Action, Observation, StepResult, StopCondition, TokensWithLogprobs

SDK_CLASSES = [
    (tinker.TrainingClient, TrainingClient),
    (tinker.SamplingClient, SamplingClient),
    (tinker.APIFuture, Future),
]


@pytest.mark.parametrize(("sdk_class", "protocol"), SDK_CLASSES, ids=lambda c: getattr(c, "__name__", "?"))
def test_official_sdk_class_implements_protocol(sdk_class: type, protocol: type) -> None:
    check_class_implements(sdk_class, protocol)


def test_protocol_members_are_the_ones_trainers_use() -> None:
    # Pinned so that the run-time check above cannot pass vacuously.
    assert protocol_members(TrainingClient) == [
        "forward",
        "forward_backward",
        "forward_backward_custom",
        "get_info",
        "get_tokenizer",
        "load_state",
        "optim_step",
        "save_state",
        "save_weights_and_get_sampling_client",
        "save_weights_for_sampler",
    ]
    assert protocol_members(SamplingClient) == ["compute_logprobs", "sample"]
    assert protocol_members(Future) == ["__await__", "result"]
    assert protocol_members(Env) == ["initial_observation", "step"]


@pytest.mark.parametrize(("sdk_class", "protocol"), SDK_CLASSES, ids=lambda c: getattr(c, "__name__", "?"))
def test_sdk_methods_bind_the_protocol_arguments_positionally(sdk_class: type, protocol: type) -> None:
    # The same property spelled out with inspect, independent of the helper under test.
    for name in protocol_members(protocol):
        expected = inspect.signature(getattr(protocol, name))
        actual = inspect.signature(getattr(sdk_class, name))
        n_positional = len(expected.parameters)  # self included, all positional-only
        placeholders = [object()] * n_positional
        actual.bind(*placeholders)
        required = [p for p in expected.parameters.values() if p.default is inspect.Parameter.empty]
        actual.bind(*placeholders[: len(required)])


def test_protocol_members_refuses_a_non_protocol() -> None:
    with pytest.raises(TypeError, match=r"not a typing\.Protocol"):
        protocol_members(tinker.TrainingClient.__mro__[-1])


# ---------------------------------------------------------------------------- the helper itself


class FakeFuture:
    def result(self, timeout: float | None = None) -> int:
        return 1

    def __await__(self) -> Generator[None, None, int]:
        yield None
        return 1


class FutureWithoutAwait:
    def result(self, timeout: float | None = None) -> int:
        return 1


class ResultNeedsTimeout(FakeFuture):
    def result(self, timeout: float) -> int:  # pyright: ignore[reportIncompatibleMethodOverride] -- deliberately broken
        return 1


class ResultTakesNothing(FakeFuture):
    def result(self) -> int:  # pyright: ignore[reportIncompatibleMethodOverride] -- deliberately broken
        return 1


class AsyncResult(FakeFuture):
    async def result(self, timeout: float | None = None) -> int:  # pyright: ignore[reportIncompatibleMethodOverride] -- deliberately broken
        return 1


class ResultAsAttribute(FakeFuture):
    result = 1  # pyright: ignore[reportAssignmentType] -- deliberately broken


class ExtraOptionalAndKeywordOnly:
    """Conforms: extra parameters with defaults, keyword-only extras, *args/**kwargs all fit."""

    def result(self, timeout: float | None = None, *rest: object, poll: float = 0.1, **extra: object) -> int:
        return 1

    def __await__(self) -> Generator[None, None, int]:
        yield None
        return 1


class StaticAndClassMethods:
    """Conforms: a staticmethod and a classmethod are called without ``self`` too."""

    @staticmethod
    async def initial_observation() -> tuple[Observation, StopCondition]:
        return tinker.ModelInput.empty(), [0]

    @classmethod
    async def step(cls, action: Action, /) -> StepResult:
        return StepResult(0.0, True, tinker.ModelInput.empty(), [0])


class LenTakesIndex:
    def get_batch(self, index: int, /) -> list[object]:
        return []

    def __len__(self, index: int) -> int:  # pyright: ignore[reportInvalidSignature] -- deliberately broken
        return 0


def test_conforming_classes_pass() -> None:
    check_class_implements(FakeFuture, Future)
    check_class_implements(ExtraOptionalAndKeywordOnly, Future)
    check_class_implements(StaticAndClassMethods, Env)


@pytest.mark.parametrize(
    ("cls", "protocol", "rule", "detail"),
    [
        (FutureWithoutAwait, Future, "protocol/missing-member", "it has no '__await__'"),
        (ResultNeedsTimeout, Future, "protocol/signature", "requires more than the protocol's 0 required"),
        (ResultTakesNothing, Future, "protocol/signature", "cannot be called with the protocol's 1"),
        (AsyncResult, Future, "protocol/async", "'result' must be a plain (not async) method"),
        (ResultAsAttribute, Future, "protocol/signature", "'result' is not callable"),
        (LenTakesIndex, RLDataset, "protocol/signature", "__len__(index: 'int')"),
    ],
    ids=["no-await", "needs-timeout", "takes-nothing", "async-result", "attribute", "len-takes-index"],
)
def test_check_class_implements_fires(cls: type, protocol: type, rule: str, detail: str) -> None:
    with pytest.raises(ConformanceError) as excinfo:
        check_class_implements(cls, protocol)
    assert excinfo.value.rule == rule
    message = str(excinfo.value)
    assert message.startswith(f"[{rule}] {cls.__name__} does not implement {protocol.__name__}: "), message
    assert detail in message


def test_keyword_callable_parameters_must_keep_their_names() -> None:
    from typing import Protocol

    class Scorer(Protocol):
        def score(self, text: str, *, strict: bool = False) -> float: ...

    class RenamesText:
        def score(self, s: str, *, strict: bool = False) -> float:
            return 0.0

    class DropsStrict:
        def score(self, text: str) -> float:
            return 0.0

    class Good:
        def score(self, text: str, *, strict: bool = False, extra: int = 0) -> float:
            return 0.0

    check_class_implements(Good, Scorer)
    with pytest.raises(ConformanceError, match=r"does not accept \['strict', 'text'\] by keyword"):
        check_class_implements(RenamesText, Scorer)
    with pytest.raises(ConformanceError, match=r"^\[protocol/signature\] DropsStrict"):
        check_class_implements(DropsStrict, Scorer)


def test_check_object_implements_sees_functions_as_their_own_call() -> None:
    async def policy(model_input: Observation, stop: StopCondition, /) -> TokensWithLogprobs:
        return TokensWithLogprobs(tokens=[1])

    async def one_argument(model_input: Observation) -> TokensWithLogprobs:
        return TokensWithLogprobs(tokens=[1])

    check_object_implements(policy, TokenCompleter)
    with pytest.raises(ConformanceError, match=r"^\[protocol/signature\] one_argument does not implement"):
        check_object_implements(one_argument, TokenCompleter)

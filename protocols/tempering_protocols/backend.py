"""The subset of the Tinker clients that tempering's trainers use.

The official ``tinker.TrainingClient`` and ``tinker.SamplingClient`` satisfy these protocols
as they are (pinned by tests, statically with pyright and at run time); so does
``tempering.local``. Trainers are written against these protocols only.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from typing import Any, Protocol, TypeAlias, TypeVar, runtime_checkable

import tinker
from tinker import types as ttypes

from tempering_protocols.rendering import Tokenizer

__all__ = ["CustomLossFn", "Future", "SamplingClient", "TrainingClient"]

_T_co = TypeVar("_T_co", covariant=True)

CustomLossFn: TypeAlias = Callable[[list[tinker.Datum], list[Any]], tuple[Any, dict[str, float]]]
"""``loss_fn(data_D, logprobs_D) -> (loss, metrics)`` on torch tensors (one logprob tensor per
datum, requiring grad)."""


@runtime_checkable
class Future(Protocol[_T_co]):
    """A result that can be awaited or waited for.

    Example::

        fut = client.forward_backward(data, "cross_entropy")
        out = await fut          # in async code
        out = fut.result()       # in sync code
    """

    def result(self, timeout: float | None = None, /) -> _T_co: ...

    def __await__(self) -> Generator[Any, Any, _T_co]: ...


@runtime_checkable
class SamplingClient(Protocol):
    """Samples from a fixed set of weights."""

    def sample(
        self,
        prompt: tinker.ModelInput,
        num_samples: int,
        sampling_params: tinker.SamplingParams,
        include_prompt_logprobs: bool = False,
        /,
    ) -> Future[ttypes.SampleResponse]: ...

    def compute_logprobs(self, prompt: tinker.ModelInput, /) -> Future[list[float | None]]: ...


@runtime_checkable
class TrainingClient(Protocol):
    """Trains one model. Requests execute in submission order; each returns a future at once,
    so an ``optim_step`` can be queued behind a ``forward_backward`` before either is awaited."""

    def forward(
        self,
        data: list[tinker.Datum],
        loss_fn: ttypes.LossFnType,
        loss_fn_config: Mapping[str, float | str] | None = None,
        /,
    ) -> Future[ttypes.ForwardBackwardOutput]: ...

    def forward_backward(
        self,
        data: list[tinker.Datum],
        loss_fn: ttypes.LossFnType,
        loss_fn_config: Mapping[str, float | str] | None = None,
        /,
    ) -> Future[ttypes.ForwardBackwardOutput]: ...

    def forward_backward_custom(
        self, data: list[tinker.Datum], loss_fn: CustomLossFn, /
    ) -> Future[ttypes.ForwardBackwardOutput]: ...

    def optim_step(self, adam_params: tinker.AdamParams, /) -> Future[ttypes.OptimStepResponse]: ...

    def save_state(self, name: str, /) -> Future[ttypes.SaveWeightsResponse]: ...

    def load_state(self, path: str, /) -> Future[ttypes.LoadWeightsResponse]: ...

    def save_weights_for_sampler(self, name: str, /) -> Future[ttypes.SaveWeightsForSamplerResponse]: ...

    def save_weights_and_get_sampling_client(self, name: str | None = None, /) -> SamplingClient: ...

    def get_info(self) -> ttypes.GetInfoResponse: ...

    def get_tokenizer(self) -> Tokenizer: ...

"""A third backend, beside the hosted service and the local engine: clients whose every request
completes at once, for the RL loop's overhead benchmark and the capability tests.

It is a backend in full: a :class:`FakeBackend` with its own :class:`Capabilities` (no full
training, no custom loss, no top-K logprobs; ``fake://`` checkpoints that the trainer deletes
itself; sessions finished with a status; a model of its own, ``fake/echo``, whose tokenizer it
provides), and clients that carry it as ``tempering_backend``. Nothing in ``python/`` names it:
the trainers find everything through :mod:`tempering.backends`.

Sampling returns completions drawn from ``rng`` (lengths in ``completion``) with logprob -1;
``forward_backward`` returns each datum's ``logprobs`` input; ``optim_step`` counts steps.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import attrs
import numpy as np
import tinker
from tinker import types as ttypes

from tempering.backends import Backend, Capabilities, ServiceClient
from tempering_protocols import Tokenizer

FAKE_MODEL = "fake/echo"


@attrs.define
class FakeStore:
    """The checkpoints a fake service holds, and what was removed from it."""

    saved: list[str] = attrs.Factory(list)
    removed: list[str] = attrs.Factory(list)

    def remove(self, path: str) -> None:
        if path not in self.saved:
            raise FileNotFoundError(f"no fake checkpoint {path}")
        self.saved.remove(path)
        self.removed.append(path)


class FakeBackend(Backend):
    name = "fake"
    title = "the fake backend"
    capabilities = Capabilities(
        full_training=False,
        custom_loss=False,
        topk_logprobs=False,
        checkpoint_ttl=False,
        checkpoint_schemes=("fake://",),
        trainer_deletes_checkpoints=True,
        session_close="status",
        builtin_models=frozenset({FAKE_MODEL}),
        tokenizer_source="built in (the tiny model's, for fake/echo)",
    )
    selected_because = "FAKE_BACKEND is set (fake backend)"
    how_to_select = "set FAKE_BACKEND"
    model_hint = f"e.g. --base-model {FAKE_MODEL}"

    def __init__(self, *, selected: bool = False) -> None:
        self._selected = selected

    def selected(self) -> bool:
        return self._selected

    def connect(self) -> ServiceClient:
        service: Any = FakeService()
        return service

    def remove_checkpoint(self, path: str, client: object | None, /) -> None:
        assert isinstance(client, FakeTrainer), f"a fake checkpoint removed without its trainer: {client!r}"
        client.store.remove(path)

    def tokenizer(self, base_model: str, /) -> Tokenizer | None:
        if base_model != FAKE_MODEL:
            return None
        from tempering.local.tiny import build_tiny_tokenizer

        return build_tiny_tokenizer()


FAKE = FakeBackend()


class Done:
    """A future that already holds its value."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def result(self, timeout: float | None = None) -> Any:
        return self.value

    def __await__(self) -> Generator[Any, Any, Any]:
        return self.value
        yield


@attrs.define
class FakeSampler:
    rng: np.random.Generator
    completion: tuple[int, int] = (64, 1024)
    tempering_backend: Backend = FAKE

    def sample(
        self, prompt: tinker.ModelInput, num_samples: int, params: tinker.SamplingParams, *a: Any
    ) -> Done:
        seqs = []
        for _ in range(num_samples):
            n = int(self.rng.integers(self.completion[0], self.completion[1] + 1))
            seqs.append(
                ttypes.SampledSequence(
                    stop_reason="stop",
                    sequence_id="s",
                    tokens_np=self.rng.integers(0, 256, n).astype(np.int32),
                    logprobs_np=np.full(n, -1.0, dtype=np.float32),
                )
            )
        return Done(ttypes.SampleResponse(sequences=seqs))

    def compute_logprobs(self, prompt: tinker.ModelInput) -> Done:
        return Done([None] * prompt.length)


@attrs.define
class FakeTrainer:
    rng: np.random.Generator
    completion: tuple[int, int] = (64, 1024)
    store: FakeStore = attrs.Factory(FakeStore)
    steps: int = 0
    tempering_backend: Backend = FAKE

    def forward_backward(self, data: list[tinker.Datum], loss_fn: str, config: Any = None) -> Done:
        outs = [{"logprobs": d.loss_fn_inputs["logprobs"]} for d in data]
        return Done(
            ttypes.ForwardBackwardOutput(
                loss_fn_output_type="x", loss_fn_outputs=outs, metrics={"loss:sum": 0.0}
            )
        )

    def optim_step(self, params: tinker.AdamParams) -> Done:
        self.steps += 1
        return Done(ttypes.OptimStepResponse(metrics={"grad_norm": 1.0}))

    def save_weights_and_get_sampling_client(self, name: str | None = None) -> FakeSampler:
        return FakeSampler(self.rng, self.completion)

    def save_state(self, name: str) -> Done:
        self.store.saved.append(f"fake://run/weights/{name}")
        return Done(ttypes.SaveWeightsResponse(path=self.store.saved[-1], type="save_weights"))

    def save_weights_for_sampler(self, name: str) -> Done:
        self.store.saved.append(f"fake://run/sampler_weights/{name}")
        return Done(
            ttypes.SaveWeightsForSamplerResponse(path=self.store.saved[-1], type="save_weights_for_sampler")
        )


@attrs.define
class FakeService:
    completion: tuple[int, int] = (64, 1024)
    closed: list[str] = attrs.Factory(list)
    trainers: list[FakeTrainer] = attrs.Factory(list)
    tempering_backend: Backend = FAKE

    def create_lora_training_client(
        self, base_model: str, rank: int = 8, seed: int | None = None, **kw: Any
    ) -> Done:
        self.trainers.append(FakeTrainer(np.random.default_rng(0), self.completion))
        return Done(self.trainers[-1])

    def create_full_training_client(self, base_model: str, /) -> Done:
        raise AssertionError("the fake backend declares full_training=False: this must not be called")

    def create_sampling_client(self, model_path: str | None = None, base_model: str | None = None) -> Done:
        return Done(FakeSampler(np.random.default_rng(0), self.completion))

    def close(self, status: str) -> Done:
        """Finish the session with ``status`` (as the Tinker SDK's ``close`` does)."""
        self.closed.append(status)
        return Done(None)

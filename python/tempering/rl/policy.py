"""Token-level policies backed by a sampling client.

:class:`TinkerTokenCompleter` implements :class:`tempering_protocols.TokenCompleter` over any
:class:`tempering_protocols.SamplingClient` (the hosted service's or the local engine's), and
also :class:`GroupTokenCompleter`: ``G`` samples of one observation in a single request
(``num_samples = G``), which the rollout runner uses for a group's shared first turn.

Every completer carries ``version``: the training step whose weights it samples from. The
off-policy schedule compares it with the current step (see ``max_steps_off_policy``).

Seeding (:class:`SeedableTokenCompleter`): ``policy.with_seed(s)`` is the same policy whose
requests carry ``SamplingParams.seed = s``. The rollout runner gives every request its own seed,
derived with :func:`sampling_seed` from the run's seed and the request's place in the run (step,
group, member, turn, retry), so samples repeat no matter in which order requests complete. The
``G`` samples of one request differ from each other (each row draws its own random numbers).

Example::

    policy = TinkerTokenCompleter(sampler, max_tokens=64, version=step)
    ac = await policy(observation, stop)
    acs_G = await policy.sample_group(observation, stop, 8)
    same = await policy.with_seed(sampling_seed(0, "train", step, 3)).sample_group(observation, stop, 8)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import attrs
import numpy as np
import tinker

from tempering.data.seeds import sampling_seed  # re-exported: the RL loop's name for it
from tempering_protocols import (
    Observation,
    SamplingClient,
    StopCondition,
    TokenCompleter,
    TokensWithLogprobs,
)

__all__ = [
    "GroupTokenCompleter",
    "SeedableTokenCompleter",
    "TinkerTokenCompleter",
    "policy_version",
    "sampling_seed",
]


@runtime_checkable
class GroupTokenCompleter(Protocol):
    """A token completer that can draw ``n`` samples of one observation in one request.

    Example::

        acs = await policy.sample_group(tinker.ModelInput.from_ints(prompt), [eos], 8)
    """

    async def __call__(self, model_input: Observation, stop: StopCondition, /) -> TokensWithLogprobs: ...

    async def sample_group(
        self, model_input: Observation, stop: StopCondition, n: int, /
    ) -> Sequence[TokensWithLogprobs]: ...


@runtime_checkable
class SeedableTokenCompleter(Protocol):
    """A token completer that can fix the seed of its sampling requests.

    Example::

        seeded = policy.with_seed(sampling_seed(run_seed, "train", step, group, member, turn))
    """

    def with_seed(self, seed: int | None, /) -> TokenCompleter:
        """The same policy, its requests seeded with ``seed`` (``None``: unseeded)."""
        ...


def policy_version(policy: object) -> int:
    """The ``version`` attribute of a policy (the step of its weights), 0 when it has none."""
    version = getattr(policy, "version", 0)
    return version if isinstance(version, int) else 0


@attrs.frozen
class TinkerTokenCompleter:
    """Samples actions from a ``SamplingClient``; logprobs come back with every token.

    ``max_tokens`` bounds one turn; ``version`` is the training step of the weights; ``seed``
    is the ``SamplingParams.seed`` of every request (``None``: unseeded; see :meth:`with_seed`).

    Example::

        sampler = await saved_sampling_client(training_client)  # tempering.training.loop
        policy = TinkerTokenCompleter(sampler, max_tokens=32, temperature=1.0, version=3)
    """

    sampling_client: SamplingClient
    max_tokens: int
    temperature: float = 1.0
    version: int = 0
    seed: int | None = None

    def with_seed(self, seed: int | None, /) -> TinkerTokenCompleter:
        """This policy with its requests seeded by ``seed``."""
        return attrs.evolve(self, seed=seed)

    def _params(self, stop: StopCondition) -> tinker.SamplingParams:
        return tinker.SamplingParams(
            max_tokens=self.max_tokens, temperature=self.temperature, stop=stop, seed=self.seed
        )

    async def __call__(self, model_input: Observation, stop: StopCondition, /) -> TokensWithLogprobs:
        (ac,) = await self.sample_group(model_input, stop, 1)
        return ac

    async def sample_group(
        self, model_input: Observation, stop: StopCondition, n: int, /
    ) -> list[TokensWithLogprobs]:
        """``n`` samples of one observation in one request (``num_samples = n``)."""
        response = await self.sampling_client.sample(model_input, n, self._params(stop))
        out: list[TokensWithLogprobs] = []
        for seq in response.sequences:
            if seq.logprobs is None:
                raise ValueError("the sampling client returned no logprobs; RL needs them")
            out.append(
                TokensWithLogprobs(
                    tokens=list(seq.tokens),
                    maybe_logprobs=np.asarray(seq.logprobs, dtype=np.float32),
                    stop_reason="length" if seq.stop_reason == "length" else "stop",
                )
            )
        return out

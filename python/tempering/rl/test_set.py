"""The RL loop's periodic evaluation: every batch of the test dataset rolled out with the newest
weights (``test/…`` metrics, :func:`~tempering.rl.metrics.rollout_metrics`), then ``RLConfig.evals``'
evaluators on the same sampler."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence

from tempering.rl.episodes import RolloutLimits
from tempering.rl.executors import RolloutExecutor
from tempering.rl.metrics import rollout_metrics
from tempering.rl.policy import TinkerTokenCompleter, sampling_seed
from tempering.rl.rollout_policy import RolloutConfig
from tempering.rl.rollouts import GroupRollout, rollout_batch
from tempering_protocols import RLDataset, SamplingClient

__all__ = ["evaluate_test_set"]


async def evaluate_test_set(
    test_ds: RLDataset | None,
    evaluators: Sequence[Callable[[SamplingClient], Awaitable[dict[str, float]]]],
    policy: TinkerTokenCompleter,
    rollout: RolloutConfig,
    *,
    limits: RolloutLimits,
    executor: RolloutExecutor,
    seed: int | None,
    after: int,
) -> dict[str, float]:
    """Test batch ``i`` is seeded with ``sampling_seed(seed, "test", after, i)`` (``after``: the
    steps the weights have trained).

    Example::

        metrics = await evaluate_test_set(test_ds, [], policy, RolloutConfig(), limits=limits,
                                          executor=InlineExecutor(), seed=0, after=4)
    """
    t0 = time.perf_counter()
    rollouts: list[GroupRollout] = []
    for i in range(len(test_ds) if test_ds is not None else 0):
        assert test_ds is not None
        rollouts += await rollout_batch(
            test_ds.get_batch(i),
            policy,
            rollout,
            limits=limits,
            executor=executor,
            seed=None if seed is None else sampling_seed(seed, "test", after, i),
        )
    out = rollout_metrics(rollouts, prefix="test") if test_ds is not None else {}
    for evaluator in evaluators:
        out |= await evaluator(policy.sampling_client)
    out["time/eval"] = time.perf_counter() - t0
    return out

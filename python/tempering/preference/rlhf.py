"""RL against a pairwise reward model (RLHF): the reward model as the envs' judge, and the RL
task over the prompts of labeled comparisons.

- :class:`ComparisonJudge`: a :class:`~tempering.preference.PreferenceModel` (which takes a
  ``Comparison``) as the ``(prompt, completion_a, completion_b)`` judge the envs use.
- :class:`RewardModelPrompts`: the ``RLDatasetBuilder``: training groups are tournaments
  (:class:`~tempering.envs.preference.PairwisePreferenceGroupBuilder`), the test set scores
  replies against the chosen reference (:class:`~tempering.envs.preference.ReferenceWinRateGroupBuilder`).

Example::

    task = RewardModelPrompts(data=ComparisonData(), rm_sampler_path=rm.final.sampler_path)
    train_ds, test_ds = await task()
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

from tempering.backend import ModelConfig, ServiceClient
from tempering.envs.preference import (
    PairwisePreferenceGroupBuilder,
    PromptGroups,
    ReferenceWinRateGroupBuilder,
)
from tempering.envs.task_base import PolicyTask
from tempering.preference.data import ComparisonData
from tempering.preference.evaluation import chosen_reply
from tempering.preference.reward_model import PreferenceModel, VerdictPreferenceModel
from tempering_protocols import Comparison, Message, RLDataset

__all__ = ["ComparisonJudge", "RewardModelPrompts"]


@attrs.frozen
class ComparisonJudge:
    """A :class:`tempering.preference.PreferenceModel` (which takes a ``Comparison``) as the
    ``(prompt, completion_a, completion_b)`` preference model the envs use
    (:class:`tempering.envs.PreferenceModel`).

    Example::

        judge = ComparisonJudge(await VerdictPreferenceModel.load(rm_sampler_path, model))
        await judge(prompt, [reply_a], [reply_b])     # P(reply_a better)
    """

    model: PreferenceModel

    async def __call__(
        self, prompt: Sequence[Message], completion_a: Sequence[Message], completion_b: Sequence[Message], /
    ) -> float:
        return await self.model(Comparison(list(prompt), list(completion_a), list(completion_b)))


@attrs.frozen(kw_only=True)
class RewardModelPrompts(PolicyTask):
    """The RL task of RLHF, as an ``RLDatasetBuilder``: training groups are
    :class:`~tempering.envs.preference.PairwisePreferenceGroupBuilder` tournaments over the
    prompts of the training comparisons (shuffled with ``seed``, ``batch_size`` prompts ×
    ``group_size`` replies a batch); the test set is
    :class:`~tempering.envs.preference.ReferenceWinRateGroupBuilder` over the held-out
    comparisons (``test_group_size`` replies each, one batch). Both are judged by the reward
    model saved at ``rm_sampler_path``. ``data`` must split the comparisons as the reward model's
    run did, so that the held-out pairs stay unseen. ``service`` (not part of the config): the
    service that serves the reward model (default ``tempering.service_client()``).

    Example::

        task = RewardModelPrompts(data=ComparisonData(), rm_sampler_path=rm.final.sampler_path)
        train_ds, test_ds = await task()
    """

    data: ComparisonData
    """The comparisons, split as the reward model's run split them."""
    rm_sampler_path: str
    """The reward model's sampler weights (a save_weights_for_sampler path)."""
    batch_size: int = 8
    """Prompts per training batch."""
    group_size: int = 4
    """Replies per training prompt (one tournament)."""
    test_group_size: int = 2
    """Replies per held-out comparison, each judged against its chosen reply."""
    seed: int = 0
    """Seeds the prompts' order."""
    service: ServiceClient | None = attrs.field(default=None, eq=False, repr=False)

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        model = ModelConfig(base_model=self.model, renderer_name=self.renderer_name)
        rm = await VerdictPreferenceModel.load(self.rm_sampler_path, model, self.service)
        judge = ComparisonJudge(rm)
        renderer = rm.renderer  # the policy's: the same model and chat format
        train, test = self.data()
        prompts: dict[str, list[Message]] = {}
        for pair in train.items:
            conversation = list(pair.comparison.prompt_conversation)
            prompts.setdefault(repr(conversation), conversation)
        order = np.random.default_rng([self.seed, 0x5EED]).permutation(len(prompts))
        unique = list(prompts.values())
        # symmetric=False: the verdict model already averages both orders (P(A,B) = 1 - P(B,A)).
        train_builders = [
            PairwisePreferenceGroupBuilder(
                unique[int(i)], renderer, judge, group_size=self.group_size, symmetric=False, tag="rlhf"
            )
            for i in order
        ]
        test_ds: RLDataset | None = None
        if test is not None:
            test_builders = [
                ReferenceWinRateGroupBuilder(
                    list(p.comparison.prompt_conversation),
                    chosen_reply(p),
                    renderer,
                    judge,
                    group_size=self.test_group_size,
                )
                for p in test.items
                if p.label != "Tie"
            ]
            test_ds = PromptGroups(test_builders, max(1, len(test_builders)))
        return PromptGroups(train_builders, self.batch_size), test_ds

"""What the fine-tuning trainers' configs share: the run, the model, Adam, the length of the run.

SFT (``tempering.sft.SFTConfig``), the reward model (``tempering.preference.RewardModelConfig``),
DPO (``tempering.preference.DPOConfig``) and top-K distillation
(``tempering.sft.offpolicy.TopKDistillConfig``) subclass :class:`FineTuningConfig` and add their
data and their own settings; their flags (``--run.*``, ``--model.*``, ``--adam.*``,
``--num-epochs``, ``--max-steps``) come from here.
"""

from __future__ import annotations

from typing import Self

import attrs

from tempering.backend import ModelConfig
from tempering.model_info import Stage
from tempering.training.loop import RunConfig
from tempering.training.schedule import AdamConfig, fine_tuning_adam

__all__ = ["FineTuningConfig"]


@attrs.frozen(kw_only=True)
class FineTuningConfig:
    """The settings every fine-tuning trainer takes; a trainer's config subclasses it.

    Example::

        @attrs.frozen(kw_only=True)
        class MyConfig(FineTuningConfig):
            data: ChatData = attrs.field(factory=ChatData)

        config = MyConfig(run=RunConfig(log_dir="runs/mine"), max_steps=50).resolved("sft")
    """

    run: RunConfig
    model: ModelConfig = attrs.field(factory=ModelConfig)
    adam: AdamConfig = attrs.field(factory=fine_tuning_adam)
    num_epochs: int = 1
    """Passes over the training data."""
    max_steps: int | None = None
    """Stop after this many optimizer steps, even within an epoch; ``None``: no limit."""

    def resolved(self, stage: Stage) -> Self:
        """This config as it runs (and as ``config.json`` records it): an unset
        ``adam.learning_rate`` filled with the model's default for ``stage``
        (:meth:`AdamConfig.for_model`)."""
        adam = self.adam.for_model(self.model.base_model, stage, lora=self.model.lora_rank > 0)
        return attrs.evolve(self, adam=adam)

"""Preference learning: DPO, and a pairwise reward model usable as an RL reward (docs/dpo.md).

Example::

    from tempering.preference import DPOConfig, RewardModelConfig, VerdictPreferenceModel
    result = asyncio.run(DPOConfig(run=RunConfig(log_dir="runs/dpo"))())
"""

from tempering.preference.data import ComparisonData, pair_datums, reference_input
from tempering.preference.dpo import DPOConfig, DPOEvaluator, dpo_loss, reference_logprobs
from tempering.preference.reward_model import (
    PreferenceAccuracyEvaluator,
    PreferenceModel,
    RewardModelConfig,
    VerdictDataset,
    VerdictPreferenceModel,
    comparison_prompt,
)

__all__ = [
    "ComparisonData",
    "DPOConfig",
    "DPOEvaluator",
    "PreferenceAccuracyEvaluator",
    "PreferenceModel",
    "RewardModelConfig",
    "VerdictDataset",
    "VerdictPreferenceModel",
    "comparison_prompt",
    "dpo_loss",
    "pair_datums",
    "reference_input",
    "reference_logprobs",
]

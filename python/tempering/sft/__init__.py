"""Supervised fine-tuning on chat data (see docs/sft.md).

Example::

    from tempering.sft import SFTConfig
    from tempering.training import RunConfig
    result = asyncio.run(SFTConfig(run=RunConfig(log_dir="runs/sft"))())
"""

from tempering.sft.train import (
    ASSET_PREFIX,
    ChatData,
    NLLEvaluator,
    SFTConfig,
    TrainResult,
    resolve_data_path,
    train_supervised,
)

__all__ = [
    "ASSET_PREFIX",
    "ChatData",
    "NLLEvaluator",
    "SFTConfig",
    "TrainResult",
    "resolve_data_path",
    "train_supervised",
]

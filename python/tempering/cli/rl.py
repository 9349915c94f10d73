"""``tempering rl``: the RL config with a concrete choice of shipped dataset, for the CLI.

``tempering rl --help`` lists every field (tyro); the dataset is a subcommand
(``dataset:arithmetic-task``, ``dataset:lowercase-task`` or ``dataset:arithmetic-demo``, the
demo's two-digit problems: :class:`~tempering.envs.arithmetic.ArithmeticProblems`) whose own
flags follow it.

Example::

    tempering rl --run.log-dir runs/rl dataset:lowercase-task --max-tokens 8 --num-steps 20
"""

from __future__ import annotations

from typing import Annotated

import attrs
import tyro

from tempering.envs.arithmetic import ArithmeticProblems
from tempering.envs.tasks import ArithmeticTask, LowercaseTask
from tempering.rl.train import RLConfig
from tempering_protocols import CustomLossFn

__all__ = ["RLCommandConfig"]


@attrs.frozen(kw_only=True)
class RLCommandConfig(RLConfig):
    """:class:`~tempering.rl.RLConfig` whose dataset is one of the shipped task builders."""

    dataset: (
        ArithmeticTask
        | LowercaseTask
        | Annotated[ArithmeticProblems, tyro.conf.subcommand(name="arithmetic-demo")]
    ) = attrs.field(factory=ArithmeticTask)  # pyright: ignore[reportIncompatibleVariableOverride]
    custom_loss: Annotated[CustomLossFn | None, tyro.conf.Suppress] = None
    """A Python callable: set in code (docs/rl.md, Custom losses), not from the command line."""

"""Preference data for DPO and the reward model: which file, how it is split and batched, and
how a comparison becomes the two datums DPO scores.

Shapes: ``data_D`` interleaves each pair's datums, chosen first: ``D = 2 * pairs``.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import tinker

from tempering.assets import ASSET_PREFIX, resolve_data_path
from tempering.data import BatchedDataset, ComparisonDatasetBuilder, check_max_length
from tempering.data.datums import examples_to_datums
from tempering_protocols import LabeledComparison, Renderer, TrainOnWhat

__all__ = ["ComparisonData", "pair_datums", "reference_input"]


@attrs.frozen(kw_only=True)
class ComparisonData:
    """Labeled comparisons (``{"prompt_conversation", "completion_A", "completion_B", "label"}``
    or ``{"prompt", "chosen", "rejected"}`` rows); ``test_size`` pairs drawn from ``path`` are
    held out, plus every pair of ``test_path``. ``tempering-assets:<name>`` names a shipped file.
    """

    path: str = ASSET_PREFIX + "arithmetic_preferences.jsonl"
    """Labeled comparisons: a file, ``hf:NAME[:split]`` or ``tempering-assets:<name>``."""
    test_path: str | None = None
    """Held-out comparisons, all of them evaluated."""
    test_size: int = 60
    """Comparisons drawn from ``path`` and held out as well."""
    batch_size: int = 8
    """Comparisons per optimizer step."""
    max_length: int | None = attrs.field(default=None, validator=check_max_length)
    """Truncate each datum to this many tokens; ``None``: no limit."""
    seed: int = 0
    """Seeds the held-out draw and the batch order."""
    columns: str | None = None
    """Column mapping of ``hf:NAME[:split]`` paths, e.g. ``chosen=good,rejected=bad``."""

    def __call__(
        self,
    ) -> tuple[BatchedDataset[LabeledComparison], BatchedDataset[LabeledComparison] | None]:
        return ComparisonDatasetBuilder(
            path=resolve_data_path(self.path),
            batch_size=self.batch_size,
            test_path=None if self.test_path is None else resolve_data_path(self.test_path),
            test_size=self.test_size,
            seed=self.seed,
            columns=self.columns,
        )()


def pair_datums(
    renderer: Renderer, pairs: Sequence[LabeledComparison], max_length: int | None = None
) -> list[tinker.Datum]:
    """``data_D``: for each pair (ties left out), the chosen then the rejected conversation,
    with weight on the completion's last assistant message only."""
    conversations = []
    for pair in pairs:
        if pair.label == "Tie":
            continue
        c = pair.comparison
        chosen, rejected = (
            (c.completion_A, c.completion_B) if pair.label == "A" else (c.completion_B, c.completion_A)
        )
        conversations += [[*c.prompt_conversation, *chosen], [*c.prompt_conversation, *rejected]]
    examples = [
        renderer.build_supervised_example(conv, TrainOnWhat.LAST_ASSISTANT_MESSAGE) for conv in conversations
    ]
    return examples_to_datums(examples, max_length=max_length)


def reference_input(datum: tinker.Datum) -> tinker.ModelInput:
    """The whole sequence a datum trains on (its input plus the last target), for
    ``SamplingClient.compute_logprobs``, whose result ``[1:]`` lines up with the datum's targets."""
    targets_T = datum.loss_fn_inputs["target_tokens"].to_numpy()
    return datum.model_input.append_int(int(targets_T[-1]))

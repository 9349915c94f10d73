"""Dataset builders as a user writes them, outside tempering: imported by
``tempering rl|sft|dpo --dataset-builder my_builders:NAME`` in tests/test_cli_builders.py (this
directory is put on ``PYTHONPATH``). Token ids are the tiny model's bytes."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import attrs
import tinker

from tempering_protocols import (
    Action,
    Comparison,
    Env,
    EnvGroupBuilder,
    LabeledComparison,
    Observation,
    RLDataset,
    StepResult,
    StopCondition,
)

STOP = 10  # newline


@attrs.define
class LetterEnv:
    """One turn, prompt ``"say <letter>:"``; the closer the sampled bytes are to it, the higher the reward."""

    letter: str

    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        return tinker.ModelInput.from_ints(list(f"say {self.letter}:".encode())), [STOP]

    async def step(self, action: Action, /) -> StepResult:
        tokens = [t for t in action if t != STOP] or [0]
        hits = sum(t == ord(self.letter) for t in tokens)
        # 1 for the letter itself, less the further the sampled bytes are from it (never constant)
        distance = sum(abs(t - ord(self.letter)) for t in tokens) / len(tokens)
        return StepResult(
            reward=1.0 - distance / 255.0,
            episode_done=True,
            next_observation=tinker.ModelInput.empty(),
            next_stop_condition=[STOP],
            metrics={"hits": float(hits)},
        )


@attrs.frozen
class LetterGroup(EnvGroupBuilder):
    letter: str
    group_size: int

    async def make_envs(self) -> Sequence[Env]:
        return [LetterEnv(self.letter) for _ in range(self.group_size)]


@attrs.frozen
class LetterDataset:
    letters: str
    batch_size: int
    group_size: int

    def get_batch(self, index: int, /) -> Sequence[EnvGroupBuilder]:
        start = index * self.batch_size
        return [
            LetterGroup(self.letters[(start + i) % len(self.letters)], self.group_size)
            for i in range(self.batch_size)
        ]

    def __len__(self) -> int:
        return max(1, len(self.letters) // self.batch_size)


@attrs.frozen
class LetterBuilder:
    """An RLDatasetBuilder: each group is asked to repeat a letter."""

    letters: str = "abcd"
    batch_size: int = 2
    group_size: int = 4

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        return LetterDataset(self.letters, self.batch_size, self.group_size), None


@dataclasses.dataclass
class CopyData:
    """A SupervisedDataset of ``"<word>=<word>"`` datums, trained on the copy."""

    words: list[str]
    batch_size: int

    def get_batch(self, index: int, /) -> Sequence[tinker.Datum]:
        batch = self.words[index * self.batch_size : (index + 1) * self.batch_size]
        out = []
        for word in batch:
            prompt, target = f"{word}=".encode(), word.encode()
            tokens = list(prompt + target)
            weights = [0.0] * (len(prompt) - 1) + [1.0] * len(target)
            out.append(
                tinker.Datum(
                    model_input=tinker.ModelInput.from_ints(tokens[:-1]),
                    loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights},
                )
            )
        return out

    def __len__(self) -> int:
        return len(self.words) // self.batch_size

    def set_epoch(self, seed: int, /) -> None:
        del seed


@dataclasses.dataclass(frozen=True)
class CopyBuilder:
    """A SupervisedDatasetBuilder (a dataclass)."""

    n_words: int = 8
    batch_size: int = 4

    def __call__(self) -> tuple[CopyData, CopyData | None]:
        words = [f"w{i}x" for i in range(self.n_words)]
        return CopyData(words, self.batch_size), None


@dataclasses.dataclass
class PairData:
    pairs: list[LabeledComparison]
    batch_size: int

    def get_batch(self, index: int, /) -> Sequence[LabeledComparison]:
        return self.pairs[index * self.batch_size : (index + 1) * self.batch_size]

    def __len__(self) -> int:
        return len(self.pairs) // self.batch_size

    def set_epoch(self, seed: int, /) -> None:
        del seed


@attrs.frozen
class PoliteBuilder:
    """A ComparisonDatasetBuilder: "please" is preferred to "no"."""

    n_pairs: int = 4
    batch_size: int = 2

    def __call__(self) -> tuple[PairData, PairData | None]:
        pairs = [
            LabeledComparison(
                Comparison(
                    [{"role": "user", "content": f"ask {i}"}],
                    [{"role": "assistant", "content": "please"}],
                    [{"role": "assistant", "content": "no"}],
                ),
                "A" if i % 2 == 0 else "B",
            )
            for i in range(self.n_pairs)
        ]
        # Label B pairs have their completions swapped, so "please" always wins.
        pairs = [p if p.label == "A" else LabeledComparison(p.comparison.swap(), "B") for p in pairs]
        return PairData(pairs, self.batch_size), None


@attrs.frozen
class SyncRLBuilder:
    """Not an RLDatasetBuilder: its __call__ is not async."""

    letters: str = "ab"

    def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        return LetterDataset(self.letters, 1, 2), None


class PlainBuilder:
    """Not a config class: no fields for the command line."""

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        return LetterDataset("ab", 1, 2), None


@attrs.frozen
class NoCall:
    """Has no __call__ at all."""

    letters: str = "ab"


LETTERS_XY = LetterBuilder(letters="xyxy", group_size=2)
"""An instance: its values are the flags' defaults."""

"""``tempering recipe math-rl``: reasoning RL on math word problems, rewarded for a correct
answer (:class:`~tempering.grading.MathGrader`, answer equivalence under a time limit) and for
writing it in ``\\boxed{}`` (:mod:`tempering.envs.math`).

1. Data: a math dataset in one of the known schemas (:mod:`tempering.data.hub`), ``gsm8k`` by
   default. On the local tiny model the default sources are the shipped word problems in
   GSM8K's format (``tempering-assets:word_problems.jsonl``, held out
   ``word_problems_test.jsonl``); on any other model the dataset's hub name (``openai/gsm8k``).
2. SFT warm-up (``--sft.steps``, or ``--sft-steps``; default 300 for the tiny model, which starts from random
   weights, 0 otherwise): the training split's worked solutions, their final ``#### n`` written
   ``\\boxed{n}`` (:func:`~tempering.data.hub.boxed_solution`); run directory ``<out>/sft``.
3. RL (:func:`tempering.rl.train`) on :class:`~tempering.envs.math.MathTask`:
   ``rl.batch_size`` problems × ``group_size`` samples per step, reward
   ``correct_weight * correct + format_weight * (boxed - 1)``; run directory ``<out>/rl``, its
   rollouts logged under ``<out>/rl/trajectories``.
4. Held-out accuracy before RL (the SFT checkpoint, or the base model) and after: greedy, and
   sampled at temperature 1 with ``eval_samples`` answers per problem, each problem seeded on
   its own, repeated for ``eval_seeds`` seeds (mean and standard deviation over them).

Example::

    tempering recipe math-rl                                   # docs/recipes/math-rl.md
    tempering recipe math-rl --sft-steps 10 --rl-steps 2 --n-test 8 --out /tmp/math
    tempering recipe math-rl --base-model Qwen/Qwen3.5-9B      # hosted: GSM8K from the hub
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import attrs

from tempering.data.hub import MathProblem, boxed_solution
from tempering.envs.agent_data import write_chats
from tempering.envs.math import DEFAULT_INSTRUCTION, MathTask, prompt_messages
from tempering.recipes._common import (
    TINY_MODEL,
    GroupFlags,
    RecipeConfig,
    RecipeResult,
    positive,
)
from tempering.recipes.stages import (
    RecipeSession,
    RLStage,
    SFTStage,
    at_least,
    sft_then_rl,
    stage_field,
    valid_learning_rate,
)
from tempering.rl.task_evals import evaluate_math
from tempering_protocols import Message, SamplingClient

__all__ = ["MathRLRecipe", "WarmUp", "write_sft_chat"]

_RL_GRADER_KEYS = ("env/grader/timeouts", "env/grader/errors", "env/grader/no_answer")
_TRAIN_ASSET = "tempering-assets:word_problems.jsonl"
_TEST_ASSET = "tempering-assets:word_problems_test.jsonl"


def write_sft_chat(problems: Sequence[MathProblem], path: Path, instruction: str | None) -> Path:
    """The problems as ``{"messages": [...]}`` rows: the question (with ``instruction``), then
    the worked solution ending in ``\\boxed{answer}`` (or the boxed answer alone)."""
    rows: list[list[Message]] = []
    for p in problems:
        reply = boxed_solution(p.solution) if p.solution else f"\\boxed{{{p.answer}}}"
        rows.append(
            [*prompt_messages(p.question, instruction, None), {"role": "assistant", "content": reply}]
        )
    return write_chats(path, rows)


@attrs.frozen
class WarmUp:
    """math-rl's SFT warm-up: ``steps`` steps (unset: 300 for the tiny model, which starts from
    random weights, 0, none, otherwise) of ``batch_size`` worked solutions, Adam at
    ``learning_rate`` with ``weight_decay``. A nested config (``--sft.steps``, or the flat
    ``--sft-steps``), checked on construction; :meth:`stage` is the resolved
    :class:`~tempering.recipes.stages.SFTStage`.

    Example::

        WarmUp(steps=10).stage(tiny=True)     # SFTStage(10, 32, 2e-3, weight_decay=0.1)
    """

    steps: int | None = attrs.field(default=None, validator=at_least(0))
    """SFT warm-up steps; unset: 300 for the tiny model, 0 (none) otherwise."""
    batch_size: int = attrs.field(default=32, validator=at_least(1))
    """Examples per step."""
    learning_rate: float = attrs.field(default=2e-3, validator=valid_learning_rate)
    """Peak learning rate."""
    weight_decay: float = 0.1
    """AdamW weight decay."""

    def stage(self, tiny: bool) -> SFTStage:
        """The warm-up as a stage: its steps resolved for the tiny model (``tiny``) or another."""
        steps = self.steps if self.steps is not None else (300 if tiny else 0)
        return SFTStage(steps, self.batch_size, self.learning_rate, weight_decay=self.weight_decay)


@attrs.frozen(kw_only=True)
class MathRLRecipe(RecipeConfig, GroupFlags):
    """Math RL with format and correctness rewards; calling it runs it. ``P``: problems per RL
    step (``rl.batch_size``), ``G``: samples per problem (``group_size``); ``eval_samples``:
    answers per held-out problem at temperature 1, per evaluation seed.

    The defaults are the measured run of docs/recipes/math-rl.md (the tiny model on the shipped
    word problems); the test runs a tiny budget.
    """

    rl: RLStage = stage_field(RLStage(40, None, eval_every=10, batch_size=16))
    """The RL stage (``--rl.steps`` or ``--rl-steps``, ...; evaluated on the held-out problems
    every ``eval_every`` steps too); learning rate default: 2e-4 for the tiny model, 4e-5 otherwise."""
    dataset: str = "gsm8k"
    """The schema of the data: gsm8k, math, math500, deepmath, polaris, aime (tempering.data.hub)."""
    train_source: str | None = None
    """Hub name or local path of the training split; default: the shipped word problems on the
    tiny model, the dataset's hub name otherwise."""
    train_split: str = "train"
    """Split of ``train_source`` to train on."""
    test_dataset: str | None = None
    """Schema of the held-out data (default: ``dataset``), e.g. math500 when training on math."""
    test_source: str | None = None
    """Default: the shipped held-out word problems on the tiny model, the hub otherwise."""
    test_split: str | None = None
    """Default: the test dataset's ``test`` split."""
    n_train: int | None = None
    """Read at most this many training problems (default: all)."""
    n_test: int = positive(100)
    """Held-out problems evaluated."""
    instruction: str | None = None
    """Appended to every question; default: none for the tiny model (it learns the format from
    the SFT warm-up), ``DEFAULT_INSTRUCTION`` ("Put the final answer in \\boxed{}.") otherwise."""
    sft: WarmUp = stage_field(WarmUp())
    """The SFT warm-up on the training split's solutions (``--sft.steps`` or ``--sft-steps``,
    ``--sft.batch-size``, ``--sft.learning-rate``, ``--sft.weight-decay``)."""
    correct_weight: float = 1.0
    """Reward of a correct final answer."""
    format_weight: float = 0.1
    """Weight of the format reward: 0 with a ``\\boxed{}`` answer, ``-format_weight`` without."""
    max_tokens: int | None = None  # pyright: ignore[reportIncompatibleVariableOverride]
    """Tokens per answer; default 32 for the tiny model, 1024 otherwise."""
    eval_seeds: int = positive(3)
    """Evaluation seeds (the sampled accuracy is their mean; its spread their standard deviation)."""
    grader_timeout_s: float = 5.0
    """Time limit of one answer check (a timeout is a wrong answer, and counted)."""

    NAME: ClassVar[str] = "math-rl"

    def validate(self) -> None:
        self.task()  # validates the dataset names

    @property
    def tiny(self) -> bool:
        """Whether this runs the built-in tiny model (local defaults)."""
        return self.base_model == TINY_MODEL

    @property
    def prompt_instruction(self) -> str | None:
        """The instruction in effect (see :attr:`instruction`)."""
        if self.instruction is not None:
            return self.instruction or None
        return None if self.tiny else DEFAULT_INSTRUCTION

    def task(self) -> MathTask:
        """The RL task of this config."""
        source, test_source = self.train_source, self.test_source
        return MathTask(
            base_model=self.base_model, renderer_name=self.renderer_name, batch_size=self.rl.batch_size,
            group_size=self.group_size, seed=self.seed, dataset=self.dataset, test_dataset=self.test_dataset,
            test_split=self.test_split, correct_weight=self.correct_weight, format_weight=self.format_weight,
            grader_timeout_s=self.grader_timeout_s, source=source or (_TRAIN_ASSET if self.tiny else None),
            split=self.train_split, limit=self.n_train, test_limit=self.n_test,
            test_source=test_source or (_TEST_ASSET if self.tiny else None), n_batches=self.rl.steps,
            test_group_size=self.eval_samples, instruction=self.prompt_instruction,
        )  # fmt: skip

    async def run(self, s: RecipeSession) -> RecipeResult:
        from tempering.data.hub import load_math_problems

        task = self.task()
        rewards = task.rewards()
        rewards.grader.warm_up()  # fails now, clearly, without the `math` extra
        test = task.test_problems()
        if test is None:
            raise ValueError(
                f"MathRLRecipe: dataset {self.dataset!r} has no held-out split: pass --test-dataset "
                "(e.g. math500), --test-source or --test-split"
            )
        renderer = self.renderer()
        max_tokens = self.max_tokens or (32 if self.tiny else 1024)
        seeds = [self.seed * 1000 + 101 + k for k in range(self.eval_seeds)]

        async def evaluate(stage: str, sampler: SamplingClient) -> dict[str, float]:
            figures = await evaluate_math(
                sampler, test, renderer, rewards, seeds=seeds, samples=self.eval_samples,
                max_tokens=max_tokens, instruction=task.instruction,
            )  # fmt: skip
            s.say(_line("before RL" if stage == "sft" else "after RL", figures))
            return figures

        # 1-2. SFT warm-up on the training split's worked solutions (or the base model as it is)
        def train_data() -> Path:
            problems = load_math_problems(
                task.dataset, source=task.source, split=task.split, limit=task.limit
            )
            return write_sft_chat(problems, s.run_dir / "data" / "train.jsonl", task.instruction)

        # 3. RL (evaluated on the held-out problems every 10 steps too)
        rl = self.rl.for_model(self.base_model, tiny=2e-4)
        sft = self.sft.stage(self.tiny)
        run = await sft_then_rl(
            s, sft, rl, evaluate, train_path=train_data, task=task,
            evaluate_base=True, max_tokens=max_tokens, normalize_advantages=True, log_trajectories=True,
            rl_what=f" of {self.rl.batch_size} problems x {self.group_size} samples",
        )  # fmt: skip
        before, after = run.before or {}, run.after
        figures = {
            **{f"before_{k}": v for k, v in before.items() if "seed" not in k},
            **{f"after_{k}": v for k, v in after.items() if "seed" not in k},
        }
        rl_grader = {k: sum(float(m.get(k, 0.0)) for m in run.rl.metrics) for k in _RL_GRADER_KEYS}
        extra = {
            "before": before,
            "after": after,
            "eval_seeds": seeds,
            "n_test": len(test),
            "sft_steps": sft.steps,
            "grader": {"evaluation": rewards.grader.metrics(), "rl": rl_grader},
            "rl_final_sampler": run.rl.final.sampler_path,
        }
        return s.finish(figures, extra)


def _line(stage: str, figures: dict[str, float]) -> str:
    return (
        f"{stage}: held-out accuracy {figures['accuracy']:.1%} ± {figures['accuracy_std']:.1%} sampled, "
        f"{figures['accuracy_greedy']:.1%} greedy; boxed {figures['boxed']:.1%}"
    )

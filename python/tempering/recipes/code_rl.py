"""``tempering recipe code-rl``: RL on small programming problems, graded by unit tests run in
a sandbox.

1. Problems: the shipped 40 one-function problems (``tempering-assets:code/problems.jsonl``),
   ``n_test`` held out by a seeded split.
2. SFT warm start (``sft.steps > 0``; set 0 for a hosted instruct model): the training problems'
   reference solutions as replies in a ```` ```python ```` block; run directory ``<out>/sft``.
3. RL (:func:`tempering.rl.train`) on :class:`~tempering.envs.code.CodeTask`: ``rl.batch_size``
   problems × ``group_size`` replies per step, each reply's program run against the problem's
   tests in a :class:`~tempering.tools.sandbox.LocalSandbox`, reward the pass fraction (or
   all-pass, ``--reward all``) minus 0.1 without a code block; run directory ``<out>/rl``.
4. Evaluation before and after RL, on the training and the held-out problems alike (``base_*``:
   the untrained model, before SFT on a pretrained model or as the start of RL without SFT;
   ``sft_*``: the SFT checkpoint; ``rl_*``: the RL policy):
   ``eval_samples`` replies per problem at temperature 1 with a seed of its own: mean pass
   fraction, all-pass rate, code-block rate.

Example::

    tempering recipe code-rl                                  # defaults: docs/recipes/code-rl.md
    tempering recipe code-rl --sft-steps 20 --rl-steps 2 --out /tmp/code
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from tempering.envs.agent_data import write_chats
from tempering.envs.code import (
    CODE_SYSTEM_PROMPT,
    CodeGrading,
    CodeProblem,
    CodeTask,
    RewardMode,
    code_messages,
)
from tempering.evals.stats import Spread
from tempering.recipes._common import (
    GroupFlags,
    RecipeConfig,
    RecipeResult,
    positive,
    recipe_flags,
    trains_tiny_from_scratch,
)
from tempering.recipes.stages import RecipeSession, RLStage, SFTStage, sft_then_rl, stage_field
from tempering.rl.task_evals import evaluate_code
from tempering.tools.sandbox import LocalSandbox
from tempering_protocols import Message, SamplingClient

__all__ = ["CodeRLRecipe", "write_solutions"]


def write_solutions(path: Path, problems: Sequence[CodeProblem], system_prompt: str | None) -> Path:
    """The problems' reference solutions as chat rows (``{"messages": [...]}``); returns ``path``."""
    rows: list[list[Message]] = []
    for p in problems:
        if p.solution is None:
            raise ValueError(f"code-rl SFT: problem {p.id!r} has no reference solution")
        rows.append(
            [
                *code_messages(p, system_prompt),
                {"role": "assistant", "content": f"```python\n{p.solution}```"},
            ]
        )
    return write_chats(path, rows)


@recipe_flags(max_tokens=128)
class CodeRLRecipe(RecipeConfig, GroupFlags):
    """Code RL: SFT on reference solutions, then RL graded by tests in a sandbox; calling it runs it.

    ``sft.steps`` 0 skips SFT (RL starts from the base model). ``rl.learning_rate``: 1e-4 (the
    other recipes' RL rate) undoes the SFT stage here (docs/recipes/code-rl.md).
    """

    sft: SFTStage = stage_field(SFTStage(200, 32, 1e-3, max_warmup_steps=20))
    """The SFT warm start on reference solutions (``--sft.steps`` or ``--sft-steps``, ...; 0 steps: none)."""
    rl: RLStage = stage_field(RLStage(10, 1e-5, eval_every=5, batch_size=8))
    """The RL stage (``--rl.steps`` or ``--rl-steps``, ...; ``--rl.eval-every``: evaluate the
    policy every this many steps, 0: only before and after)."""

    n_test: int = 8
    """Problems held out of SFT and RL (of 40)."""
    reward: RewardMode = "fraction"
    """``fraction``: the share of tests passed; ``all``: 1 only when every test passes."""
    init_state: str | None = None
    """A ``save_state`` checkpoint to start RL from instead of the SFT stage (which is skipped,
    with its evaluation: the figures before RL are the checkpoint's own run's)."""
    sandbox_seconds: float = positive(5.0)
    """Wall- and CPU-time limit of one grading run."""
    eval_train: bool = True
    """Evaluate on the training problems too (``--no-eval-train``: on the held-out ones only, a
    fraction of the time on a real model)."""
    eval_seeds: int = positive(1)
    """Evaluation seeds: each evaluation samples its replies once per seed; the figures are the
    means over the seeds, ``<figure>_sd`` (pass fraction, all-pass) their standard deviation."""

    NAME: ClassVar[str] = "code-rl"

    def validate(self) -> None:
        self.task().problems()  # validates n_test against the problem file

    def task(self) -> CodeTask:
        """The RL task of this config."""
        sandbox = LocalSandbox(
            wall_seconds=self.sandbox_seconds, cpu_seconds=max(1, round(self.sandbox_seconds))
        )
        return CodeTask(
            base_model=self.base_model, renderer_name=self.renderer_name, group_size=self.group_size,
            n_test=self.n_test, batch_size=self.rl.batch_size, seed=self.seed,
            test_group_size=self.eval_samples, n_batches=self.rl.steps,
            grading=CodeGrading(sandbox=sandbox, reward=self.reward), system_prompt=CODE_SYSTEM_PROMPT,
        )  # fmt: skip

    async def run(self, s: RecipeSession) -> RecipeResult:
        task = self.task()
        train_problems, test_problems = task.problems()
        renderer = self.renderer()

        untrained = self.sft.steps == 0 and self.init_state is None  # "before RL" is the base model

        async def evaluate(stage: str, sampler: SamplingClient) -> dict[str, float]:
            stage = "base" if stage == "sft" and untrained else stage
            figures: dict[str, float] = {}
            splits = (("train", train_problems),) if self.eval_train else ()
            for split, problems in (*splits, ("test", test_problems)):
                runs = [
                    await evaluate_code(
                        sampler,
                        problems,
                        renderer,
                        task.grading,
                        samples=self.eval_samples,
                        max_tokens=self.max_tokens,
                        seed=self.seed + 7919 + k,
                    )
                    for k in range(self.eval_seeds)
                ]
                for key in runs[0]:
                    spread = Spread(tuple(range(len(runs))), tuple(r[key] for r in runs))
                    figures[f"{stage}_{split}_{key}"] = spread.mean
                    if key in ("pass_fraction", "all_pass") and len(runs) > 1:
                        figures[f"{stage}_{split}_{key}_sd"] = spread.sd
            s.say(f"{stage}: {_describe(figures, stage)}")
            return figures

        def train_data() -> Path:
            return write_solutions(s.run_dir / "data" / "train.jsonl", train_problems, CODE_SYSTEM_PROMPT)

        run = await sft_then_rl(
            s, self.sft, self.rl, evaluate,
            train_path=train_data, task=task, init_state=self.init_state, max_tokens=self.max_tokens,
            evaluate_base=True, evaluate_untrained=not trains_tiny_from_scratch(self.base_model),
            log_trajectories=True, rl_what=f" of {self.rl.batch_size} problems x {self.group_size} replies",
        )  # fmt: skip
        details = {**(run.base or {}), **(run.before or {}), **run.after}
        headline = tuple(
            f"{split}_{k}{sd}"
            for split in ("train", "test")
            for k in ("pass_fraction", "all_pass")
            for sd in ("", "_sd")
        )
        figures = {
            f"{st}_{k}": details[f"{st}_{k}"]
            for st in ("base", "sft", "rl")
            for k in headline
            if f"{st}_{k}" in details
        }
        extra = {
            "evaluation": details,
            "train_problems": [p.id for p in train_problems],
            "test_problems": [p.id for p in test_problems],
            "rl_checkpoint": run.rl.final.sampler_path,
        }
        return s.finish(figures, extra)


def _describe(figures: dict[str, float], stage: str) -> str:
    parts: list[str] = []
    for split in ("train", "test") if f"{stage}_train_format" in figures else ("test",):
        pass_fraction, all_pass, block = (
            figures[f"{stage}_{split}_{k}"] for k in ("pass_fraction", "all_pass", "format")
        )
        parts.append(f"{split} pass {pass_fraction:.1%} (all-pass {all_pass:.1%}, code block {block:.1%})")
    return ", ".join(parts)

"""``tempering recipe guess-number``: multi-turn RL on guessing a number with higher/lower
feedback, from a short supervised warm start.

A randomly initialised tiny model cannot play from nothing in minutes, so the pipeline is:

1. Data: every number of ``low..high`` is a secret (``n_test_secrets > 0`` holds some out of
   SFT and RL, a seeded split). A scripted teacher plays ``sft_games`` games on training
   secrets (:func:`~tempering.envs.game_data.write_transcripts`); the default teacher,
   ``"random"``, guesses uniformly within the range the feedback still allows: always legal,
   never wasted, but slower than bisection (on 0..9 with 4 turns it finds the secret in about
   76% of games, bisection in all). The transcripts are chat JSONL in ``<out>/data``.
2. SFT: :func:`tempering.sft.train_supervised` on every assistant turn of the transcripts
   (format, legal guesses, using the feedback); run directory ``<out>/sft``.
3. RL: :func:`tempering.rl.train` from the SFT checkpoint on
   :class:`~tempering.envs.guess_number.GuessNumberTask`: ``rl.batch_size`` training secrets ×
   ``group_size`` games per step, the ``G`` games of a group sharing the secret; reward
   ``1 - turn_cost * (turns - 1)`` for finding it, 0 when the turns run out,
   ``invalid_reward`` for an invalid reply; run directory ``<out>/rl``.
4. Evaluation of the SFT and the RL weights alike: ``eval_samples`` games per secret (the
   held-out ones when there are), sampled at temperature 1 (the policy as RL samples it) with
   a fixed seed of its own (``eval_seeds`` of them, the games of every seed pooled), a distinct
   one per group and game (:func:`~tempering.rl.evaluate.evaluate_guess_number_seeds`): success
   rate (with its 95% Wilson interval in ``ci95`` and its spread over the evaluation seeds in
   ``spread``), mean turns, invalid-reply rate
   (:func:`~tempering.envs.guess_number.guess_number_stats`). The difference is RL's own
   contribution. A pretrained base model (anything but the tiny one) is evaluated the same way
   before SFT too (``base_*``): where it started. ``summary.json`` also records the scripted
   teacher and bisection on the same secrets, for scale.

Shapes: ``P`` secrets per RL step (``rl.batch_size``), ``G`` games per secret (``group_size``).

Example::

    tempering recipe guess-number                        # defaults: docs/recipes/guess-number.md
    tempering recipe guess-number --sft-steps 20 --rl-steps 2 --out /tmp/guess
    result = asyncio.run(GuessNumberRecipe(out="/tmp/guess")())
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import attrs

from tempering.envs.game_data import TEACHERS, Teacher, scripted_stats, write_transcripts
from tempering.envs.guess_number import (
    GuessNumberGroupBuilder,
    GuessNumberRules,
    GuessNumberStats,
    GuessNumberTask,
)
from tempering.evals.accuracy import wilson_interval
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
from tempering.rl.evaluate import evaluate_guess_number_seeds
from tempering_protocols import SamplingClient, TrainOnWhat

__all__ = ["GuessNumberRecipe"]


def _describe(stats: GuessNumberStats) -> str:
    return (
        f"success {stats.success:.1%}, {stats.turns:.2f} turns a game, "
        f"invalid {stats.invalid:.1%} ({stats.episodes} games)"
    )


@recipe_flags(group_size=16, max_tokens=6, eval_samples=16)
class GuessNumberRecipe(RecipeConfig, GroupFlags):
    """Guess-number: SFT on scripted games, then multi-turn RL; calling it runs it. ``P``: secrets
    per RL step (``rl.batch_size``), ``G``: games per secret (``group_size``); ``eval_samples``
    games per evaluation secret.

    The defaults are the measured run of docs/recipes/guess-number.md; the test runs a tiny
    budget.
    """

    sft: SFTStage = stage_field(
        SFTStage(300, 32, 1e-3, max_warmup_steps=20, train_on_what=TrainOnWhat.ALL_ASSISTANT_MESSAGES),
        required=True,
    )
    """The SFT warm start on the transcripts (``--sft.steps`` or ``--sft-steps``, ...)."""
    rl: RLStage = stage_field(RLStage(30, 1e-4, eval_every=10, batch_size=8))
    """The RL stage (``--rl.steps`` or ``--rl-steps``, ...; ``--rl.eval-every``: evaluate the
    policy every this many steps, 0: only before and after)."""
    rules: GuessNumberRules = stage_field(GuessNumberRules(low=0, high=9, max_turns=4), flat="")
    """The game: secrets ``low..high`` (the default 0..9 keeps every guess one token for the
    byte-level tiny model), ``max_turns`` guesses (a game not won by then scores 0), reward
    ``1 - turn_cost * (t - 1)`` for finding the secret at turn ``t``, ``invalid_reward`` for an
    invalid reply (not an integer in ``low..high``, or unparseable; it ends the game)
    (``--rules.high``, or ``--high`` as before, ...)."""
    teacher: Teacher = "random"
    """The scripted player of the SFT transcripts: ``random`` (within the feasible range) or ``bisect``."""
    n_test_secrets: int = 0
    """Secrets held out of SFT and RL and evaluated on; 0 (the default): every secret is trained
    on and evaluated on, with held-out sampling seeds."""
    sft_games: int = positive(4000)
    """Scripted games written for the SFT stage."""
    eval_seeds: int = positive(1)
    """Evaluation seeds: each evaluation plays its games once per seed; the figures pool every
    seed's games, ``<stage>_success_sd`` is the standard deviation of the per-seed success."""

    NAME: ClassVar[str] = "guess-number"

    def validate(self) -> None:
        if self.teacher not in TEACHERS:
            raise ValueError(
                f"GuessNumberRecipe: teacher must be one of {sorted(TEACHERS)}, got {self.teacher!r}"
            )
        self.task()  # validates the range, max_turns and n_test_secrets

    def task(self) -> GuessNumberTask:
        """The RL task of this config."""
        return GuessNumberTask(
            base_model=self.base_model, renderer_name=self.renderer_name, rules=self.rules,
            n_test_secrets=self.n_test_secrets, seed=self.seed, batch_size=self.rl.batch_size,
            group_size=self.group_size, test_group_size=self.group_size, n_batches=self.rl.steps,
        )  # fmt: skip

    async def run(self, s: RecipeSession) -> RecipeResult:
        task = self.task()
        train_secrets, test_secrets = task.secrets()
        eval_secrets = test_secrets or train_secrets
        renderer = self.renderer()
        low, high, max_turns = self.rules.low, self.rules.high, self.rules.max_turns
        eval_builders = [
            GuessNumberGroupBuilder(renderer, secret, task.rules, group_size=self.eval_samples)
            for secret in eval_secrets
        ]

        seeds = [self.seed + 7919 + k for k in range(self.eval_seeds)]
        spreads: dict[str, Spread] = {}

        async def evaluate(stage: str, sampler: SamplingClient) -> GuessNumberStats:
            stats, per_seed = await evaluate_guess_number_seeds(
                sampler, eval_builders, max_tokens=self.max_tokens, seeds=seeds
            )
            spreads[stage] = Spread(tuple(seeds), tuple(x.success for x in per_seed))
            s.say(f"{'untrained' if stage == 'base' else 'after ' + stage.upper()} {_describe(stats)}")
            return stats

        # 1. data
        def transcripts(name: str, secrets: Sequence[int], n_games: int, seed: int) -> Path:
            return write_transcripts(
                s.run_dir / "data" / name, secrets, n_games=n_games, teacher=self.teacher, low=low, high=high,
                max_turns=max_turns, seed=seed,
            )  # fmt: skip

        train_path = transcripts("train.jsonl", train_secrets, self.sft_games, self.seed)
        test_path = transcripts("test.jsonl", eval_secrets, 64, self.seed + 1)

        # 2. SFT warm start, 3. RL from the SFT checkpoint, each evaluated
        run = await sft_then_rl(
            s, self.sft, self.rl, evaluate, train_path=train_path, test_path=test_path, task=task,
            max_tokens=self.max_tokens, evaluate_untrained=not trains_tiny_from_scratch(self.base_model),
        )  # fmt: skip
        evaluated = run.evaluations()

        # 4. outputs
        scripted = {
            **scripted_stats("random", eval_secrets, low, high, max_turns, 200),
            **scripted_stats("bisect", eval_secrets, low, high, max_turns, 200),
        }
        figures = {
            f"{k}_{m}": getattr(v, m) for m in ("success", "turns", "invalid") for k, v in evaluated.items()
        } | {f"{k}_success_sd": spreads[k].sd for k in evaluated}
        extra = {
            **{k: attrs.asdict(v) for k, v in evaluated.items()},
            "spread": {f"{k}_success": spreads[k].to_json() for k in evaluated},
            "scripted": scripted,
            "eval_secrets": list(eval_secrets),
            "train_secrets": list(train_secrets),
            "eval_games": len(eval_secrets) * self.eval_samples,
            **run.checkpoints(),
        }
        ci95 = {
            f"{k}_success": wilson_interval(v.success * v.episodes, v.episodes) for k, v in evaluated.items()
        }
        return s.finish(figures, extra, ci95=ci95)

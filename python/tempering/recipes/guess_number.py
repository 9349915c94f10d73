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
   :class:`~tempering.envs.guess_number.GuessNumberTask`: ``rl_batch_size`` training secrets ×
   ``group_size`` games per step, the ``G`` games of a group sharing the secret; reward
   ``1 - turn_cost * (turns - 1)`` for finding it, 0 when the turns run out,
   ``invalid_reward`` for an invalid reply; run directory ``<out>/rl``.
4. Evaluation of the SFT and the RL weights alike: ``eval_samples`` games per secret (the
   held-out ones when there are), sampled at temperature 1 (the policy as RL samples it) with
   a fixed seed of its own, a distinct one per group and game
   (:func:`~tempering.rl.evaluate.evaluate_guess_number`): success rate (with its 95% Wilson
   interval in ``ci95``), mean turns, invalid-reply rate
   (:func:`~tempering.envs.guess_number.guess_number_stats`). The difference is RL's own
   contribution. ``summary.json`` also records the scripted teacher and bisection on the same
   secrets, for scale.

Shapes: ``P`` secrets per RL step (``rl_batch_size``), ``G`` games per secret (``group_size``).

Example::

    tempering recipe guess-number                        # defaults: docs/recipes/guess-number.md
    tempering recipe guess-number --sft-steps 20 --rl-steps 2 --out /tmp/guess
    result = asyncio.run(GuessNumberRecipe(out="/tmp/guess")())
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import attrs

from tempering.backend import load_tokenizer
from tempering.envs.game_data import TEACHERS, Teacher, scripted_stats, write_transcripts
from tempering.envs.guess_number import GuessNumberGroupBuilder, GuessNumberStats, GuessNumberTask
from tempering.evals.accuracy import wilson_interval
from tempering.model_info import resolve_renderer_name
from tempering.recipes._common import RecipeConfig, RecipeResult
from tempering.recipes.stages import RecipeSession, RLStage, SFTStage, recipe_session, sft_then_rl
from tempering.renderers import get_renderer
from tempering.rl.evaluate import evaluate_guess_number
from tempering_protocols import TrainOnWhat

__all__ = ["GuessNumberRecipe"]


def _describe(stats: GuessNumberStats) -> str:
    return (
        f"success {stats.success:.1%}, {stats.turns:.2f} turns a game, "
        f"invalid {stats.invalid:.1%} ({stats.episodes} games)"
    )


@attrs.frozen(kw_only=True)
class GuessNumberRecipe(RecipeConfig):
    """Guess-number: SFT on scripted games, then multi-turn RL; calling it runs it.

    The defaults are the measured run of docs/recipes/guess-number.md; the test runs a tiny
    budget.
    """

    low: int = 0
    high: int = 9
    """The range of secrets; the default keeps every guess one token for the byte-level tiny model."""
    max_turns: int = 4
    teacher: Teacher = "random"
    """The scripted player of the SFT transcripts: ``random`` (within the feasible range) or ``bisect``."""
    invalid_reward: float = -1.0
    """Reward for an invalid reply (not an integer in ``low..high``, or unparseable); it ends the game."""
    turn_cost: float = 0.1
    """Reward for finding the secret at turn ``t``: ``1 - turn_cost * (t - 1)``."""
    n_test_secrets: int = 0
    """Secrets held out of SFT and RL and evaluated on; 0 (the default): every secret is trained
    on and evaluated on, with held-out sampling seeds."""
    sft_games: int = 4000
    sft_steps: int = 300
    sft_batch_size: int = 32
    sft_learning_rate: float = 1e-3
    rl_steps: int = 30
    rl_batch_size: int = 8
    """Secrets per RL step (``P``)."""
    group_size: int = 16
    """Games per secret (``G``), sharing the secret."""
    rl_learning_rate: float = 1e-4
    rl_eval_every: int = 10
    max_tokens: int = 6
    """Tokens per reply."""
    eval_samples: int = 16
    """Games per evaluation secret, before and after RL."""

    def __attrs_post_init__(self) -> None:
        where = "GuessNumberRecipe"
        for name in (
            "sft_games", "sft_steps", "sft_batch_size", "rl_steps", "rl_batch_size", "group_size",
            "eval_samples", "max_tokens",
        ):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{where}: {name} must be >= 1, got {getattr(self, name)}")
        if self.teacher not in TEACHERS:
            raise ValueError(f"{where}: teacher must be one of {sorted(TEACHERS)}, got {self.teacher!r}")
        self.task()  # validates the range, max_turns and n_test_secrets

    def task(self) -> GuessNumberTask:
        """The RL task of this config."""
        return GuessNumberTask(
            base_model=self.base_model, renderer_name=self.renderer_name, low=self.low, high=self.high,
            max_turns=self.max_turns, turn_cost=self.turn_cost, invalid_reward=self.invalid_reward,
            n_test_secrets=self.n_test_secrets, seed=self.seed, batch_size=self.rl_batch_size,
            group_size=self.group_size, test_group_size=self.group_size, n_batches=self.rl_steps,
        )  # fmt: skip

    async def __call__(self) -> RecipeResult:
        async with recipe_session("guess-number", self) as s:
            return await _run(self, s)


async def _run(config: GuessNumberRecipe, s: RecipeSession) -> RecipeResult:
    task = config.task()
    train_secrets, test_secrets = task.secrets()
    eval_secrets = test_secrets or train_secrets
    renderer = get_renderer(
        resolve_renderer_name(config.base_model, config.renderer_name), load_tokenizer(config.base_model)
    )
    low, high, max_turns = config.low, config.high, config.max_turns
    eval_builders = [
        GuessNumberGroupBuilder(
            renderer, secret, low=low, high=high, max_turns=max_turns, group_size=config.eval_samples,
            turn_cost=config.turn_cost, invalid_reward=config.invalid_reward,
        )
        for secret in eval_secrets
    ]  # fmt: skip

    async def evaluate(path: str | None, stage: str) -> GuessNumberStats:
        sampler = await s.sampler(path)
        stats = await evaluate_guess_number(
            sampler, eval_builders, max_tokens=config.max_tokens, seed=config.seed + 7919
        )
        s.say(f"after {stage} {_describe(stats)}")
        return stats

    # 1. data
    def transcripts(name: str, secrets: Sequence[int], n_games: int, seed: int) -> Path:
        path = s.run_dir / "data" / name
        return write_transcripts(
            path,
            secrets,
            n_games=n_games,
            teacher=config.teacher,
            low=low,
            high=high,
            max_turns=max_turns,
            seed=seed,
        )

    train_path = transcripts("train.jsonl", train_secrets, config.sft_games, config.seed)
    test_path = transcripts("test.jsonl", eval_secrets, 64, config.seed + 1)

    # 2. SFT warm start, 3. RL from the SFT checkpoint
    sft_config = SFTStage.of(
        config, "sft_", max_warmup_steps=20, train_on_what=TrainOnWhat.ALL_ASSISTANT_MESSAGES
    )
    sft, rl = await sft_then_rl(
        s, sft_config, RLStage.of(config, "rl_"), train_path=train_path, test_path=test_path, task=task,
        max_tokens=config.max_tokens,
    )  # fmt: skip
    before = await evaluate(sft.final.sampler_path, "SFT")
    after = await evaluate(rl.final.sampler_path, "RL")

    # 4. outputs
    scripted = {
        **scripted_stats("random", eval_secrets, low, high, max_turns, 200),
        **scripted_stats("bisect", eval_secrets, low, high, max_turns, 200),
    }
    figures = {
        "sft_success": before.success,
        "rl_success": after.success,
        "sft_turns": before.turns,
        "rl_turns": after.turns,
        "sft_invalid": before.invalid,
        "rl_invalid": after.invalid,
    }
    extra = {
        "sft": attrs.asdict(before),
        "rl": attrs.asdict(after),
        "scripted": scripted,
        "eval_secrets": list(eval_secrets),
        "train_secrets": list(train_secrets),
        "eval_games": len(eval_secrets) * config.eval_samples,
        "sft_checkpoint": sft.final.sampler_path,
        "rl_checkpoint": rl.final.sampler_path,
    }
    ci95 = {
        f"{k}_success": wilson_interval(v.success * v.episodes, v.episodes)
        for k, v in (("sft", before), ("rl", after))
    }
    return s.finish(figures, extra, ci95=ci95)

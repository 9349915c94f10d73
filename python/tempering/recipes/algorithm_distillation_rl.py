"""``tempering recipe algorithm-distillation --task guess-number --source rl``: the histories come
from a tempering RL run on the token-level guess-number env (:mod:`tempering.ad.rl_source`).

The run: a scripted teacher's games (``--source-sft-games``, the teacher guessing uniformly
within the range the feedback allows, on the training numbers), an SFT warm start of
``--base-model`` on them (``--source-sft.*``, into ``<out>/source-sft``; a randomly initialised
tiny model cannot play from nothing), then RL from it (``--source-rl.*``, into
``<out>/source-rl``, its trajectory log kept): every step, ``--source-group-size`` games on each
training number (the even numbers of 1..16), 6 guesses a game, the env's rules
(:func:`~tempering.ad.rl_source.rules_of`). Its log becomes ``P × G`` learning histories of
``--source-rl.steps`` episodes (:func:`~tempering.ad.rl_source.rl_histories`) in
``<out>/histories``.

Example::

    hist_dir = await rl_source_histories(config, session, GuessNumberEnvFamily())
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tempering.ad.guess_env import GuessNumberEnvFamily
from tempering.ad.rl_source import GuessNumberSourceTask, rl_histories
from tempering.backend import ModelConfig
from tempering.envs.game_data import write_transcripts
from tempering.recipes._common import fresh_model
from tempering.recipes.stages import RecipeSession, rl_stage, sft_stage

if TYPE_CHECKING:
    from tempering.recipes.algorithm_distillation import AlgorithmDistillationRecipe

__all__ = ["rl_source_histories"]

MAX_REPLY_TOKENS = 6
"""Tokens of one reply in the RL run (a number of 1..16 and the stop token fit)."""


async def rl_source_histories(
    config: AlgorithmDistillationRecipe, s: RecipeSession, family: GuessNumberEnvFamily
) -> Path:
    """Run the RL source (the module docstring) and write its histories; returns their directory."""
    numbers = family.numbers(held_out=False)
    data = write_transcripts(
        s.run_dir / "source-data" / "train.jsonl", numbers, n_games=config.source_sft_games, teacher="random",
        low=1, high=family.high, max_turns=family.max_turns, seed=config.seed,
    )  # fmt: skip
    s.say(
        f"RL source: SFT warm start, {config.source_sft.steps} steps on {data} -> {s.run_dir / 'source-sft'}"
    )
    sft = await sft_stage(
        s, "source-sft", config.source_sft, model=fresh_model(config), train_path=data, seed=config.seed
    )
    stage = config.source_rl.for_model(config.base_model)
    task = GuessNumberSourceTask(
        base_model=config.base_model, renderer_name=config.renderer_name, high=family.high,
        max_turns=family.max_turns, group_size=config.source_group_size, n_batches=stage.steps,
    )  # fmt: skip
    s.say(
        f"RL source: {stage.steps} steps of {config.source_group_size} games on each of {len(numbers)} "
        f"numbers -> {s.run_dir / 'source-rl'}"
    )
    model = ModelConfig(
        base_model=config.base_model, init_state=sft.final.state_path, renderer_name=config.renderer_name
    )
    await rl_stage(
        s, "source-rl", stage, dataset=task, model=model, seed=config.seed, max_tokens=MAX_REPLY_TOKENS,
        log_trajectories=True,
    )  # fmt: skip
    return rl_histories(s.run_dir / "source-rl", family, config.renderer(), s.run_dir / "histories")

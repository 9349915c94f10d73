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

    hist_dir = await rl_source_histories(session, GuessNumberEnvFamily(), model=fresh_model(config),
                                         sft=SFTStage(150, 32, 1e-3), rl=RLStage(20, 1e-4),
                                         group_size=8, sft_games=2000, seed=0)
"""

from __future__ import annotations

from pathlib import Path

from tempering.ad.guess_env import GuessNumberEnvFamily
from tempering.ad.rl_source import GuessNumberSourceTask, rl_histories
from tempering.backend import ModelConfig
from tempering.envs.game_data import write_transcripts
from tempering.recipes.stages import RecipeSession, RLStage, SFTStage, rl_stage, sft_stage

__all__ = ["rl_source_histories"]

MAX_REPLY_TOKENS = 6
"""Tokens of one reply in the RL run (a number of 1..16 and the stop token fit)."""


async def rl_source_histories(
    s: RecipeSession,
    family: GuessNumberEnvFamily,
    *,
    model: ModelConfig,
    sft: SFTStage,
    rl: RLStage,
    group_size: int,
    sft_games: int,
    seed: int,
) -> Path:
    """Run the RL source (the module docstring) from ``model`` (the recipe's fresh model: its
    base model, chat format and LoRA rank) and write its histories; returns their directory.
    ``rl``'s learning rate must be resolved (:meth:`RLStage.for_model`)."""
    numbers = family.numbers(held_out=False)
    data = write_transcripts(
        s.run_dir / "source-data" / "train.jsonl", numbers, n_games=sft_games, teacher="random",
        low=1, high=family.high, max_turns=family.horizon, seed=seed,
    )  # fmt: skip
    s.say(f"RL source: SFT warm start, {sft.steps} steps on {data} -> {s.run_dir / 'source-sft'}")
    warm = await sft_stage(s, "source-sft", sft, model=model, train_path=data, seed=seed)
    task = GuessNumberSourceTask(
        base_model=model.base_model, renderer_name=model.renderer_name, high=family.high,
        max_turns=family.horizon, group_size=group_size, n_batches=rl.steps,
    )  # fmt: skip
    s.say(
        f"RL source: {rl.steps} steps of {group_size} games on each of {len(numbers)} numbers "
        f"-> {s.run_dir / 'source-rl'}"
    )
    start = ModelConfig(
        base_model=model.base_model, init_state=warm.final.state_path, renderer_name=model.renderer_name
    )
    await rl_stage(
        s,
        "source-rl",
        rl,
        dataset=task,
        model=start,
        seed=seed,
        max_tokens=MAX_REPLY_TOKENS,
        log_trajectories=True,
    )
    return rl_histories(s.run_dir / "source-rl", family, task.renderer(), s.run_dir / "histories")

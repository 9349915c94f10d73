"""Evaluations that play envs with a policy (they run rollouts, so they live above ``envs/``).

- :func:`evaluate_against_random` plays tic-tac-toe as X and as O against a uniformly random
  player and returns the :class:`~tempering.envs.tic_tac_toe.TicTacToeStats` of each side.
- :func:`evaluate_guess_number` plays guess-number groups and summarises them.
- :func:`evaluate_against_random_seeds` and :func:`evaluate_guess_number_seeds` repeat those
  over several evaluation seeds: every seed's games pooled, and each seed's own stats.
- :func:`evaluate_dataset` rolls out a test ``RLDataset`` as the RL loop's evaluation does.
- :func:`play_groups` plays builders and returns their trajectories, raising on a failed game.

Every group draws from its own seed, derived from the call's ``seed`` by :func:`rollout_batch`
(``sampling_seed(seed, "group", p)``) and, per member and turn, below it.
"""

from __future__ import annotations

from collections.abc import Sequence

from tempering.envs.guess_number import GuessNumberGroupBuilder, GuessNumberStats, guess_number_stats
from tempering.envs.tic_tac_toe import (
    MARKS,
    Side,
    TicTacToeStats,
    TicTacToeVsRandomGroupBuilder,
    tic_tac_toe_stats,
)
from tempering.rl.policy import TinkerTokenCompleter, sampling_seed
from tempering.rl.rollouts import GroupRollout, RolloutConfig, rollout_batch
from tempering.rl.train import rollout_metrics
from tempering_protocols import (
    EnvGroupBuilder,
    Renderer,
    RLDataset,
    SamplingClient,
    TokenCompleter,
    Trajectory,
)

__all__ = [
    "evaluate_against_random",
    "evaluate_against_random_seeds",
    "evaluate_dataset",
    "evaluate_guess_number",
    "evaluate_guess_number_seeds",
    "play_groups",
]


async def play_groups(
    builders: Sequence[EnvGroupBuilder], policy: TokenCompleter, *, seed: int, what: str
) -> list[Trajectory]:
    """Play every group of ``builders`` with ``policy`` (seeded from ``seed``) and return all
    their trajectories; a ``RuntimeError`` naming ``what`` if any episode failed.

    Example::

        trajectories = await play_groups(builders, policy, seed=0, what="guess-number evaluation")
    """
    rollouts = await rollout_batch(builders, policy, RolloutConfig(), seed=seed)
    if any(r.group is None or r.n_failed for r in rollouts):
        failures = {k: v for r in rollouts for k, v in r.failures.items()}
        raise RuntimeError(f"{what}: episodes failed: {failures}")
    return [t for r in rollouts if r.group is not None for t in r.group.trajectories_G]


async def evaluate_guess_number(
    sampler: SamplingClient,
    builders: Sequence[GuessNumberGroupBuilder],
    *,
    max_tokens: int,
    seed: int,
    temperature: float = 1.0,
) -> GuessNumberStats:
    """Play every group of ``builders`` with ``sampler`` (seeded) and summarise the episodes.

    Example::

        stats = await evaluate_guess_number(sampler, test_builders, max_tokens=6, seed=0)
        stats.success, stats.turns
    """
    policy = TinkerTokenCompleter(sampler, max_tokens, temperature)
    return guess_number_stats(await play_groups(builders, policy, seed=seed, what="guess-number evaluation"))


async def evaluate_guess_number_seeds(
    sampler: SamplingClient,
    builders: Sequence[GuessNumberGroupBuilder],
    *,
    max_tokens: int,
    seeds: Sequence[int],
    temperature: float = 1.0,
) -> tuple[GuessNumberStats, list[GuessNumberStats]]:
    """:func:`evaluate_guess_number` once per evaluation seed of ``seeds``: the stats of every
    game of every seed pooled, and each seed's own (whose spread is the evaluation's).

    Example::

        pooled, per_seed = await evaluate_guess_number_seeds(sampler, builders, max_tokens=6, seeds=[1, 2, 3])
        pooled.success, [s.success for s in per_seed]
    """
    if not seeds:
        raise ValueError("evaluate_guess_number_seeds: seeds is empty; pass at least one evaluation seed")
    policy = TinkerTokenCompleter(sampler, max_tokens, temperature)
    games = [await play_groups(builders, policy, seed=seed, what="guess-number evaluation") for seed in seeds]
    return guess_number_stats([t for g in games for t in g]), [guess_number_stats(g) for g in games]


async def evaluate_dataset(
    dataset: RLDataset, policy: TokenCompleter, *, seed: int, after: int = 0
) -> dict[str, float]:
    """``test/…`` metrics of every batch of ``dataset`` rolled out as the RL loop's evaluation
    after ``after`` steps does (batch ``i`` seeded with ``sampling_seed(seed, "test", after, i)``).

    Example::

        metrics = await evaluate_dataset(test_ds, TinkerTokenCompleter(sampler, 16, 1.0), seed=0)
    """
    rollouts: list[GroupRollout] = []
    for i in range(len(dataset)):
        batch = dataset.get_batch(i)
        rollouts += await rollout_batch(
            batch, policy, RolloutConfig(), seed=sampling_seed(seed, "test", after, i)
        )
    return rollout_metrics(rollouts, prefix="test")


async def evaluate_against_random(
    policy: TokenCompleter,
    renderer: Renderer,
    *,
    games_per_side: int = 100,
    seed: int = 0,
    group_size: int = 25,
    illegal_reward: float = -1.0,
) -> dict[Side, TicTacToeStats]:
    """Play ``policy`` against a uniformly random player, ``games_per_side`` games as X and as
    O (random players seeded from ``seed``; a seedable policy is seeded too), and return the
    :class:`TicTacToeStats` of each side. Raises if a game failed (an env or sampling error).

    Example::

        policy = TinkerTokenCompleter(sampling_client, max_tokens=4)
        stats = await evaluate_against_random(policy, renderer, games_per_side=200, seed=1)
        stats["X"].win, stats["O"].illegal
    """
    games = await _games_against_random(policy, renderer, games_per_side, seed, group_size, illegal_reward)
    return {side: tic_tac_toe_stats(games[side]) for side in MARKS}


async def evaluate_against_random_seeds(
    policy: TokenCompleter,
    renderer: Renderer,
    *,
    games_per_side: int = 100,
    seeds: Sequence[int],
    group_size: int = 25,
    illegal_reward: float = -1.0,
) -> tuple[dict[Side, TicTacToeStats], list[dict[Side, TicTacToeStats]]]:
    """:func:`evaluate_against_random` once per evaluation seed of ``seeds`` (``games_per_side``
    games per side each): every seed's games pooled per side, and each seed's own stats (whose
    spread is the evaluation's).

    Example::

        pooled, per_seed = await evaluate_against_random_seeds(
            policy, renderer, games_per_side=50, seeds=[1, 2, 3]
        )
        pooled["X"].win, [s["X"].win for s in per_seed]
    """
    if not seeds:
        raise ValueError("evaluate_against_random_seeds: seeds is empty; pass at least one evaluation seed")
    runs = [
        await _games_against_random(policy, renderer, games_per_side, seed, group_size, illegal_reward)
        for seed in seeds
    ]
    pooled: dict[Side, TicTacToeStats] = {
        side: tic_tac_toe_stats([t for run in runs for t in run[side]]) for side in MARKS
    }
    return pooled, [{side: tic_tac_toe_stats(run[side]) for side in MARKS} for run in runs]


async def _games_against_random(
    policy: TokenCompleter,
    renderer: Renderer,
    games_per_side: int,
    seed: int,
    group_size: int,
    illegal_reward: float,
) -> dict[Side, list[Trajectory]]:
    if games_per_side < 1:
        raise ValueError(f"evaluate_against_random: games_per_side must be >= 1, got {games_per_side}")
    out: dict[Side, list[Trajectory]] = {}
    for i, side in enumerate(MARKS):
        sizes = [min(group_size, games_per_side - start) for start in range(0, games_per_side, group_size)]
        builders = [
            TicTacToeVsRandomGroupBuilder(
                renderer, side=side, seed=seed * 1000 + p, group_size=n, illegal_reward=illegal_reward
            )
            for p, n in enumerate(sizes)
        ]
        what = f"evaluate_against_random as {side}"
        out[side] = await play_groups(builders, policy, seed=seed * 2 + i, what=what)
    return out

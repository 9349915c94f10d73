"""``tempering recipe tic-tac-toe``: multi-agent RL by self-play, evaluated against a uniformly
random player, from a short supervised warm start.

1. Data: ``sft_games`` games between two uniformly random legal players; every position becomes
   one conversation (the board for the mover → the mover's cell), as chat JSONL in
   ``<out>/data`` (:func:`~tempering.envs.game_data.write_random_games`). This teaches the
   format and legal moves, not good play; at the default budget the warm-started policy still
   loses about 40% of its games against a random player by an illegal move
   (docs/recipes/tic-tac-toe.md), which self-play then punishes.
2. SFT: :func:`tempering.sft.train_supervised`; run directory ``<out>/sft``.
3. RL: :func:`tempering.rl.train` from the SFT checkpoint on self-play
   (:class:`~tempering.envs.game_data.SelfPlayTask`): ``rl.batch_size`` groups of
   ``games_per_group`` games per step, both players of every game being the policy being
   trained (turn-taking coordinated inside the group, as in Nim); the outcome is the group
   reward: +1 win, 0 draw, -1 loss, ``illegal_reward`` for an illegal move (which loses), 0 for
   the opponent of an illegal mover. Run directory ``<out>/rl``.
4. Evaluation of the SFT and the RL weights alike against a uniformly random player,
   ``eval_games`` games as X and as O per evaluation seed (``eval_seeds``, their games pooled),
   sampled at temperature 1 with fixed seeds: win, draw, loss and illegal-move rates per side
   (:func:`~tempering.rl.evaluate.evaluate_against_random_seeds`). The difference is RL's own
   contribution; ``summary.json``'s ``ci95`` holds each rate's 95% Wilson interval, its
   ``spread`` the per-seed values. A pretrained base model (anything but the tiny one) is
   evaluated the same way before SFT too (``base_*``). For scale, random against random: X wins
   about 58.5%, O about 28.8%, draws 12.7%.

Shapes: ``P`` groups per RL step (``rl.batch_size``), ``G = 2 * games_per_group`` players per group.

Example::

    tempering recipe tic-tac-toe                         # defaults: docs/recipes/tic-tac-toe.md
    tempering recipe tic-tac-toe --sft-steps 20 --rl-steps 2 --out /tmp/ttt
    result = asyncio.run(TicTacToeRecipe(out="/tmp/ttt")())
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from tempering.envs.game_data import SelfPlayTask, write_random_games
from tempering.envs.tic_tac_toe import MARKS, Side, TicTacToeStats
from tempering.evals.accuracy import wilson_interval
from tempering.evals.stats import Spread
from tempering.recipes._common import RecipeConfig, RecipeResult, positive, trains_tiny_from_scratch
from tempering.recipes.stages import RecipeSession, RLStage, SFTStage, sft_then_rl, stage_field
from tempering.rl.evaluate import evaluate_against_random_seeds
from tempering.rl.policy import TinkerTokenCompleter
from tempering_protocols import SamplingClient

__all__ = ["TicTacToeRecipe"]


def _describe(stats: dict[Side, TicTacToeStats]) -> str:
    return "; ".join(
        f"as {side} win {s.win:.1%} draw {s.draw:.1%} loss {s.loss:.1%} (illegal {s.illegal:.1%})"
        for side, s in stats.items()
    )


@attrs.frozen(kw_only=True)
class TicTacToeRecipe(RecipeConfig):
    """Tic-tac-toe: SFT on random legal games, then self-play RL; calling it runs it.
    ``rl.batch_size``: self-play groups per RL step (``P``).

    The defaults are the measured run of docs/recipes/tic-tac-toe.md; the test runs a tiny
    budget.
    """

    sft: SFTStage = stage_field(SFTStage(600, 32, 1e-3, max_warmup_steps=20), required=True)
    """The SFT warm start on random games' positions (``--sft.steps`` or ``--sft-steps``, ...)."""
    rl: RLStage = stage_field(RLStage(30, 1e-4, batch_size=8))
    """The self-play RL stage (``--rl.steps`` or ``--rl-steps``, ...)."""
    sft_games: int = positive(2000)
    """Random legal games whose positions are the SFT data (about 7.6 positions a game)."""
    games_per_group: int = positive(4)
    """Games per group; both players of each are members (``G = 2 * games_per_group``)."""
    illegal_reward: float = -1.0
    """Reward of a player who moves illegally (which loses the game)."""
    max_tokens: int = positive(4)
    """Tokens per reply."""
    eval_games: int = positive(200)
    """Games against the random player per side (X and O) and evaluation seed, before and after RL."""
    eval_seeds: int = positive(1)
    """Evaluation seeds: each evaluation plays ``eval_games`` per side once per seed; the rates
    pool every seed's games, ``spread`` in ``summary.json`` holds each rate's per-seed values."""

    NAME: ClassVar[str] = "tic-tac-toe"

    async def run(self, s: RecipeSession) -> RecipeResult:
        renderer = self.renderer()
        seeds = [self.seed + 7919 + k for k in range(self.eval_seeds)]
        spreads: dict[str, Spread] = {}

        async def evaluate(stage: str, sampler: SamplingClient) -> dict[Side, TicTacToeStats]:
            policy = TinkerTokenCompleter(sampler, self.max_tokens, 1.0)
            stats, per_seed = await evaluate_against_random_seeds(
                policy, renderer, games_per_side=self.eval_games, seeds=seeds,
                illegal_reward=self.illegal_reward,
            )  # fmt: skip
            for side in MARKS:
                for k in ("win", "draw", "loss", "illegal"):
                    spreads[f"{stage}_{side}_{k}"] = Spread(
                        tuple(seeds), tuple(getattr(x[side], k) for x in per_seed)
                    )
            when = "untrained" if stage == "base" else f"after {stage.upper()}"
            s.say(f"{when}, against a random player: {_describe(stats)}")
            return stats

        # 1. data: positions of random legal games
        train_path = write_random_games(s.run_dir / "data" / "train.jsonl", self.sft_games, self.seed)

        # 2. SFT warm start, 3. self-play RL from the SFT checkpoint, each evaluated
        task = SelfPlayTask(
            base_model=self.base_model, renderer_name=self.renderer_name, batch_size=self.rl.batch_size,
            games_per_group=self.games_per_group, illegal_reward=self.illegal_reward, n_batches=self.rl.steps,
        )  # fmt: skip
        run = await sft_then_rl(
            s,
            self.sft,
            self.rl,
            evaluate,
            train_path=train_path,
            task=task,
            max_tokens=self.max_tokens,
            evaluate_untrained=not trains_tiny_from_scratch(self.base_model),
        )

        # 4. outputs
        figures: dict[str, float] = {}
        ci95: dict[str, tuple[float, float]] = {}
        for stage_name, stats in run.evaluations().items():
            for side in MARKS:
                st = stats[side]
                for k in ("win", "draw", "loss", "illegal"):
                    figures[f"{stage_name}_{side}_{k}"] = getattr(st, k)
                    ci95[f"{stage_name}_{side}_{k}"] = wilson_interval(getattr(st, k) * st.games, st.games)
        extra = {
            **{k: {side: attrs.asdict(v[side]) for side in MARKS} for k, v in run.evaluations().items()},
            "eval_games_per_side": self.eval_games,
            "eval_seeds": seeds,
            "spread": {k: v.to_json() for k, v in spreads.items()},
            "sft_positions": len(train_path.read_text(encoding="utf-8").splitlines()),
            **run.checkpoints(),
        }
        return s.finish(figures, extra, ci95=ci95)

"""``tempering recipe tic-tac-toe``: multi-agent RL by self-play, evaluated against a uniformly
random player, from a short supervised warm start.

1. Data: ``sft_games`` games between two uniformly random legal players; every position becomes
   one conversation (the board for the mover → the mover's cell), as chat JSONL in
   ``<out>/data``. This teaches the format and legal moves, not good play; at the default
   budget the warm-started policy still loses about 40% of its games against a random player
   by an illegal move (docs/recipes/tic-tac-toe.md), which self-play then punishes.
2. SFT: :func:`tempering.sft.train_supervised`; run directory ``<out>/sft``.
3. RL: :func:`tempering.rl.train` from the SFT checkpoint on self-play
   (:class:`~tempering.envs.tic_tac_toe.TicTacToeGroupBuilder`): ``rl_batch_size`` groups of
   ``games_per_group`` games per step, both players of every game being the policy being
   trained (turn-taking coordinated inside the group, as in Nim); the outcome is the group
   reward: +1 win, 0 draw, -1 loss, ``illegal_reward`` for an illegal move (which loses), 0 for
   the opponent of an illegal mover. Run directory ``<out>/rl``.
4. Evaluation of the SFT and the RL weights alike against a uniformly random player,
   ``eval_games`` games as X and as O, sampled at temperature 1 with fixed seeds: win, draw,
   loss and illegal-move rates per side (:func:`~tempering.rl.evaluate.evaluate_against_random`).
   The difference is RL's own contribution. For scale, random against random: X wins about
   58.5%, O about 28.8%, draws 12.7%.

Shapes: ``P`` groups per RL step (``rl_batch_size``), ``G = 2 * games_per_group`` players per group.

Example::

    tempering recipe tic-tac-toe                         # defaults: docs/recipes/tic-tac-toe.md
    tempering recipe tic-tac-toe --sft-steps 20 --rl-steps 2 --out /tmp/ttt
    result = asyncio.run(TicTacToeRecipe(out="/tmp/ttt")())
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from pathlib import Path

import attrs

from tempering.envs.tic_tac_toe import (
    EMPTY,
    MARKS,
    Side,
    TicTacToeGroupBuilder,
    TicTacToeStats,
    legal_moves,
    tic_tac_toe_prompt,
    winner,
)
from tempering.model_info import resolve_renderer_name
from tempering.recipes._common import (
    TINY_MODEL,
    RecipeResult,
    close_service,
    finish,
    fresh_model,
    prepare_run_dir,
    recipe_service,
    sft_stage,
)
from tempering.renderers import get_renderer
from tempering.rl.evaluate import evaluate_against_random
from tempering_protocols import EnvGroupBuilder, Message, Renderer, RLDataset, SamplingClient

__all__ = ["SelfPlayTask", "TicTacToeRecipe", "random_game_positions", "write_random_games"]


def random_game_positions(rng: random.Random) -> list[tuple[str, Side, int]]:
    """One game between two uniformly random legal players: ``(board, mover, cell)`` for every
    move (board as 9 characters, cell 0-based)."""
    board = [EMPTY] * 9
    out: list[tuple[str, Side, int]] = []
    player = 0
    while winner(board) is None and legal_moves(board):
        cell = rng.choice(legal_moves(board))
        out.append(("".join(board), MARKS[player], cell))
        board[cell] = MARKS[player]
        player = 1 - player
    return out


def write_random_games(path: Path, n_games: int, seed: int) -> Path:
    """Write every position of ``n_games`` random legal games as a one-turn conversation
    ``{"messages": [user: board, assistant: cell]}``; returns ``path``.

    Example::

        write_random_games(Path("ttt.jsonl"), n_games=1000, seed=0)
    """
    rng = random.Random(f"tic-tac-toe-games/{seed}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for _ in range(n_games):
            for board, mark, cell in random_game_positions(rng):
                messages: list[Message] = [
                    {"role": "user", "content": tic_tac_toe_prompt(board, mark)},
                    {"role": "assistant", "content": str(cell + 1)},
                ]
                f.write(json.dumps({"messages": messages}) + "\n")
    return path


@attrs.frozen
class _SelfPlayDataset:
    """``batch_size`` self-play groups per batch (every batch alike: the games differ by the
    sampling seeds the RL loop gives each group)."""

    renderer: Renderer = attrs.field(eq=False)
    batch_size: int
    n_games: int
    n_batches: int
    illegal_reward: float
    turn_timeout_s: float

    def __len__(self) -> int:
        return self.n_batches

    def get_batch(self, index: int, /) -> Sequence[EnvGroupBuilder]:
        del index
        return [
            TicTacToeGroupBuilder(
                self.renderer,
                n_games=self.n_games,
                illegal_reward=self.illegal_reward,
                turn_timeout_s=self.turn_timeout_s,
            )
            for _ in range(self.batch_size)
        ]


@attrs.frozen(kw_only=True)
class SelfPlayTask:
    """The RL dataset builder of self-play: ``batch_size`` groups of ``games_per_group`` games per
    step, ``n_batches`` steps; no test set (the recipe evaluates against a random player).
    Picklable.

    Example::

        train, _ = await SelfPlayTask(batch_size=4, games_per_group=4)()
    """

    base_model: str = TINY_MODEL
    renderer_name: str | None = None
    batch_size: int = 4
    games_per_group: int = 4
    n_batches: int = 1000
    illegal_reward: float = -1.0
    turn_timeout_s: float = 120.0

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        from tempering.backend import load_tokenizer

        renderer = get_renderer(
            resolve_renderer_name(self.base_model, self.renderer_name), load_tokenizer(self.base_model)
        )
        dataset = _SelfPlayDataset(
            renderer,
            self.batch_size,
            self.games_per_group,
            self.n_batches,
            self.illegal_reward,
            self.turn_timeout_s,
        )
        return dataset, None


def _describe(stats: dict[Side, TicTacToeStats]) -> str:
    return "; ".join(
        f"as {side} win {s.win:.1%} draw {s.draw:.1%} loss {s.loss:.1%} (illegal {s.illegal:.1%})"
        for side, s in stats.items()
    )


@attrs.frozen(kw_only=True)
class TicTacToeRecipe:
    """Tic-tac-toe: SFT on random legal games, then self-play RL; calling it runs it.

    The defaults are the measured run of docs/recipes/tic-tac-toe.md; the test runs a tiny
    budget.
    """

    out: str | None = None
    """Run directory (replaced if it exists); default ``runs/tic-tac-toe-<timestamp>``."""
    base_model: str = TINY_MODEL
    renderer_name: str | None = None
    lora_rank: int | None = None
    """LoRA rank; default: full fine-tuning (0) for the tiny model, 32 otherwise."""
    seed: int = 0
    """Seeds the games, the initialisation and the sampling."""
    sft_games: int = 2000
    """Random legal games whose positions are the SFT data (about 7.6 positions a game)."""
    sft_steps: int = 600
    sft_batch_size: int = 32
    sft_learning_rate: float = 1e-3
    rl_steps: int = 30
    rl_batch_size: int = 8
    """Self-play groups per RL step (``P``)."""
    games_per_group: int = 4
    """Games per group; both players of each are members (``G = 2 * games_per_group``)."""
    rl_learning_rate: float = 1e-4
    illegal_reward: float = -1.0
    """Reward of a player who moves illegally (which loses the game)."""
    max_tokens: int = 4
    """Tokens per reply."""
    eval_games: int = 200
    """Games against the random player per side (X and O), before and after RL."""
    progress: bool = True

    def __attrs_post_init__(self) -> None:
        where = "TicTacToeRecipe"
        for name in (
            "sft_games", "sft_steps", "sft_batch_size", "rl_steps", "rl_batch_size", "games_per_group",
            "max_tokens", "eval_games",
        ):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{where}: {name} must be >= 1, got {getattr(self, name)}")

    async def __call__(self) -> RecipeResult:
        return await _run(self)


async def _run(config: TicTacToeRecipe) -> RecipeResult:
    from tempering.backend import ModelConfig, load_tokenizer
    from tempering.rl import RLConfig, train
    from tempering.rl.policy import TinkerTokenCompleter
    from tempering.training import AdamConfig, LRSchedule, RunConfig

    t_start = time.monotonic()
    out = prepare_run_dir("tic-tac-toe", config.out)
    service = recipe_service(config.base_model)
    renderer = get_renderer(
        resolve_renderer_name(config.base_model, config.renderer_name), load_tokenizer(config.base_model)
    )

    async def evaluate(sampler: SamplingClient) -> dict[Side, TicTacToeStats]:
        policy = TinkerTokenCompleter(sampler, config.max_tokens, 1.0)
        return await evaluate_against_random(
            policy,
            renderer,
            games_per_side=config.eval_games,
            seed=config.seed + 7919,
            illegal_reward=config.illegal_reward,
        )

    # 1. data: positions of random legal games
    train_path = write_random_games(out / "data" / "train.jsonl", config.sft_games, config.seed)

    # 2. SFT warm start
    sft_model = fresh_model(
        config.base_model, config.lora_rank, seed=config.seed, renderer_name=config.renderer_name
    )
    print(f"tempering recipe tic-tac-toe: SFT, {config.sft_steps} steps -> {out / 'sft'}", flush=True)
    sft = await sft_stage(
        out / "sft",
        service=service,
        model=sft_model,
        train_path=train_path,
        steps=config.sft_steps,
        batch_size=config.sft_batch_size,
        learning_rate=config.sft_learning_rate,
        max_warmup_steps=20,
        seed=config.seed,
        progress=config.progress,
    )
    before = await evaluate(await service.create_sampling_client(model_path=sft.final.sampler_path))
    print(
        f"tempering recipe tic-tac-toe: after SFT, against a random player: {_describe(before)}", flush=True
    )

    # 3. self-play RL from the SFT checkpoint
    rl_config = RLConfig(
        run=RunConfig(log_dir=str(out / "rl"), if_exists="overwrite", save_every=0, progress=config.progress),
        dataset=SelfPlayTask(
            base_model=config.base_model,
            renderer_name=config.renderer_name,
            batch_size=config.rl_batch_size,
            games_per_group=config.games_per_group,
            n_batches=config.rl_steps,
            illegal_reward=config.illegal_reward,
        ),
        model=ModelConfig(
            base_model=config.base_model, init_state=sft.final.state_path, renderer_name=config.renderer_name
        ),
        adam=AdamConfig(learning_rate=config.rl_learning_rate, beta2=0.98, schedule=LRSchedule("constant")),
        num_steps=config.rl_steps,
        max_tokens=config.max_tokens,
        temperature=1.0,
        seed=config.seed,
    )
    print(
        f"tempering recipe tic-tac-toe: self-play RL, {config.rl_steps} steps of {config.rl_batch_size} "
        f"groups x {config.games_per_group} games -> {out / 'rl'}",
        flush=True,
    )
    rl = await train(rl_config, service=service)
    after = await evaluate(await service.create_sampling_client(model_path=rl.final.sampler_path))
    print(f"tempering recipe tic-tac-toe: after RL, against a random player: {_describe(after)}", flush=True)

    # 4. outputs
    close_service(service)
    figures: dict[str, float] = {}
    for stage, stats in (("sft", before), ("rl", after)):
        for side in MARKS:
            s = stats[side]
            figures |= {
                f"{stage}_{side}_win": s.win,
                f"{stage}_{side}_draw": s.draw,
                f"{stage}_{side}_loss": s.loss,
                f"{stage}_{side}_illegal": s.illegal,
            }
    figures["wall_seconds"] = time.monotonic() - t_start
    extra = {
        "sft": {side: attrs.asdict(before[side]) for side in MARKS},
        "rl": {side: attrs.asdict(after[side]) for side in MARKS},
        "eval_games_per_side": config.eval_games,
        "sft_positions": len(train_path.read_text(encoding="utf-8").splitlines()),
        "sft_checkpoint": sft.final.sampler_path,
        "rl_checkpoint": rl.final.sampler_path,
    }
    return finish(RecipeResult("tic-tac-toe", out, figures, extra), config=config)

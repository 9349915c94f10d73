"""``tempering recipe algorithm-distillation``: source learner → learning histories → model →
in-context evaluation on held-out tasks (Laskin et al., 2022), for one ``--task``.

1. Histories: the task's source learner (bandit: Thompson sampling; Dark Room: tabular
   Q-learning; guess-number: a scripted binary search that remembers) runs ``--n-tasks``
   training tasks for ``--n-episodes`` episodes each, logged in the trajectory log format into
   ``<out>/histories`` (:mod:`tempering.ad.histories`). ``--source rl`` (guess-number): a
   tempering RL run on the token-level env instead, whose log becomes the histories
   (:mod:`tempering.recipes.algorithm_distillation_rl`); its own curve is ``source``, the
   scripted learner's on the held-out numbers ``scripted``.
2. Data: cross-episode windows of ``--window`` transitions (:class:`~tempering.ad.HistoryDataset`);
   algorithm distillation (AD) trains on windows from the whole history, expert distillation
   (ED) on windows inside each task's last ``--final-episodes`` episodes only, or with
   ``--ed-data expert`` (bandit) on an expert's histories (the best arm every pull).
3. Models (``--format rl``): the RL-format transformer, trained into ``<out>/ad-model`` and
   ``<out>/ed-model`` (run directories; ``tempering view <out>`` shows their losses).
   ``--format language``: the same windows as chat transcripts in ``<out>/language/train.jsonl``
   (``{"messages": [...]}`` rows, ``tempering sft``'s input), and ``--base-model`` fine-tuned on
   them (``--sft.*``, every assistant message trained) into ``<out>/lm-model``; expert
   distillation's windows likewise (``<out>/language/lm-ed.jsonl``, ``<out>/lm-ed-model``).
4. In-context evaluation: ``--eval-tasks`` held-out tasks, ``--eval-episodes``
   episodes, weights frozen, the context carried across episodes; AD, ED, the source learner's
   own curve and a random policy (the language models ``lm`` and ``lm_ed``, sampled, in place of
   AD and ED with ``--format language``; ``lm_invalid_actions`` and ``lm_ed_invalid_actions``
   count replies that named no action).
   ``<out>/in-context`` holds the curves (``return/<name>``
   against the episode), which ``tempering view <out>`` draws.

``summary.json`` figures, per curve ``c`` in ``ad ed source random``: ``c_first_return`` (the
mean return of episode 0), ``c_last_return`` (of the last episode), ``c_regret`` (the mean
summed shortfall from the best return over all episodes: the bandit's cumulative regret).

Shapes: ``N`` tasks, ``E`` episodes, ``T`` transitions in a window.

Example::

    tempering recipe algorithm-distillation --task bandit --out runs/ad-bandit
    result = asyncio.run(AlgorithmDistillationRecipe(task="darkroom", steps=20, out="/tmp/ad")())
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Literal

import attrs
import numpy as np

from tempering.ad import (
    ADModelConfig,
    ADTrainConfig,
    BanditFamily,
    DarkRoomFamily,
    GuessNumberFamily,
    HistoryDataset,
    LearningHistories,
    cumulative_regret,
    evaluate_in_context,
    random_curve,
    read_histories,
    source_curve,
    train_ad,
    write_chat_jsonl,
    write_curves,
    write_histories,
)
from tempering.ad.dataset import Format
from tempering.ad.evaluate import Curve
from tempering.ad.guess_env import GuessNumberEnvFamily
from tempering.ad.language import check_transcripts_fit, evaluate_language_in_context
from tempering.ad.model import Tokens
from tempering.backend import load_tokenizer
from tempering.recipes._common import RecipeConfig, RecipeResult, fresh_model, positive
from tempering.recipes.algorithm_distillation_rl import rl_source_histories
from tempering.recipes.stages import RecipeSession, RLStage, SFTStage, sft_stage, stage_field
from tempering_protocols import InContextTaskFamily, TrainOnWhat

__all__ = ["AlgorithmDistillationRecipe", "SourceName", "TaskName"]

TaskName = Literal["bandit", "darkroom", "guess-number"]
SourceName = Literal["scripted", "rl"]

_PRESETS: dict[str, dict[str, int]] = {
    # histories, windows, evaluation per task (the defaults of the flags left at None)
    "bandit": {"n_tasks": 1000, "n_episodes": 200, "window": 100, "stride": 200, "final_episodes": 100,
               "eval_tasks": 30, "eval_episodes": 100, "steps": 4000, "batch_size": 16},
    "darkroom": {"n_tasks": 260, "n_episodes": 40, "window": 80, "stride": 20, "final_episodes": 4,
                 "eval_tasks": 16, "eval_episodes": 20, "steps": 3000, "batch_size": 32},
    "guess-number": {"n_tasks": 32, "n_episodes": 8, "window": 24, "stride": 6, "final_episodes": 4,
                     "eval_tasks": 8, "eval_episodes": 8, "steps": 400, "batch_size": 16},
    # --format language: a window of 2 episodes, the most that fits the tiny model's 2048 tokens
    "darkroom/language": {"window": 40},
    # --source rl: n_tasks and n_episodes are the RL run's (numbers x games, steps), set in sizes()
    "guess-number/rl": {"window": 48, "stride": 6, "final_episodes": 8,
                        "eval_tasks": 32, "eval_episodes": 60, "steps": 400, "batch_size": 16},
}  # fmt: skip


def family_of(task: TaskName, source: SourceName = "scripted") -> InContextTaskFamily:
    """The built-in family of a task name (``source="rl"``: guess-number under the token env's
    rules, :class:`~tempering.ad.guess_env.GuessNumberEnvFamily`)."""
    if source == "rl":
        return GuessNumberEnvFamily()
    if task == "bandit":
        return BanditFamily()
    if task == "darkroom":
        return DarkRoomFamily()
    return GuessNumberFamily()


@attrs.frozen(kw_only=True)
class AlgorithmDistillationRecipe(RecipeConfig):
    """Source → histories → AD and ED models → in-context evaluation; see the module docstring.

    Example::

        result = await AlgorithmDistillationRecipe(task="bandit", out="runs/ad")()
        result.figures["ad_regret"], result.figures["source_regret"]
    """

    task: TaskName = "bandit"
    """The task (and its source learner)."""
    source: SourceName = "scripted"
    """Where the histories come from: ``scripted``, the task's source learner; ``rl``
    (``--task guess-number`` only): a tempering RL run on the token-level guess-number env
    (``--source-sft.*``, ``--source-rl.*``, ``--source-group-size``; the game under the env's
    rules: it ends at the correct guess or an invalid reply, padded to 6 turns)."""
    format: Literal["rl", "language"] = "rl"
    """``rl``: the RL-format model, trained and evaluated here; ``language``: the chat transcripts."""
    n_tasks: int | None = positive(None)
    """Training tasks whose histories are logged (default: the task's preset)."""
    n_episodes: int | None = positive(None)
    """Source episodes per training task."""
    window: int | None = positive(None)
    """Transitions per window (the model's context)."""
    stride: int | None = positive(None)
    """Transitions between window starts."""
    final_episodes: int | None = positive(None)
    """Expert distillation: windows inside each task's last this many episodes."""
    eval_tasks: int | None = positive(None)
    """Held-out tasks evaluated."""
    eval_episodes: int | None = positive(None)
    """Episodes per held-out task in context."""
    steps: int | None = positive(None)
    """Optimizer steps of each model (default: the task's preset)."""
    batch_size: int | None = positive(None)
    """Windows per step (default: the task's preset)."""
    learning_rate: float | None = positive(None)
    """Peak learning rate (AdamW, warmup then cosine; default: 2e-3 for Dark Room, else 1e-3)."""
    d_model: int = positive(64)
    """Transformer width."""
    n_layers: int = positive(2)
    """Transformer layers."""
    tokens: Tokens = "transition"
    """How transitions become tokens (``ADModelConfig.tokens``): ``transition`` (one token: the
    state with the previous action and its reward) or ``sar`` (three tokens, the old scheme)."""
    state_embedding: Literal["auto", "cell", "xy"] = "auto"
    """How the model embeds a state (``ADModelConfig.grid_width``): ``cell``, one embedding per
    state; ``xy``, a grid cell's row embedding plus its column embedding (Dark Room only);
    ``auto``: ``xy`` for Dark Room, else ``cell``."""
    previous_state: bool = False
    """With ``--tokens transition``: token ``t`` also embeds ``s_{t-1}``
    (``ADModelConfig.previous_state``)."""
    label_smoothing: float = 0.0
    """Label smoothing of the action cross-entropy."""
    dropout: float = 0.0
    """Dropout in the transformer."""
    feed_logprobs: bool = False
    """Feed the acting learner's log-probabilities to the model (``ADModelConfig.feed_logprobs``)."""
    skip_ed: bool = False
    """Leave the expert distillation baseline out."""
    ed_data: Literal["final", "expert"] = "final"
    """Expert distillation's data. ``final``: the windows inside each training task's last
    ``--final-episodes`` episodes of the source learner's history (the learner once it has
    learned). ``expert`` (bandit only): the histories of an expert that knows the task's arm
    probabilities and pulls the best arm every time (``BanditFamily(source="oracle")``), on the
    same training tasks and episodes, written to ``<out>/expert-histories``, all their windows."""
    device: str | None = None
    """``cpu`` or ``cuda``; default: the local engine's choice."""
    sft: SFTStage = stage_field(
        SFTStage(100, 8, 2e-3, train_on_what=TrainOnWhat.ALL_ASSISTANT_MESSAGES), required=True
    )
    """Language format: the SFT of ``--base-model`` on the transcripts (``--sft.steps`` or
    ``--sft-steps``, ``--sft.batch-size`` transcripts per step, ``--sft.learning-rate``: 2e-3,
    full fine-tuning of the tiny model), every assistant message trained."""

    source_sft: SFTStage = stage_field(
        SFTStage(60, 32, 1e-3, max_warmup_steps=20, train_on_what=TrainOnWhat.ALL_ASSISTANT_MESSAGES),
        required=True,
    )
    """``--source rl``: the SFT warm start of ``--base-model`` on the scripted teacher's games
    (``--source-sft.steps``, ...), before RL."""
    source_rl: RLStage = stage_field(RLStage(60, 3e-4))
    """``--source rl``: the RL run (``--source-rl.steps``: its steps, each an episode of every
    history; ``--source-rl.learning-rate``, ...; its ``batch_size`` is unused: every training
    number is played every step)."""
    source_group_size: int = positive(8)
    """``--source rl``: games per training number per RL step (``G``); each member's games, step
    after step, are one history, so there are 8 x G histories."""
    source_sft_games: int = positive(2000)
    """``--source rl``: the scripted teacher's games of the SFT warm start."""

    NAME: ClassVar[str] = "algorithm-distillation"

    def validate(self) -> None:
        if self.source == "rl":
            if self.task != "guess-number":
                raise ValueError(
                    f"AlgorithmDistillationRecipe: --source rl runs RL on the guess-number env, but --task "
                    f"is {self.task}; use --task guess-number or --source scripted"
                )
            if self.n_tasks is not None or self.n_episodes is not None:
                raise ValueError(
                    "AlgorithmDistillationRecipe: with --source rl the histories are the RL run's "
                    "(8 numbers x --source-group-size tasks, --source-rl.steps episodes); leave "
                    "--n-tasks and --n-episodes unset and set those instead"
                )
            if self.eval_episodes is not None and self.eval_episodes > self.source_rl.steps:
                raise ValueError(
                    f"AlgorithmDistillationRecipe: --eval-episodes {self.eval_episodes} is more than the "
                    f"RL source's {self.source_rl.steps} steps (--source-rl.steps), so its curve would be "
                    "shorter than the models'; lower --eval-episodes or raise --source-rl.steps"
                )
        if self.ed_data == "expert" and self.task != "bandit":
            raise ValueError(
                f"AlgorithmDistillationRecipe: --ed-data expert has an expert for the bandit task only, "
                f"but --task is {self.task}; use --ed-data final"
            )
        if self.state_embedding == "xy" and self.task != "darkroom":
            raise ValueError(
                f"AlgorithmDistillationRecipe: --state-embedding xy needs a grid task (darkroom), but "
                f"--task is {self.task}; use --state-embedding cell or auto"
            )

    def peak_learning_rate(self) -> float:
        """``--learning-rate``, else the task's: 2e-3 for Dark Room (measured better than 1e-3 at
        3000 steps), 1e-3 for the others."""
        if self.learning_rate is not None:
            return self.learning_rate
        return 2e-3 if self.task == "darkroom" else 1e-3

    def sizes(self) -> dict[str, int]:
        """The history, window and evaluation sizes: the flags, else the task's preset (with
        ``--source rl``, the RL run's tasks and episodes; Dark Room with ``--format language``,
        a window of 40 transitions, whose transcript fits the tiny model's context)."""
        if self.source == "rl":
            preset = _PRESETS["guess-number/rl"]
            z = {k: v if (v := getattr(self, k)) is not None else d for k, d in preset.items()}
            n_numbers = len(GuessNumberEnvFamily().numbers(held_out=False))
            z["eval_episodes"] = min(z["eval_episodes"], self.source_rl.steps)
            return z | {"n_tasks": n_numbers * self.source_group_size, "n_episodes": self.source_rl.steps}
        preset = _PRESETS[self.task]
        if self.format == "language":
            preset = preset | _PRESETS.get(f"{self.task}/language", {})
        return {k: v if (v := getattr(self, k)) is not None else d for k, d in preset.items()}

    async def run(self, s: RecipeSession) -> RecipeResult:
        return await _run(self, s)


async def _run(config: AlgorithmDistillationRecipe, s: RecipeSession) -> RecipeResult:
    family = family_of(config.task, config.source)
    z = config.sizes()
    window = z["window"]
    if window > z["n_episodes"] * family.horizon:
        raise ValueError(
            f"AlgorithmDistillationRecipe: --window {window} is longer than a task's history "
            f"({z['n_episodes']} episodes of {family.horizon} steps); raise --n-episodes or lower --window"
        )
    s.say(
        f"{config.task}: {config.source} source histories, {z['n_tasks']} tasks x {z['n_episodes']} episodes"
    )
    if isinstance(family, GuessNumberEnvFamily):
        hist_dir = await rl_source_histories(
            s, family, model=fresh_model(config), sft=config.source_sft,
            rl=config.source_rl.for_model(config.base_model), group_size=config.source_group_size,
            sft_games=config.source_sft_games, seed=config.seed,
        )  # fmt: skip
    else:
        hist_dir = write_histories(
            family,
            s.run_dir / "histories",
            n_tasks=z["n_tasks"],
            n_episodes=z["n_episodes"],
            seed=config.seed,
        )
    histories = read_histories(hist_dir)
    figures: dict[str, float] = {"source_train_last_return": float(histories.returns_NE()[:, -1].mean())}
    extra: dict[str, Any] = {
        "task": config.task,
        "source": config.source,
        "format": config.format,
        "sizes": z,
    }
    ad_data = HistoryDataset(histories, window=window, stride=z["stride"])
    seeds = [config.seed * 1000 + i for i in range(z["eval_tasks"])]
    if config.format == "language":
        lm, lm_figures, lm_data = await _language(config, s, family, histories, seeds)
        return _finish(
            config, s, family, seeds, lm, figures | lm_figures, extra | {"language_data": lm_data}, histories
        )

    model_config = ADModelConfig(
        n_states=family.n_states, n_actions=family.n_actions, context=window,
        grid_width=_grid_width(config, family),
        d_model=config.d_model, n_layers=config.n_layers, feed_logprobs=config.feed_logprobs,
        tokens=config.tokens, previous_state=config.previous_state,
        label_smoothing=config.label_smoothing, dropout=config.dropout,
    )  # fmt: skip
    datasets = {"ad": ad_data}
    if not config.skip_ed:
        datasets["ed"] = _ed_windows(config, s, family, histories)
    curves: dict[str, Curve] = {}
    for name, data in datasets.items():
        s.say(
            f"{name} model: {len(data)} windows of {window}, {z['steps']} steps "
            f"-> {s.run_dir / (name + '-model')}"
        )
        train = ADTrainConfig(
            log_dir=str(s.run_dir / f"{name}-model"), model=model_config, steps=z["steps"],
            batch_size=z["batch_size"], learning_rate=config.peak_learning_rate(), seed=config.seed,
            device=config.device, if_exists="overwrite", data=f"{hist_dir} ({name})",
            save_every=max(1, z["steps"] // 4), log_every=10,
        )  # fmt: skip
        model = train_ad(
            train, data, n_states=family.n_states, n_actions=family.n_actions, progress=s.progress
        )
        curves[name] = evaluate_in_context(model, family, seeds, z["eval_episodes"], seed=config.seed)
        figures[f"{name}_windows"] = float(len(data))
    return _finish(config, s, family, seeds, curves, figures, extra, histories)


def _ed_windows(
    config: AlgorithmDistillationRecipe,
    s: RecipeSession,
    family: InContextTaskFamily,
    histories: LearningHistories,
    fmt: Format = "rl",
) -> HistoryDataset:
    """Expert distillation's windows (``--ed-data``): the last ``--final-episodes`` episodes of
    each task's history, or every window of the expert's histories on the same training tasks."""
    z = config.sizes()
    if config.ed_data == "final":
        return HistoryDataset(
            histories, window=z["window"], stride=z["stride"], episodes="final",
            final_episodes=z["final_episodes"], fmt=fmt, family=family,
        )  # fmt: skip
    assert isinstance(family, BanditFamily)  # validate() allows --ed-data expert for bandits only
    expert_dir = s.run_dir / "expert-histories"
    s.say(f"expert histories (the best arm every pull), {z['n_tasks']} tasks -> {expert_dir}")
    expert = read_histories(
        write_histories(
            attrs.evolve(family, source="oracle"), expert_dir, n_tasks=z["n_tasks"],
            n_episodes=z["n_episodes"], seed=config.seed,
        )
    )  # fmt: skip
    return HistoryDataset(expert, window=z["window"], stride=z["stride"], fmt=fmt, family=family)


def _grid_width(config: AlgorithmDistillationRecipe, family: InContextTaskFamily) -> int:
    """``ADModelConfig.grid_width`` of ``--state-embedding``: the grid's width for ``xy``, else 0."""
    if config.state_embedding == "cell" or not isinstance(family, DarkRoomFamily):
        return 0
    return family.size


def _finish(
    config: AlgorithmDistillationRecipe,
    s: RecipeSession,
    family: InContextTaskFamily,
    seeds: list[int],
    curves: dict[str, Curve],
    figures: dict[str, float],
    extra: dict[str, Any],
    histories: LearningHistories,
) -> RecipeResult:
    """The learned ``curves`` beside the source learner's and a random policy's on the same
    held-out tasks, their figures, the curves written, ``summary.json``. With ``--source rl``
    the source's curve is the RL run's own (its return at each step on its training numbers,
    from ``histories``: the RL policy never played the held-out ones), and the scripted learner
    on the held-out tasks is the curve ``scripted``."""
    episodes = config.sizes()["eval_episodes"]
    baselines = {
        "source": source_curve(family, seeds, episodes),
        "random": random_curve(family, seeds, episodes, seed=config.seed),
    }
    if config.source == "rl":
        baselines = {
            "source": histories.returns_NE()[:, :episodes],
            "scripted": baselines["source"],
            "random": baselines["random"],
        }
    curves = curves | baselines
    figures["optimal_return"] = float(np.mean([family.task(x, True).optimal_return() for x in seeds]))
    for name, c in curves.items():
        figures[f"{name}_first_return"] = float(c[:, 0].mean())
        figures[f"{name}_last_return"] = float(c[:, -1].mean())
        if c.shape[0] == len(seeds):
            figures[f"{name}_regret"] = float(cumulative_regret(family, seeds, c).mean())
        else:  # the RL source on its own tasks; every task of GuessNumberEnvFamily has the best return 1
            figures[f"{name}_regret"] = float((figures["optimal_return"] - c).sum(axis=1).mean())
    curve_dir = write_curves(s.run_dir / "in-context", curves, config)
    (s.run_dir / "in-context" / "curves.json").write_text(
        json.dumps({k: v.mean(axis=0).tolist() for k, v in curves.items()}) + "\n"
    )
    extra["curves"] = str(curve_dir)
    return s.finish(figures, extra)


async def _language(
    config: AlgorithmDistillationRecipe,
    s: RecipeSession,
    family: InContextTaskFamily,
    histories: LearningHistories,
    seeds: list[int],
) -> tuple[dict[str, Curve], dict[str, float], str]:
    """The language format: the windows as chat transcripts, SFT of ``--base-model`` on them,
    then the same in-context evaluation by sampling; and the same for expert distillation on its
    windows (``--ed-data``; ``lm_ed``) unless ``--skip-ed``.
    Returns the ``lm`` (and ``lm_ed``) curves, their figures (``<name>_windows``,
    ``<name>_invalid_actions``) and the AD transcripts' path."""
    z = config.sizes()
    datasets = {
        "lm": HistoryDataset(histories, window=z["window"], stride=z["stride"], fmt="language", family=family)
    }
    if not config.skip_ed:
        datasets["lm_ed"] = _ed_windows(config, s, family, histories, fmt="language")
    context = getattr(load_tokenizer(config.base_model), "model_max_length", None)
    if isinstance(context, int) and context < 1 << 24:  # tokenizers without a length give a huge one
        for lang in datasets.values():
            check_transcripts_fit(lang, config.renderer(), context, model=config.base_model)
    curves: dict[str, Curve] = {}
    figures: dict[str, float] = {}
    paths: dict[str, str] = {}
    for name, lang in datasets.items():
        stem = name.replace("_", "-")
        path = write_chat_jsonl(lang, s.run_dir / "language" / f"{'train' if name == 'lm' else stem}.jsonl")
        s.say(
            f"{name} model: SFT of {config.base_model} on {len(lang)} transcripts ({path}), "
            f"{config.sft.steps} steps -> {s.run_dir / (stem + '-model')}"
        )
        sft = await sft_stage(
            s, f"{stem}-model", config.sft, model=fresh_model(config), train_path=path, seed=config.seed
        )
        sampler = await s.sampler(sft.final.sampler_path)
        curves[name], invalid = await evaluate_language_in_context(
            sampler,
            config.renderer(),
            family,
            seeds,
            z["eval_episodes"],
            window=z["window"],
            seed=config.seed,
        )
        figures |= {f"{name}_windows": float(len(lang)), f"{name}_invalid_actions": float(invalid)}
        paths[name] = str(path)
    return curves, figures, paths["lm"]

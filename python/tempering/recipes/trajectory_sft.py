"""``tempering recipe trajectory-sft``: an RL run's logged trajectories, distilled into a fresh
model by supervised fine-tuning, evaluated on the demo's held-out problems.

1. The teacher's log: ``--log-dir`` names an RL run directory written with
   ``RLConfig(log_trajectories=True)`` (the demo's ``<demo out>/rl`` once the demo logs); without
   it the recipe first runs the demo's pipeline itself with the ``--teacher-sft.*`` and
   ``--teacher-rl.*`` stages (SFT warm start on arithmetic, then RL with the exact-answer
   reward, trajectories logged; the old flat ``--teacher-sft-steps``, ``--teacher-rl-steps``,
   ``--teacher-rl-batch-size``, ``--teacher-learning-rate`` still work) into
   ``<out>/teacher-sft`` and ``<out>/teacher-rl``.
2. The data (:mod:`tempering.rl.trajectory_data`), by ``--mode``:

   - ``rejection`` (default): episodes whose total reward is at least ``--min-reward``, without
     duplicates, the ``--top-k`` best of each prompt (rejection-sampling fine-tuning);
   - ``history``: learning histories, each prompt's episodes in training order, cut into
     windows of ``--episodes-per-history``, with each attempt's reward shown between attempts
     (algorithm distillation).

   Tokens are the ground truth: each example is the logged observation and action tokens, with
   weight 1 on the action tokens.
3. The student: a *fresh* ``--base-model`` (the tiny model from random weights, full fine-tuning,
   on the local engine) trained with :func:`tempering.sft.train_supervised` for ``--steps``
   steps into ``<out>/student``.
4. Evaluation: held-out accuracy of the student on the demo's held-out split
   (:func:`~tempering.envs.arithmetic.split_problems` with the same ``--seed`` and
   ``--n-test``; never trained on by the teacher or the student), ``--eval-samples`` answers per
   problem sampled at temperature 1, and greedy; the teacher's final weights are evaluated the
   same way when they can be loaded, else its ``summary.json`` figure is reported.

``<out>/summary.json``: ``episodes_logged``, ``episodes_kept``, ``examples``,
``student_accuracy``, ``student_greedy_accuracy``, ``teacher_accuracy`` and
``teacher_greedy_accuracy`` (when known), ``wall_seconds``, the accuracies' 95% Wilson intervals
(``ci95``), and the config.

Shapes: ``P`` problems per RL step, ``G`` samples per problem; ``E`` logged episodes.

Example::

    tempering recipe trajectory-sft --log-dir runs/demo-20250101-120000/rl --out runs/tsft
    tempering recipe trajectory-sft --mode history --out runs/tsft-history
    result = asyncio.run(TrajectorySFTRecipe(out="/tmp/tsft", teacher_sft=DemoSFT(steps=40))())
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, ClassVar, Literal, cast

import attrs

from tempering.backend import ModelConfig, load_tokenizer
from tempering.envs.arithmetic import ArithmeticProblems, split_problems, write_chat_jsonl
from tempering.evals.accuracy import AccuracyEvaluator
from tempering.model_info import packaged_model
from tempering.recipes._common import RecipeConfig, RecipeResult, fresh_model, positive
from tempering.recipes.demo import PRESETS, DemoConfig, DemoModel, DemoRL, DemoSFT
from tempering.recipes.stages import RecipeSession, RLStage, SFTStage, rl_stage, sft_stage, stage_field
from tempering.rl.logged_runs import check_dataset_split
from tempering.rl.trajectories import episodes_table, read_trajectories
from tempering.rl.trajectory_data import (
    learning_history_examples,
    select_episodes,
    supervised_dataset,
    trajectory_examples,
)
from tempering.sft import train_supervised
from tempering.training import RunDir
from tempering_protocols import SamplingClient

__all__ = ["Mode", "TrajectorySFTRecipe", "teacher_demo", "teacher_stages"]

Mode = Literal["rejection", "history"]

_DEMO = DemoConfig(model="tiny")
_SIZES = _DEMO.sizes()
"""The tiny demo's sizes: the flags' defaults."""
assert _SIZES.rl.learning_rate is not None  # the presets' stages are complete
_TEACHER_RL_RATE: float = _SIZES.rl.learning_rate


def teacher_demo(base_model: str) -> DemoConfig:
    """The demo whose stages the self-run teacher repeats (every teacher stage setting left
    unset, e.g. the SFT batch size, learning rate and weight decay, and the advantage
    normalisation): the demo preset of
    ``base_model`` (``tempering.recipes.demo.PRESETS``, e.g. the real model's for SmolLM2 under
    either of its names), else the tiny model's.

    Example::

        teacher_demo("smollm2-135m-instruct").sizes().sft.batch_size   # 32, the smollm2 preset's
    """
    packaged = packaged_model(base_model)
    names = {base_model} | ({packaged.name, packaged.hub_name} if packaged is not None else set())
    for name, sizes in PRESETS.items():
        if sizes.base_model in names:
            return DemoConfig(model=cast(DemoModel, name))
    return _DEMO


def teacher_stages(config: TrajectorySFTRecipe) -> tuple[SFTStage, RLStage]:
    """The self-run teacher's complete SFT and RL stages: the base model's demo preset
    (:func:`teacher_demo`) under every setting ``config.teacher_sft`` / ``config.teacher_rl``
    gives. SFT evaluates every 10 steps unless given (``RunConfig``'s default, as this stage
    always had; it has no evaluator); RL evaluates the held-out split at the preset's checkpoint
    period unless given, with no periodic checkpoints.

    Example::

        sft, rl = teacher_stages(TrajectorySFTRecipe())   # SFTStage(600, 64, 2e-3, ...), RLStage(80, ...)
    """
    sizes = teacher_demo(config.base_model).sizes()
    sft = config.teacher_sft.over(attrs.evolve(sizes.sft, eval_every=10))
    rl = config.teacher_rl.over(sizes.rl)
    return sft, attrs.evolve(rl, eval_every=rl.save_every, save_every=0)


@attrs.frozen(kw_only=True)
class TrajectorySFTRecipe(RecipeConfig):
    """Logged RL trajectories → SFT of a fresh model → held-out accuracy; see the module
    docstring. ``await recipe()`` runs it.

    Example::

        result = await TrajectorySFTRecipe(log_dir="runs/demo/rl", out="runs/tsft")()
        result.figures["student_accuracy"], result.figures["episodes_kept"]
    """

    log_dir: str | None = None
    """An RL run directory with a trajectory log (``RLConfig(log_trajectories=True)``); default:
    run the teacher here first."""
    mode: Mode = "rejection"
    """``rejection``: the best episodes; ``history``: learning histories (algorithm distillation)."""
    min_reward: float = 1.0
    """Rejection sampling: keep episodes whose total reward is at least this."""
    top_k: int | None = 1
    """Rejection sampling: at most this many episodes per prompt (the best); ``None``: all."""
    dedup: bool = True
    """Rejection sampling: one episode per (prompt, action tokens)."""
    episodes_per_history: int = 4
    """Learning histories: episodes per example."""
    n_test: int = 200
    """Held-out problems (the split must match the logged run's)."""
    eval_samples: int = 4
    """Answers sampled per held-out problem for the accuracy."""
    sft: SFTStage = stage_field(
        SFTStage(
            _SIZES.sft.steps,
            _SIZES.sft.batch_size,
            _SIZES.sft.learning_rate,
            weight_decay=_SIZES.sft.weight_decay,
        ),
        flat="",
        required=True,
    )
    """The student's SFT (default: the demo's SFT stage; ``--sft.steps``, or ``--steps`` as
    before, ``--batch-size``, ``--learning-rate``, ``--weight-decay``)."""
    teacher_sft: DemoSFT = stage_field(DemoSFT(steps=_SIZES.sft.steps))
    """Without ``--log-dir``: the teacher's SFT warm start, trained like the demo's
    (``--teacher-sft.steps``, or ``--teacher-sft-steps`` as before; default: the tiny demo's
    steps). Every setting left unset (``--teacher-sft.batch-size``, ``.learning-rate``,
    ``.weight-decay``) takes the base model's demo preset (:func:`teacher_demo`); ``eval_every``
    unset: 10."""
    teacher_rl: DemoRL = stage_field(
        DemoRL(steps=_SIZES.rl.steps, batch_size=_SIZES.rl.batch_size, learning_rate=_TEACHER_RL_RATE),
        renamed={"teacher-learning-rate": "learning_rate"},
    )
    """Without ``--log-dir``: the teacher's RL, trajectories logged (``--teacher-rl.steps``,
    ``--teacher-rl.batch-size``: problems per step, ``--teacher-rl.learning-rate``, or the flat
    ``--teacher-rl-steps``, ``--teacher-rl-batch-size``, ``--teacher-learning-rate`` as before;
    defaults: the tiny demo's). Settings left unset take the base model's demo preset; its
    held-out evaluation runs every ``eval_every`` steps (unset: the preset's checkpoint period)."""
    teacher_group_size: int = positive(_SIZES.group_size)
    """Without ``--log-dir``: samples per problem in the teacher's RL (``G``)."""

    NAME: ClassVar[str] = "trajectory-sft"

    async def __call__(self) -> RecipeResult:
        if self.log_dir is not None:
            check_dataset_split(self.log_dir, seed=self.seed, n_test=self.n_test)
        return await super().__call__()

    async def run(self, s: RecipeSession) -> RecipeResult:
        return await _run(self, s)


async def _run(config: TrajectorySFTRecipe, s: RecipeSession) -> RecipeResult:
    tokenizer = load_tokenizer(config.base_model)
    renderer = config.renderer()
    train_problems, test_problems = split_problems(seed=config.seed, n_test=config.n_test)
    figures: dict[str, float] = {}
    ci95: dict[str, tuple[float, float]] = {}
    extra: dict[str, Any] = {"mode": config.mode}

    evaluator = AccuracyEvaluator(
        test_problems, renderer, tokenizer, num_samples=config.eval_samples, seed=config.seed
    )

    async def evaluate(name: str, sampler: SamplingClient) -> None:
        await evaluator(sampler)
        figures.update(evaluator.records[-1].figures(name))
        ci95.update(evaluator.records[-1].intervals(name))

    # 1. the teacher's trajectory log
    if config.log_dir is None:
        train_path = write_chat_jsonl(train_problems, s.run_dir / "data" / "train.jsonl")
        demo = teacher_demo(config.base_model)
        stage, rl = teacher_stages(config)
        s.say(f"teacher SFT, {stage.steps} steps -> {s.run_dir}")
        sft = await sft_stage(
            s, "teacher-sft", stage, model=fresh_model(config), train_path=train_path, seed=config.seed
        )
        task = ArithmeticProblems(
            base_model=config.base_model, renderer_name=config.renderer_name, seed=config.seed,
            n_test=config.n_test, batch_size=rl.batch_size,
            group_size=config.teacher_group_size, test_group_size=config.eval_samples,
        )  # fmt: skip
        model = ModelConfig(
            base_model=config.base_model, init_state=sft.final.state_path, renderer_name=config.renderer_name
        )
        s.say(f"teacher RL, {rl.steps} steps, logged")
        await rl_stage(
            s, "teacher-rl", rl, dataset=task, model=model, max_tokens=8,
            normalize_advantages=demo.normalize_advantages, log_trajectories=True,
        )  # fmt: skip
        log_dir = s.run_dir / "teacher-rl"
    else:
        log_dir = Path(config.log_dir)
    extra["log_dir"] = str(log_dir)

    # 2. the teacher's accuracy: its final weights, evaluated here, else its recorded figure
    final = [r.sampler_path for r in RunDir(log_dir).checkpoints() if r.final and r.sampler_path]
    teacher_path = final[-1] if final else None
    try:
        teacher = await s.sampler(teacher_path) if teacher_path else None
    except (FileNotFoundError, ValueError):  # e.g. another machine's checkpoint store
        teacher = None
    if teacher is not None:
        await evaluate("teacher", teacher)
    else:
        figures.update(_recorded(log_dir))

    # 3. the data
    table = read_trajectories(log_dir)
    episodes = episodes_table(table)
    figures["episodes_logged"] = float(episodes.num_rows)
    if config.mode == "rejection":
        kept = select_episodes(
            table, min_reward=config.min_reward, top_k_per_prompt=config.top_k, dedup=config.dedup
        )
        figures["episodes_kept"] = float(episodes_table(kept).num_rows)
        examples = trajectory_examples(kept)
    else:
        figures["episodes_kept"] = float(episodes.num_rows)
        examples = learning_history_examples(
            table, tokenizer, episodes_per_history=config.episodes_per_history
        )
    figures["examples"] = float(len(examples))
    if not examples:
        raise ValueError(
            f"{log_dir}: no episode passed the filters ({int(figures['episodes_logged'])} logged, "
            f"min reward {config.min_reward}); lower --min-reward or train the teacher longer"
        )
    stage = config.sft
    train_ds = supervised_dataset(examples, batch_size=stage.batch_size, seed=config.seed)

    # 4. the student: a fresh model, SFT on the examples
    s.say(
        f"student SFT on {len(examples)} examples ({config.mode}), {stage.steps} steps "
        f"-> {s.run_dir / 'student'}"
    )
    student = await train_supervised(
        config,
        run=s.run_config("student"),
        model=fresh_model(config),
        adam=stage.adam(),
        train=train_ds,
        num_epochs=math.ceil(stage.steps / len(train_ds)),
        max_steps=stage.steps,
        service=s.service,
    )
    extra["student_checkpoint"] = student.final.sampler_path
    await evaluate("student", await s.sampler(student.final.sampler_path))
    return s.finish(figures, extra, ci95=ci95)


def _recorded(log_dir: Path) -> dict[str, float]:
    """The teacher's accuracy as the demo's ``summary.json`` beside the log records it (``rl_…``)."""
    summary = log_dir.parent / "summary.json"
    if not summary.is_file():
        return {}
    recorded: dict[str, Any] = json.loads(summary.read_text())
    return {
        f"teacher_{k}": float(recorded[f"rl_{k}"])
        for k in ("accuracy", "greedy_accuracy")
        if isinstance(recorded.get(f"rl_{k}"), int | float)
    }

"""``tempering recipe distill``: on-policy distillation from a teacher checkpoint into a student.

The student samples answers to the arithmetic prompts; the teacher scores the student's own
tokens; the per-token reverse KL estimate ``logp_student(x_t) - logp_teacher(x_t)`` (``x``
sampled from the student) is subtracted from each token's advantage, so the RL loop's
importance-sampling loss lowers the reverse KL (the Tinker Cookbook's on-policy distillation).
By default the task reward is off (``reward_coef`` 0): the distillation stage uses no answers,
only the teacher's logprobs; ``--reward-coef 1`` adds the exact-match reward.

Stages (each a run directory inside ``out``, written by the library's trainers):

1. ``data/``: the demo's split of two-digit ``a+b=`` / ``a-b=`` problems
   (:func:`~tempering.envs.arithmetic.split_problems`, ``n_test`` held out), as chat JSONL.
2. ``teacher/``: only when ``--teacher`` is not given: SFT of ``teacher_model`` (default
   ``base_model``) on the whole training split (``teacher_sft``, :func:`tempering.sft.train_supervised`).
   With ``--teacher`` (a run directory with ``checkpoints.jsonl``, a sampler-weights path or a
   ``save_state`` path) that checkpoint is the teacher and this stage is skipped.
3. ``student-model/`` and ``student-warmup/``: the student. On the local engine with the tiny
   model and full fine-tuning it is a fresh tiny model initialised from ``student_seed`` (not
   the teacher's initialisation); elsewhere a fresh LoRA adapter (seed ``student_seed``) on
   ``base_model``, or the weights at ``--student-init-state``. Then, unless ``warmup.steps`` is
   0, a short SFT warm start on the first ``warmup_problems`` training problems only: a
   random-init student emits bytes that are not even answers, so the teacher's logprobs on them
   say little; the warm start teaches the answer format and little arithmetic (its accuracy is
   reported as "student before").
4. ``distill/``: :func:`tempering.rl.train` with ``RLConfig.distill_teacher`` (the teacher's
   sampler weights) from the student, ``distill.steps`` steps of ``distill.batch_size`` training
   prompts × ``group_size`` samples; metric ``distill/reverse_kl`` per step.
5. Held-out figures of teacher, student before and student after: accuracy sampled at T=1
   (``eval_samples`` answers per problem) and greedy
   (:class:`~tempering.evals.accuracy.AccuracyEvaluator`), and the held-out reverse KL
   (:func:`~tempering.evals.reverse_kl.heldout_reverse_kl`: student samples at T=1 on the
   held-out prompts, teacher logprobs, mean per token). ``summary.json`` holds them, the
   accuracies' 95% Wilson intervals (``ci95``), ``reverse_kl_start`` / ``reverse_kl_end`` (the training metric
   at the first step and the mean of the last ``min(3, distill.steps)`` steps) and the paths.

Teacher and student must share a tokenizer (the KL is per token).

Shapes: ``P`` prompts per distillation step (``distill.batch_size``), ``G`` samples per prompt
(``group_size``), ``T`` tokens of one sampled answer.

Example::

    tempering recipe distill                              # trains a teacher, then distils
    tempering recipe distill --teacher runs/demo-20250101-120000/rl --out runs/distill
    teacher = SFTStage(300, 64, 2e-3, weight_decay=0.1)              # --teacher-sft.steps 300
    result = asyncio.run(OnPolicyDistillRecipe(out="/tmp/distill", teacher_sft=teacher)())
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import attrs
import numpy as np

from tempering.backend import ModelConfig, load_tokenizer
from tempering.envs.arithmetic import ArithmeticProblems, split_problems, write_chat_jsonl
from tempering.evals.accuracy import AccuracyEvaluator
from tempering.evals.reverse_kl import heldout_reverse_kl
from tempering.recipes._common import (
    RecipeConfig,
    RecipeResult,
    default_lora_rank,
    fresh_model,
    non_negative,
    positive,
    refuse_unserved_model,
    trains_tiny_from_scratch,
)
from tempering.recipes.stages import RecipeSession, RLStage, SFTStage, rl_stage, sft_stage, stage_field
from tempering.training.checkpoints import open_sampler, sampler_weights
from tempering_protocols import SamplingClient

__all__ = ["OnPolicyDistillRecipe"]


@attrs.frozen(kw_only=True)
class OnPolicyDistillRecipe(RecipeConfig):
    """On-policy distillation on arithmetic; ``await recipe()`` runs it (module docstring).

    The defaults train a teacher (700 SFT steps on the whole training split), warm-start a
    fresh student on 1,000 problems (600 steps) and distil for 40 steps; docs/recipes/distill.md
    has the measured figures. The three stages are nested configs (``teacher_sft``, ``warmup``,
    ``distill``: ``--teacher-sft.steps``, ``--warmup.steps``, ``--distill.steps``; the flat
    ``--teacher-steps``, ``--warmup-steps``, ``--distill-steps`` as before).

    Example::

        recipe = OnPolicyDistillRecipe(out="/tmp/d", teacher="runs/demo-x/rl", distill=RLStage(20, 1e-4))
        result = await recipe()
        result.figures["student_after_accuracy"]
    """

    teacher_model: str | None = None
    """The teacher's base model when the recipe trains the teacher (default ``base_model``);
    with ``--teacher`` it is recorded only. Must share ``base_model``'s tokenizer."""
    teacher: str | None = None
    """The teacher: a run directory (its last ``checkpoints.jsonl`` entry), a sampler-weights
    path or a ``save_state`` path. ``None``: train one by SFT (stage 2)."""
    student_init_state: str | None = None
    """Start the student from these ``save_state`` weights instead of a fresh model."""
    student_seed: int = 1
    """Initialises the fresh student (tiny model weights, or its LoRA adapter)."""
    n_test: int = 200
    """Held-out problems (never trained on, by any stage)."""
    eval_samples: int = positive(4)
    """Answers sampled per held-out problem for the accuracy and the held-out reverse KL."""
    teacher_sft: SFTStage = stage_field(SFTStage(700, 64, 2e-3, weight_decay=0.1), flat="teacher")
    """The teacher's SFT on the whole training split, when the recipe trains it (without
    ``--teacher``): ``--teacher-sft.steps`` (or ``--teacher-steps``), ``--teacher-sft.batch-size``,
    ``--teacher-sft.learning-rate``, ``--teacher-sft.weight-decay`` (0.1, as in the demo: it
    learns the carry sooner)."""
    warmup_problems: int = non_negative(1000)
    """Training problems the student's warm start sees (its only labelled data)."""
    warmup: SFTStage = stage_field(SFTStage(600, 32, 1e-3))
    """The student's SFT warm start (``--warmup.steps`` or ``--warmup-steps``; 0: none, distil
    from the fresh student); its batch is at most ``warmup_problems``. No weight decay: 0.1 was
    worse on its 1,000 problems (9.5% held-out vs 15.5%)."""
    distill: RLStage = stage_field(
        RLStage(40, 1e-4, batch_size=16),
        renamed={"batch-size": "batch_size", "learning-rate": "learning_rate"},
    )
    """On-policy distillation (``--distill.steps`` or ``--distill-steps``): ``batch_size``
    training prompts per step (``P``; ``--distill.batch-size`` or ``--batch-size``), Adam at
    ``learning_rate`` (constant; ``--learning-rate`` too)."""
    group_size: int = positive(8)
    """Student samples per prompt (``G``)."""
    distill_coef: float = positive(1.0)
    """Weight of the per-token reverse KL in the advantage."""
    reward_coef: float = 0.0
    """Weight of the exact-match task reward (0: pure distillation, no answers used)."""
    max_tokens: int = positive(8)
    """Tokens per sampled answer (the answers are at most 4 tokens and the end of turn)."""

    NAME: ClassVar[str] = "distill"

    def validate(self) -> None:
        for name, value, needed, why in (
            ("teacher_sft.steps", self.teacher_sft.steps, self.teacher is None,
             "no --teacher is given, so the recipe trains one"),
            ("warmup_problems", self.warmup_problems, self.warmup.steps > 0, "--warmup.steps is > 0"),
        ):  # fmt: skip
            if needed and value < 1:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"OnPolicyDistillRecipe.{name} ({flag}) must be > 0 when {why}, got {value}")

    async def __call__(self) -> RecipeResult:
        out = Path(self.out).resolve() if self.out is not None else None
        for flag, given in (("--teacher", self.teacher), ("--student-init-state", self.student_init_state)):
            if (
                out is not None
                and given is not None
                and "://" not in given
                and Path(given).resolve().is_relative_to(out)
            ):
                raise ValueError(f"{flag} {given!r} is inside --out {self.out!r}, which the recipe replaces")
        if self.teacher is None:
            refuse_unserved_model(self.teacher_base(), "--teacher-model", alternative="--teacher")
        return await super().__call__()

    def teacher_base(self) -> str:
        """The teacher's base model: ``teacher_model``, else ``base_model``."""
        return self.teacher_model if self.teacher_model is not None else self.base_model

    async def run(self, s: RecipeSession) -> RecipeResult:
        return await _stages(self, s, self.teacher_base())


async def _stages(config: OnPolicyDistillRecipe, s: RecipeSession, teacher_base: str) -> RecipeResult:
    rank = default_lora_rank(config.base_model, config.lora_rank)
    tokenizer = load_tokenizer(config.base_model)
    renderer = config.renderer()
    extra: dict[str, Any] = {}

    # 1. data
    train_problems, test_problems = split_problems(seed=config.seed, n_test=config.n_test)
    train_path = write_chat_jsonl(train_problems, s.run_dir / "data" / "train.jsonl")
    test_path = write_chat_jsonl(test_problems, s.run_dir / "data" / "test.jsonl")

    async def sft(name: str, model: ModelConfig, data: Path, stage: SFTStage) -> tuple[str, str]:
        """SFT run ``run_dir/name``; returns its final ``(state_path, sampler_path)``."""
        s.say(f"{name}, {stage.steps} SFT steps of {stage.batch_size} -> {s.run_dir / name}")
        result = await sft_stage(s, name, stage, model=model, train_path=data, seed=config.seed)
        assert result.final.sampler_path is not None  # the final checkpoint always has one
        return result.final.state_path, result.final.sampler_path

    # 2. the teacher
    if config.teacher is not None:
        teacher_path = await sampler_weights(s.service, config.teacher, "--teacher")
        extra["teacher_source"] = "given"
    else:
        teacher_model = fresh_model(config, base_model=teacher_base)
        _, teacher_path = await sft("teacher", teacher_model, train_path, config.teacher_sft)
        extra |= {"teacher_source": "trained", "teacher_run_dir": str(s.run_dir / "teacher")}
    extra["teacher_sampler_path"] = teacher_path
    teacher = await open_sampler(s.service, teacher_path, "--teacher")

    # 3. the student
    student_base = config.base_model
    student_state = config.student_init_state
    if student_state is not None:
        extra["student_init"] = f"state {student_state}"
    elif trains_tiny_from_scratch(config.base_model) and rank == 0:
        # A fresh tiny model of its own initialisation (the built-in one is seed 0's).
        from tempering.local.tiny import build_tiny_model

        student_base = str(build_tiny_model(s.run_dir / "student-model", seed=config.student_seed))
        extra["student_init"] = f"fresh tiny model, seed {config.student_seed}"
    else:
        extra["student_init"] = f"fresh LoRA rank {rank} on {student_base}, seed {config.student_seed}"
    student_model = attrs.evolve(
        fresh_model(config, seed=config.student_seed, base_model=student_base),
        lora_rank=rank,
        init_state=student_state,
    )
    if config.warmup.steps > 0:
        warm = train_problems[: config.warmup_problems]
        warm_path = write_chat_jsonl(warm, s.run_dir / "data" / "warmup.jsonl")
        stage = attrs.evolve(config.warmup, batch_size=min(config.warmup.batch_size, len(warm)))
        student_state, before_path = await sft("student-warmup", student_model, warm_path, stage)
        student_model = attrs.evolve(student_model, init_state=student_state)
        student_before = await open_sampler(s.service, before_path, "student warm start")
        extra["student_warmup_run_dir"] = str(s.run_dir / "student-warmup")
    elif student_state is not None:
        before_path = await sampler_weights(s.service, student_state, "--student-init-state")
        student_before = await open_sampler(s.service, before_path, "--student-init-state")
    else:
        student_before = await s.service.create_sampling_client(base_model=student_base)

    figures: dict[str, float] = {}
    ci95: dict[str, tuple[float, float]] = {}

    async def evaluate(name: str, client: SamplingClient) -> None:
        accuracy = AccuracyEvaluator(
            test_problems, renderer, tokenizer, num_samples=config.eval_samples, stage=name, seed=config.seed
        )
        await accuracy(client)
        figures.update(accuracy.records[-1].figures(name))
        ci95.update(accuracy.records[-1].intervals(name))
        if name != "teacher":
            figures[f"{name}_heldout_reverse_kl"] = await heldout_reverse_kl(
                client, teacher, test_problems, renderer,
                num_samples=config.eval_samples, max_tokens=config.max_tokens, seed=config.seed,
            )  # fmt: skip

    await evaluate("teacher", teacher)
    await evaluate("student_before", student_before)

    # 4. on-policy distillation
    task = ArithmeticProblems(
        base_model=student_base, renderer_name=config.renderer_name, seed=config.seed, n_test=config.n_test,
        batch_size=config.distill.batch_size, group_size=config.group_size, test_group_size=0,
        reward_coef=config.reward_coef,
    )  # fmt: skip
    s.say(
        f"distillation, {config.distill.steps} steps of {config.distill.batch_size} prompts x "
        f"{config.group_size} samples -> {s.run_dir / 'distill'}"
    )
    rl = await rl_stage(
        s, "distill", config.distill, dataset=task, model=student_model,
        max_tokens=config.max_tokens, distill_teacher=teacher_path, distill_coef=config.distill_coef,
        seed=config.seed,
    )  # fmt: skip
    kl_P = [v for line in rl.metrics if isinstance(v := line.get("distill/reverse_kl"), float)]
    assert rl.final.sampler_path is not None
    await evaluate("student_after", await open_sampler(s.service, rl.final.sampler_path, "distilled student"))

    # 5. summary
    if kl_P:
        figures["reverse_kl_start"] = kl_P[0]
        figures["reverse_kl_end"] = float(np.mean(kl_P[-min(3, len(kl_P)) :]))
    extra |= {
        "student_final_sampler_path": rl.final.sampler_path,
        "student_final_state_path": rl.final.state_path,
        "distill_run_dir": str(s.run_dir / "distill"),
        "reverse_kl_per_step": kl_P,
        "n_test": config.n_test,
        "data": {"train": str(train_path), "test": str(test_path)},
    }
    return s.finish(figures, extra, ci95=ci95)

"""``tempering recipe topk-distill``: off-policy distillation on a teacher's top-K, against SFT on
the same conversations' reference answers.

1. Teacher: ``--teacher PATH`` (sampler weights), else an SFT of ``--teacher-model`` (default
   ``--base-model``) on ``train_path`` (``teacher_sft``: ``teacher_sft.steps`` ×
   ``teacher_sft.batch_size``), run directory ``<out>/teacher``.
2. Student: a fresh model (``--student-seed``). Its tokenizer must be the teacher's
   (:func:`~tempering.sft.topk_distill.check_same_tokenizer`, before any sampling).
3. Distillation (``<out>/distill``): :class:`~tempering.sft.offpolicy.TopKDistillConfig`, the
   teacher's top ``k`` on every training conversation's answer as soft targets, ``student.steps`` ×
   ``student.batch_size``.
4. Baseline (``<out>/sft``, unless ``--no-compare-sft``): the same student, steps, batch and
   learning rate, trained on the reference answers (hard labels).
5. Evaluation on the first ``n_test`` held-out conversations of ``test_path``: exact match of the
   greedy reply (:class:`~tempering.evals.reply.ReplyEvaluator`) of the teacher, the student
   before, after distillation and after the baseline; the held-out cross-entropy against the
   teacher's top-K (``test_topk/nll``) before and after distillation.

Figures (``summary.json``): ``exact_match_teacher``, ``exact_match_before``,
``exact_match_distill``, ``exact_match_sft``, ``topk_nll_before``, ``topk_nll_after``,
``test_nll_distill``, ``test_nll_sft``; ``ci95``: the exact matches' 95% Wilson intervals.

Shapes: ``T`` tokens of a conversation, ``K`` teacher tokens per position (``k``).

Example::

    tempering recipe topk-distill --out runs/topk                  # tiny model, local engine
    tempering recipe topk-distill --base-model smollm2-135m-instruct --teacher-steps 30 --steps 30
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import attrs

from tempering.assets import ASSET_PREFIX, resolve_data_path
from tempering.backend import load_tokenizer
from tempering.data import load_chat
from tempering.evals.reply import ReplyEvaluator, ReplyRecord, held_out_replies
from tempering.recipes._common import RecipeConfig, RecipeResult, fresh_model, positive
from tempering.recipes.stages import RecipeSession, SFTStage, metric, sft_stage, stage_field
from tempering.renderers import get_renderer
from tempering.sft.offpolicy import TopKDistillConfig
from tempering.sft.topk_distill import check_same_tokenizer
from tempering.training.loop import saved_sampling_client
from tempering_protocols import SamplingClient

__all__ = ["TopKDistillRecipe"]


@attrs.frozen(kw_only=True)
class TopKDistillRecipe(RecipeConfig):
    """Off-policy top-K distillation from a teacher into a fresh student, with an SFT baseline;
    see the module docstring. Calling it (``await recipe()``) runs it.

    Example::

        recipe = TopKDistillRecipe(out="/tmp/topk", student=SFTStage(40, 16, schedule="linear"))
        result = asyncio.run(recipe())
        result.figures["exact_match_distill"], result.figures["exact_match_sft"]
    """

    train_path: str = ASSET_PREFIX + "arithmetic_chat.jsonl"
    """Conversations: the teacher's SFT data, and the sequences whose answers are distilled."""
    test_path: str = ASSET_PREFIX + "arithmetic_chat_test.jsonl"
    """Held-out conversations (exact match of the reply, ``test_topk/nll``, ``test/nll``)."""
    n_train: int | None = positive(None)
    """Use the first this many conversations of ``train_path`` (written to ``<out>/data/train.jsonl``);
    ``None``: all."""
    n_test: int = positive(100)
    """Held-out conversations evaluated (the first ones)."""
    teacher: str | None = None
    """The teacher's sampler weights; ``None``: the recipe trains one."""
    teacher_model: str | None = None
    """The teacher's base model; default ``--base-model``."""
    teacher_sft: SFTStage = stage_field(SFTStage(300, 16, schedule="linear"), flat="teacher", required=True)
    """The teacher's SFT, when the recipe trains it (``--teacher-sft.steps`` or
    ``--teacher-steps``, ``--teacher-sft.batch-size``, ``--teacher-sft.learning-rate``; learning
    rate default: 2e-3 for the tiny model, the teacher model's LoRA rate otherwise)."""
    student_seed: int = 1
    """The student's initialisation (tiny model weights, or LoRA adapter seed)."""
    k: int = positive(20)
    """Teacher tokens per position."""
    student: SFTStage = stage_field(SFTStage(100, 16, schedule="linear"), flat="", required=True)
    """The student's training, the distillation's and the SFT baseline's (``--student.steps`` or
    ``--steps``, ``--student.batch-size`` or ``--batch-size``, ``--learning-rate``; learning rate
    default as the teacher's)."""
    compare_sft: bool = True
    """Also train the student on the reference answers, as a baseline."""
    max_tokens: int = positive(16)
    """Longest reply sampled in the evaluation."""

    NAME: ClassVar[str] = "topk-distill"

    async def run(self, s: RecipeSession) -> RecipeResult:
        teacher_model = self.teacher_model or self.base_model
        check_same_tokenizer(  # before the teacher is trained or asked anything
            load_tokenizer(self.base_model),
            load_tokenizer(teacher_model),
            teacher_name=self.teacher or teacher_model,
        )
        stage = self.student.for_model(self.base_model)
        student = fresh_model(self, seed=self.student_seed)
        renderer = get_renderer(student.renderer(), student.tokenizer())
        test = held_out_replies(load_chat(resolve_data_path(self.test_path)).items)[: self.n_test]
        if not test:
            raise ValueError(f"{self.test_path}: no conversation ends with an assistant message")
        records: dict[str, ReplyRecord] = {}

        async def evaluate(name: str, sampler: SamplingClient) -> None:
            evaluator = ReplyEvaluator(test, renderer, max_tokens=self.max_tokens, seed=self.seed)
            await evaluator(sampler)
            records[name] = evaluator.records[-1]
            s.say(f"{name}: exact match {records[name].exact_match:.3f}")

        train_path = self.train_path
        if self.n_train is not None:
            data = s.run_dir / "data"
            data.mkdir(exist_ok=True)
            rows = load_chat(resolve_data_path(self.train_path)).items[: self.n_train]
            train_path = str(data / "train.jsonl")
            Path(train_path).write_text("".join(json.dumps({"messages": list(r)}) + "\n" for r in rows))
        teacher_path = self.teacher
        if teacher_path is None:
            t_stage = self.teacher_sft.for_model(teacher_model)
            s.say(f"teacher: SFT of {teacher_model}, {t_stage.steps} steps -> {s.run_dir / 'teacher'}")
            trained = await sft_stage(
                s, "teacher", t_stage, model=fresh_model(self, base_model=teacher_model),
                train_path=train_path, seed=self.seed,
            )  # fmt: skip
            teacher_path = trained.final.sampler_path
        assert teacher_path is not None
        await evaluate("teacher", await s.sampler(teacher_path))
        per_epoch = len(load_chat(resolve_data_path(train_path)).items) // stage.batch_size
        if per_epoch < 1:
            raise ValueError(f"{train_path}: fewer conversations than one batch of {stage.batch_size}")
        client = await student.create_training_client(s.service)
        await evaluate("before", await saved_sampling_client(client))
        distill = TopKDistillConfig(
            run=s.run_config("distill"), model=student, teacher_model=teacher_model,
            teacher_path=teacher_path, train_path=train_path, test_path=self.test_path, k=self.k,
            batch_size=stage.batch_size, adam=stage.adam(), num_epochs=-(-stage.steps // per_epoch),
            max_steps=stage.steps, seed=self.seed,
        )  # fmt: skip
        s.say(f"distillation on the teacher's top-{self.k}, {stage.steps} steps -> {s.run_dir / 'distill'}")
        result = await distill(s.service)
        await evaluate("distill", await s.sampler(result.final.sampler_path))
        figures = {
            "topk_nll_before": metric(result.metrics, "initial/test_topk/nll"),
            "topk_nll_after": metric(result.metrics, "test_topk/nll"),
            "test_nll_before": metric(result.metrics, "initial/test/nll"),
            "test_nll_distill": metric(result.metrics, "test/nll"),
        }
        stages = {"distill": str(s.run_dir / "distill")}
        if self.compare_sft:
            s.say(f"baseline: SFT on the reference answers, {stage.steps} steps -> {s.run_dir / 'sft'}")
            sft = await sft_stage(
                s, "sft", stage, model=student, train_path=train_path, test_path=self.test_path,
                seed=self.seed,
            )  # fmt: skip
            await evaluate("sft", await s.sampler(sft.final.sampler_path))
            figures["test_nll_sft"] = metric(sft.metrics, "test/nll")
            stages["sft"] = str(s.run_dir / "sft")
        figures |= {f"exact_match_{name}": r.exact_match for name, r in records.items()}
        ci95 = {f"exact_match_{name}": r.exact_match_ci95 for name, r in records.items()}
        extra = {"teacher_path": teacher_path, "stages": stages}
        return s.finish(figures, extra, ci95=ci95)

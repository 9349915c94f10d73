"""``tempering recipe prompt-distillation``: a student learns to behave, without a long system
prompt, as the teacher behaves with it.

1. Teacher: ``--teacher PATH`` (sampler weights), else ``--base-model`` itself. It reads every
   training query with ``--instructions`` as its system prompt and answers it
   (:func:`~tempering.sft.prompt_distill.teacher_answers`, one sample per query at
   ``--teacher-temperature``); the answers go to ``<out>/data/train.jsonl`` without the
   instructions.
2. Student (``<out>/student``): a fresh model (``--student-seed``) trained ``student.steps`` ×
   ``student.batch_size`` on the queries *without* the instructions, with ``--targets sample`` (SFT on
   the teacher's answers) or ``--targets topk`` (the teacher's top ``k`` over its answers, read
   with the instructions: :func:`~tempering.sft.prompt_distill.prompt_distill_datums`).
3. Evaluation on the first ``n_test`` held-out conversations of ``test_path`` (their queries): the
   greedy reply of the teacher *with* the instructions, and of the student *without* them before
   and after training. ``agreement_*``: the fraction of queries where the student's reply equals
   the teacher's (stripped); ``exact_match_*``: against the dataset's reference answers;
   ``chars_*``: the mean reply length in characters.

Figures (``summary.json``): ``exact_match_teacher``, ``exact_match_before``,
``exact_match_after``, ``agreement_before``, ``agreement_after``, ``chars_teacher``,
``chars_before``, ``chars_after``; ``ci95``: the exact matches' 95% Wilson intervals.

Example::

    tempering recipe prompt-distillation --out runs/pd                                # tiny model
    tempering recipe prompt-distillation --base-model smollm2-135m-instruct --targets topk
"""

from __future__ import annotations

import json
from typing import ClassVar

import attrs

from tempering.assets import ASSET_PREFIX, resolve_data_path
from tempering.data import load_chat
from tempering.evals.reply import ReplyEvaluator, ReplyRecord
from tempering.recipes._common import RecipeConfig, RecipeResult, fresh_model, non_negative, positive
from tempering.recipes.stages import RecipeSession, SFTStage, stage_field
from tempering.renderers import get_renderer
from tempering.sft.offpolicy import DatumDataset
from tempering.sft.prompt_distill import (
    TargetKind,
    prompt_distill_datums,
    query_of,
    teacher_answers,
    with_instructions,
)
from tempering.sft.train import train_supervised
from tempering.training.loop import saved_sampling_client
from tempering_protocols import Message, SamplingClient

__all__ = ["DEFAULT_INSTRUCTIONS", "PromptDistillationRecipe"]

DEFAULT_INSTRUCTIONS = (
    "You are a precise calculator and word tool. Follow these rules exactly.\n"
    "1. Reply with the final result only: no words, no explanation, no punctuation, no units.\n"
    "2. For arithmetic, reply with the number in digits.\n"
    "3. To reverse a word, reply with its letters in reverse order.\n"
    "4. To write a word in capital letters, reply with the word in capitals.\n"
    "5. To count the letters of a word, reply with the count in digits.\n"
    "Examples:\n"
    "What is 2 + 3? -> 5\nWhat is 9 - 4? -> 5\nWhat is 3 * 4? -> 12\n"
    'Reverse the word "cat". -> tac\nWrite "dog" in capital letters. -> DOG\n'
    'How many letters are in "sun"? -> 3'
)
"""The default instructions: a long system prompt for the shipped arithmetic and word chats."""


@attrs.frozen(kw_only=True)
class PromptDistillationRecipe(RecipeConfig):
    """Prompt distillation: the teacher answers with ``instructions``, the student learns to
    answer the same without them; see the module docstring. Calling it runs it.

    Example::

        recipe = PromptDistillationRecipe(out="/tmp/pd", student=SFTStage(40, 16, schedule="linear"))
        result = asyncio.run(recipe())
        result.figures["agreement_after"]
    """

    instructions: str = DEFAULT_INSTRUCTIONS
    """The teacher's system prompt, which the student never sees."""
    train_path: str = ASSET_PREFIX + "arithmetic_chat.jsonl"
    """Conversations whose queries the teacher answers (their answers are not used)."""
    test_path: str = ASSET_PREFIX + "arithmetic_chat_test.jsonl"
    """Held-out conversations: their queries, and reference answers for ``exact_match_*``."""
    n_train: int = positive(400)
    """Training queries (the first ones of ``train_path``)."""
    n_test: int = positive(100)
    """Held-out queries evaluated (the first ones)."""
    teacher: str | None = None
    """The teacher's sampler weights; ``None``: ``--base-model`` itself."""
    teacher_temperature: float = non_negative(0.7)
    """Temperature of the teacher's answers to the training queries."""
    targets: TargetKind = "sample"
    """``sample``: SFT on the teacher's answers; ``topk``: the teacher's top-K over them."""
    k: int = positive(20)
    """Teacher tokens per position with ``--targets topk``."""
    student_seed: int = 1
    """The student's initialisation (tiny model weights, or LoRA adapter seed)."""
    student: SFTStage = stage_field(SFTStage(100, 16, schedule="linear"), flat="", required=True)
    """The student's training (``--student.steps`` or ``--steps``, ``--student.batch-size`` or
    ``--batch-size`` queries per step, ``--learning-rate``; learning rate default: 2e-3 for the
    tiny model, the model's LoRA rate otherwise)."""
    max_tokens: int = positive(32)
    """Longest answer, sampled from the teacher and in the evaluation."""

    NAME: ClassVar[str] = "prompt-distillation"

    def validate(self) -> None:
        if not self.instructions.strip():
            raise ValueError("PromptDistillationRecipe.instructions (--instructions) must not be empty")

    async def run(self, s: RecipeSession) -> RecipeResult:
        student = fresh_model(self, seed=self.student_seed)
        renderer = get_renderer(student.renderer(), student.tokenizer())
        train = [query_of(c) for c in load_chat(resolve_data_path(self.train_path)).items[: self.n_train]]
        test = [query_of(c) for c in load_chat(resolve_data_path(self.test_path)).items[: self.n_test]]
        stage = self.student.for_model(self.base_model)
        if len(train) < stage.batch_size:
            raise ValueError(
                f"{self.train_path}: {len(train)} queries, fewer than one batch of {stage.batch_size}"
            )
        service = s.service
        teacher = await (
            service.create_sampling_client(base_model=self.base_model)
            if self.teacher is None
            else service.create_sampling_client(model_path=self.teacher)
        )

        async def evaluate(items: list[tuple[list[Message], str]], sampler: SamplingClient) -> ReplyRecord:
            evaluator = ReplyEvaluator(
                items, renderer, max_tokens=self.max_tokens, n_show=len(items), seed=self.seed
            )
            await evaluator(sampler)
            return evaluator.records[-1]

        records = {
            "teacher": await evaluate(
                [(with_instructions(q, self.instructions), r) for q, r in test], teacher
            )
        }
        s.say(f"teacher with the instructions: exact match {records['teacher'].exact_match:.3f}")
        queries = [q for q, _ in train]
        answers = await teacher_answers(
            teacher, renderer, queries, self.instructions, max_tokens=self.max_tokens,
            temperature=self.teacher_temperature, seed=self.seed,
        )  # fmt: skip
        data = s.run_dir / "data"
        data.mkdir(exist_ok=True)
        with (data / "train.jsonl").open("w") as f:
            for q, a in zip(queries, answers, strict=True):
                f.write(json.dumps({"messages": [*q, {"role": "assistant", "content": a}]}) + "\n")
        datums = await prompt_distill_datums(
            renderer, queries, answers, self.instructions, targets=self.targets, teacher=teacher, k=self.k
        )
        client = await student.create_training_client(service)
        records["before"] = await evaluate(test, await saved_sampling_client(client))
        train_ds = DatumDataset(datums, stage.batch_size, self.seed)
        s.say(f"student without the instructions, {self.targets} targets, {stage.steps} steps")
        result = await train_supervised(
            self, run=s.run_config("student"), model=student, adam=stage.adam(), train=train_ds,
            num_epochs=-(-stage.steps // len(train_ds)), max_steps=stage.steps, service=service,
        )  # fmt: skip
        records["after"] = await evaluate(test, await s.sampler(result.final.sampler_path))
        teacher_replies = [r.reply.strip() for r in records["teacher"].replies]
        figures: dict[str, float] = {}
        for name, record in records.items():
            figures[f"exact_match_{name}"] = record.exact_match
            figures[f"chars_{name}"] = record.mean_chars
            if name != "teacher":
                same = sum(r.reply.strip() == t for r, t in zip(record.replies, teacher_replies, strict=True))
                figures[f"agreement_{name}"] = same / len(teacher_replies)
        ci95 = {f"exact_match_{name}": r.exact_match_ci95 for name, r in records.items()}
        examples = [
            {"query": t.prompt, "teacher": t.reply, "before": b.reply, "after": a.reply}
            for t, b, a in list(
                zip(
                    records["teacher"].replies,
                    records["before"].replies,
                    records["after"].replies,
                    strict=True,
                )
            )[:8]
        ]
        before, after = figures["agreement_before"], figures["agreement_after"]
        s.say(f"agreement with the teacher {before:.3f} -> {after:.3f}")
        return s.finish(
            figures, {"examples": examples, "stages": {"student": str(s.run_dir / "student")}}, ci95=ci95
        )

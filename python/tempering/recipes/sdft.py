"""``tempering recipe sdft``: self-distillation fine-tuning against plain SFT on the references.

1. Data: the first ``n_train`` ``{"question", "answer"}`` rows of ``train_path`` (default the
   shipped GSM8K-style word problems, answers with ``<<calculator>>`` notes and ``#### n``).
2. Rewrites: the starting model (``--base-model``, a fresh adapter seeded by ``--seed``) rewrites
   each reference answer in its own words, shown the question and the reference
   (:func:`~tempering.sft.sdft.self_rewrites`, ``--template``); a rewrite replaces its reference
   only if it keeps the final answer (:func:`~tempering.sft.sdft.keeps_final_answer`), else the
   reference stays. ``<out>/data/sdft.jsonl`` and ``<out>/data/reference.jsonl``.
3. ``<out>/sdft``: SFT of the starting model on the rewrites; ``<out>/sft`` (unless
   ``--no-compare-sft``): the same on the references, same steps, batch and learning rate.
4. Evaluation: final-answer accuracy of the greedy reply on the first ``n_test`` held-out rows of
   ``test_path`` (the task), and the exact match of the greedy reply on the first ``n_other``
   conversations of ``other_test_path`` (another task: what is kept), before and after each
   training. ``target_nll_*``: the starting model's NLL per token of the training targets (the
   rewrites, the references): how far each set is from the model's own distribution.

Figures (``summary.json``): ``accuracy_before``, ``accuracy_sdft``, ``accuracy_sft``,
``other_before``, ``other_sdft``, ``other_sft``, ``rewrites_kept`` (fraction),
``target_nll_sdft``, ``target_nll_reference``; ``ci95`` for the accuracies.

Example::

    tempering recipe sdft --out runs/sdft                                # tiny model
    tempering recipe sdft --base-model smollm2-135m-instruct --steps 20
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import attrs

from tempering.assets import ASSET_PREFIX, resolve_data_path
from tempering.data import load_chat
from tempering.data.datums import conversations_to_datums
from tempering.evals.reply import ReplyEvaluator, held_out_replies
from tempering.recipes._common import RecipeConfig, RecipeResult, fresh_model, non_negative, positive
from tempering.recipes.stages import RecipeSession, SFTStage, sft_stage, stage_field
from tempering.renderers import get_renderer
from tempering.sft.offpolicy import DatumDataset
from tempering.sft.sdft import DEFAULT_TEMPLATE, final_answer_accuracy, sdft_conversations, self_rewrites
from tempering.sft.train import NLLEvaluator
from tempering.training.loop import saved_sampling_client
from tempering_protocols import Message, SamplingClient

__all__ = ["SDFTRecipe", "read_pairs"]


def read_pairs(path: str, n: int) -> list[tuple[str, str]]:
    """The first ``n`` ``(question, answer)`` rows of a JSONL file of ``{"question", "answer"}``."""
    pairs: list[tuple[str, str]] = []
    with Path(resolve_data_path(path)).open() as f:
        for line_no, line in enumerate(f, 1):
            if len(pairs) >= n:
                break
            if not line.strip():
                continue
            row = json.loads(line)
            if (
                not isinstance(row, dict)
                or not isinstance(row.get("question"), str)
                or not isinstance(row.get("answer"), str)
            ):
                raise ValueError(f"{path}:{line_no}: expected a row {{'question': str, 'answer': str}}")
            pairs.append((str(row["question"]), str(row["answer"])))
    if not pairs:
        raise ValueError(f"{path}: no (question, answer) rows")
    return pairs


def _write(path: Path, conversations: list[list[Message]]) -> None:
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in conversations))


@attrs.frozen(kw_only=True)
class SDFTRecipe(RecipeConfig):
    """SDFT against SFT on the references; see the module docstring. Calling it runs it.

    Example::

        result = asyncio.run(SDFTRecipe(out="/tmp/sdft", sft=SFTStage(20, 16, schedule="linear"))())
        result.figures["accuracy_sdft"], result.figures["accuracy_sft"]
    """

    train_path: str = ASSET_PREFIX + "word_problems.jsonl"
    """``{"question", "answer"}`` rows whose answers are rewritten and trained on."""
    test_path: str = ASSET_PREFIX + "word_problems_test.jsonl"
    """Held-out rows: final-answer accuracy (the task)."""
    other_test_path: str = ASSET_PREFIX + "arithmetic_chat_test.jsonl"
    """Held-out chats of another task: exact match of the reply (what the training keeps)."""
    n_train: int = positive(200)
    """Training rows (the first ones)."""
    n_test: int = positive(100)
    """Held-out rows evaluated (the first ones)."""
    n_other: int = positive(50)
    """Held-out chats of the other task evaluated (the first ones)."""
    template: str = DEFAULT_TEMPLATE
    """The rewrite request, with the fields ``{question}`` and ``{answer}``."""
    rewrite_temperature: float = non_negative(0.7)
    """Temperature of the rewrites."""
    sft: SFTStage = stage_field(SFTStage(100, 16, schedule="linear"), flat="", required=True)
    """Each SFT, of SDFT and of the baseline (``--sft.steps`` or ``--steps``,
    ``--sft.batch-size`` or ``--batch-size``, ``--learning-rate``; learning rate default: 2e-3
    for the tiny model, the model's LoRA rate otherwise)."""
    compare_sft: bool = True
    """Also fine-tune on the references, as a baseline."""
    max_tokens: int = positive(128)
    """Longest rewrite and evaluated reply."""

    NAME: ClassVar[str] = "sdft"

    def validate(self) -> None:
        if "{question}" not in self.template or "{answer}" not in self.template:
            raise ValueError("SDFTRecipe.template (--template) must contain {question} and {answer}")

    async def run(self, s: RecipeSession) -> RecipeResult:
        model = fresh_model(self)
        renderer = get_renderer(model.renderer(), model.tokenizer())
        pairs = read_pairs(self.train_path, self.n_train)
        test = read_pairs(self.test_path, self.n_test)
        other = held_out_replies(load_chat(resolve_data_path(self.other_test_path)).items)[: self.n_other]
        figures: dict[str, float] = {}
        ci95: dict[str, tuple[float, float]] = {}
        shown: dict[str, list[str]] = {}

        async def evaluate(name: str, sampler: SamplingClient) -> None:
            acc, ci, replies = await final_answer_accuracy(
                sampler, renderer, test, max_tokens=self.max_tokens, seed=self.seed
            )
            kept = ReplyEvaluator(other, renderer, max_tokens=16, seed=self.seed)
            await kept(sampler)
            figures[f"accuracy_{name}"], ci95[f"accuracy_{name}"] = acc, ci
            figures[f"other_{name}"] = kept.records[-1].exact_match
            ci95[f"other_{name}"] = kept.records[-1].exact_match_ci95
            shown[name] = replies[:3]
            s.say(f"{name}: accuracy {acc:.3f}, other task {figures[f'other_{name}']:.3f}")

        client = await model.create_training_client(s.service)
        start = await saved_sampling_client(client)
        await evaluate("before", start)
        rewrites = await self_rewrites(
            start, renderer, pairs, self.template, max_tokens=self.max_tokens,
            temperature=self.rewrite_temperature, seed=self.seed,
        )  # fmt: skip
        conversations, kept = sdft_conversations(pairs, rewrites)
        references: list[list[Message]] = [
            [{"role": "user", "content": q}, {"role": "assistant", "content": a}] for q, a in pairs
        ]
        figures["rewrites_kept"] = kept / len(pairs)
        s.say(f"{kept} of {len(pairs)} rewrites keep the final answer")
        for name, convs in (("sdft", conversations), ("reference", references)):
            datums = conversations_to_datums(renderer, convs)
            nll = await NLLEvaluator(DatumDataset(datums, self.sft.batch_size, keep_last=True), name="t")(
                client
            )
            figures[f"target_nll_{name}"] = nll["t/nll"]
        data = s.run_dir / "data"
        data.mkdir(exist_ok=True)
        _write(data / "sdft.jsonl", conversations)
        _write(data / "reference.jsonl", references)
        stage = self.sft.for_model(self.base_model)
        runs = [("sdft", data / "sdft.jsonl")] + (
            [("sft", data / "reference.jsonl")] if self.compare_sft else []
        )
        for name, path in runs:
            s.say(f"{name}: SFT, {stage.steps} steps of {stage.batch_size} -> {s.run_dir / name}")
            result = await sft_stage(s, name, stage, model=model, train_path=path, seed=self.seed)
            await evaluate(name, await s.sampler(result.final.sampler_path))
        examples = [
            {"question": q, "reference": a, "rewrite": r}
            for (q, a), r in zip(pairs[:5], rewrites[:5], strict=True)
        ]
        return s.finish(figures, {"rewrites": examples, "replies": shown}, ci95=ci95)

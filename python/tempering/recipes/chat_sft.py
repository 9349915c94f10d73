"""``tempering recipe chat-sft``: supervised fine-tuning on the shipped chat conversations.

The pipeline, built from the library's trainer (nothing here is a training loop):

1. Data: ``train_path`` (default the shipped 400 ``arithmetic_chat.jsonl`` conversations: small
   arithmetic, word tasks, some with a system prompt, some two turns long) and ``test_path``
   (the 100 held-out ``arithmetic_chat_test.jsonl`` ones, sharing no question with the first).
2. SFT: :func:`tempering.sft.train_supervised` for ``sft.steps`` steps of ``sft.batch_size``
   conversations (cross-entropy on the last assistant message), full fine-tuning of the tiny
   model on the local engine (it starts from random weights) or LoRA elsewhere
   (:func:`~tempering.recipes._common.default_lora_rank`); run directory ``<out>/sft``.
3. Evaluation, before the first step, every ``sft.eval_every`` steps and after the last: held-out
   NLL per trained token (:class:`~tempering.sft.NLLEvaluator`, ``test/nll``) and the exact-match
   accuracy of the greedy reply to every held-out conversation's last user turn against its
   reference answer (:class:`~tempering.evals.reply.ReplyEvaluator`, ``test/exact_match``). A
   few replies before and after training are printed and kept in ``summary.json``.

Figures (``summary.json``): ``test_nll_before``, ``test_nll_after``, ``exact_match_before``,
``exact_match_after`` (fractions), ``wall_seconds``; ``ci95``: the exact matches' 95% Wilson
intervals.

:func:`train_chat_sft` is the stage itself; the ``dpo`` and ``rlhf`` recipes start with it.

Shapes: ``D`` conversations of a batch (``batch_size``).

Example::

    tempering recipe chat-sft --out runs/chat-sft            # defaults: docs/recipes/chat-sft.md
    tempering recipe chat-sft --steps 40 --out /tmp/chat
    result = asyncio.run(ChatSFTRecipe(out="/tmp/chat", steps=40)())
    result.figures["test_nll_after"]
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from tempering.assets import ASSET_PREFIX, resolve_data_path
from tempering.data import load_chat
from tempering.evals.reply import ReplyEvaluator, ReplyRecord, format_replies, held_out_replies, replies_json
from tempering.recipes._common import RecipeConfig, RecipeResult, fresh_model, positive
from tempering.recipes.stages import RecipeSession, SFTStage, metric, sft_stage, stage_field
from tempering.renderers import get_renderer
from tempering.training import TrainResult

__all__ = ["ChatSFTOutcome", "ChatSFTRecipe", "train_chat_sft"]


@attrs.frozen
class ChatSFTOutcome:
    """What :func:`train_chat_sft` leaves: the trainer's result and the held-out figures before
    and after training (``records[0]`` and ``records[-1]`` of the reply evaluator)."""

    result: TrainResult
    test_nll_before: float
    test_nll_after: float
    before: ReplyRecord
    after: ReplyRecord

    @property
    def state_path(self) -> str:
        """The final ``save_state`` path (the next stage's ``ModelConfig.init_state``)."""
        return self.result.final.state_path

    @property
    def sampler_path(self) -> str:
        """The final sampler weights."""
        path = self.result.final.sampler_path
        assert path is not None, "the final checkpoint always has sampler weights"
        return path

    def figures(self, prefix: str = "") -> dict[str, float]:
        """``<prefix>test_nll_after`` and ``<prefix>exact_match_after``."""
        return {
            f"{prefix}test_nll_after": self.test_nll_after,
            f"{prefix}exact_match_after": self.after.exact_match,
        }


def chat_stage(steps: int, learning_rate: float | None = None, *, eval_every: int = 100) -> SFTStage:
    """The chat-SFT stage: ``steps`` steps of 16 conversations (linear decay after at most 10
    warmup steps), evaluated every ``eval_every`` steps; ``learning_rate`` unset: the recipe's
    default for its model."""
    return SFTStage(steps, 16, learning_rate, eval_every=eval_every, schedule="linear", max_warmup_steps=10)


async def train_chat_sft(
    session: RecipeSession, stage: SFTStage, *, train_path: str, test_path: str
) -> ChatSFTOutcome:
    """The SFT stage into ``<run dir>/sft``: ``stage`` (its learning rate resolved) of the fresh
    model of ``session.config`` (its ``base_model``, ``lora_rank``, ``seed``,
    ``renderer_name``) on the chats at ``train_path``, evaluated as the module docstring says on
    the held-out chats at ``test_path`` (replies of at most ``config.max_tokens`` tokens, the
    first ``config.show`` kept). The ``dpo`` and ``rlhf`` recipes start with it.

    Example::

        outcome = await train_chat_sft(session, chat_stage(100, 2e-3, eval_every=50),
                                       train_path=train, test_path=test)
        outcome.state_path    # init_state of the next stage
    """
    config, model = session.config, fresh_model(session.config)
    seed: int = config.seed
    test_items = held_out_replies(load_chat(resolve_data_path(test_path)).items)
    if not test_items:
        raise ValueError(f"{test_path}: no conversation ends with an assistant message to compare against")
    renderer = get_renderer(model.renderer(), model.tokenizer())
    replies = ReplyEvaluator(
        test_items, renderer, max_tokens=config.max_tokens, n_show=config.show, seed=seed
    )
    session.say(f"SFT, {stage.steps} steps of {stage.batch_size} conversations -> {session.run_dir / 'sft'}")
    result = await sft_stage(
        session, "sft", stage, model=model, train_path=train_path, test_path=test_path, seed=seed,
        sampling_evaluators=[replies],
    )  # fmt: skip
    nll_before, nll_after = metric(result.metrics, "initial/test/nll"), metric(result.metrics, "test/nll")
    return ChatSFTOutcome(result, nll_before, nll_after, replies.records[0], replies.records[-1])


@attrs.frozen(kw_only=True)
class ChatSFTRecipe(RecipeConfig):
    """Supervised fine-tuning on chat conversations, with held-out NLL and exact-match replies
    before and after; see the module docstring. Calling it (``await recipe()``) runs it.

    Example::

        result = asyncio.run(ChatSFTRecipe(out="/tmp/chat", sft=chat_stage(40))())
        result.figures["exact_match_after"]
    """

    train_path: str = ASSET_PREFIX + "arithmetic_chat.jsonl"
    """Training conversations (``tempering-assets:<name>`` names a shipped file)."""
    test_path: str = ASSET_PREFIX + "arithmetic_chat_test.jsonl"
    """Held-out conversations: NLL, and exact match of the reply to the last user turn."""
    sft: SFTStage = stage_field(chat_stage(300), flat="", required=True)
    """The SFT stage: ``steps`` (the data is repeated as needed: 25 batches an epoch at the
    defaults) of ``batch_size`` conversations, peak ``learning_rate`` (linear warmup, then linear
    decay; default 2e-3 for the tiny model, full fine-tuning, 2e-4 otherwise, LoRA), evaluated
    every ``eval_every`` steps (``--sft.steps``, or ``--steps`` as before, ...)."""
    max_tokens: int = positive(16)
    """Longest reply sampled in the evaluation."""
    show: int = 5
    """Held-out replies printed and kept in ``summary.json``."""

    NAME: ClassVar[str] = "chat-sft"

    async def run(self, s: RecipeSession) -> RecipeResult:
        stage = self.sft.for_model(self.base_model)
        outcome = await train_chat_sft(s, stage, train_path=self.train_path, test_path=self.test_path)
        print(format_replies(outcome.before, outcome.after))
        figures = {
            "test_nll_before": outcome.test_nll_before,
            "test_nll_after": outcome.test_nll_after,
            "exact_match_before": outcome.before.exact_match,
            "exact_match_after": outcome.after.exact_match,
        }
        extra = {
            "replies": replies_json(outcome.before, outcome.after),
            "sft_state_path": outcome.state_path,
            "sft_sampler_path": outcome.sampler_path,
            "stages": {"sft": str(s.run_dir / "sft")},
        }
        ci95 = {
            "exact_match_before": outcome.before.exact_match_ci95,
            "exact_match_after": outcome.after.exact_match_ci95,
        }
        return s.finish(figures, extra, ci95=ci95)

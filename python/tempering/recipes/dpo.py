"""``tempering recipe dpo``: direct preference optimization on the shipped preference pairs,
from a supervised start.

The pipeline, built from the library's trainers (nothing here is a training loop):

1. SFT start: the ``chat-sft`` stage (:func:`~tempering.recipes.chat_sft.train_chat_sft`,
   ``sft.steps`` steps on the shipped chats; run directory ``<out>/sft``), or, with
   ``init_state``, an existing ``save_state`` checkpoint (no SFT stage).
2. DPO: :class:`tempering.preference.DPOConfig` from that checkpoint (``ModelConfig.init_state``)
   for ``dpo.steps`` steps of ``dpo.batch_size`` pairs on the shipped 300 comparisons
   (``arithmetic_preferences.jsonl``: a correct, concise answer preferred to a wrong or a
   rambling one), ``test_pairs`` of them held out; run directory ``<out>/dpo``. The reference
   is the starting policy (the trainer saves it before step 0 and records it in the run's
   ``state.json``).
3. Held-out evaluation of the reference (= the SFT policy) and of the final policy, both
   through sampling clients: the log-probability of each held-out pair's chosen and rejected
   completion (summed over the completion's tokens), and the greedy reply to each held-out
   prompt compared with the chosen answer.

Figures (``summary.json``), over the held-out pairs:

=============================  ==================================================================
``preference_accuracy_*``      fraction of pairs with ``log π(chosen) > log π(rejected)``, for the
                               SFT policy (``_before``) and the DPO policy (``_after``)
``logprob_margin_*``           mean ``log π(chosen) - log π(rejected)`` (nats)
``reward_accuracy``            fraction of pairs whose DPO implicit reward ``β log(π/π_ref)`` ranks
                               the chosen completion higher (ties half; 0.5 before, by definition)
``reward_margin``              mean implicit reward margin ``β Δ`` (0 before, by definition)
``dpo_loss_before/_after``     the trainer's held-out DPO loss (``ln 2`` before)
``answer_accuracy_*``          exact match of the greedy reply with the chosen answer
``wall_seconds``               the whole recipe
=============================  ==================================================================

``ci95`` holds the 95% Wilson intervals of the accuracies over the held-out pairs.

Shapes: ``P`` held-out pairs; ``D = 2 P`` datums (chosen at even ``d``, rejected at odd).

Example::

    tempering recipe dpo --out runs/dpo                       # defaults: docs/recipes/dpo.md
    tempering recipe dpo --init-state <save_state path> --dpo-steps 40
    result = asyncio.run(DPORecipe(out="/tmp/dpo", sft=chat_stage(60), dpo=preference_stage(10, 8, 5))())
    result.figures["reward_accuracy"]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import attrs

from tempering.assets import ASSET_PREFIX
from tempering.backend import ModelConfig
from tempering.evals.reply import ReplyEvaluator, format_replies, replies_json
from tempering.preference import ComparisonData, DPOConfig
from tempering.preference.evaluation import PairLogprobs, chosen_answers, dpo_pair_figures, pair_logprobs
from tempering.recipes._common import RecipeConfig, RecipeResult, positive
from tempering.recipes.chat_sft import chat_stage, train_chat_sft
from tempering.recipes.stages import RecipeSession, SFTStage, metric, stage_field
from tempering.training import RunDir
from tempering_protocols import LabeledComparison, Renderer

__all__ = ["DPORecipe", "PreferenceRecipe", "preference_stage"]


def preference_stage(steps: int, batch_size: int, eval_every: int) -> SFTStage:
    """A stage on labeled comparisons (DPO, the reward model): ``steps`` steps of ``batch_size``
    pairs, 5 warmup steps, linear decay, Adam's beta2 0.95, evaluated every ``eval_every`` steps;
    its learning rate is the recipe's default for the model unless given."""
    return SFTStage(
        steps, batch_size, None, eval_every=eval_every, max_warmup_steps=5, schedule="linear", beta2=0.95
    )


@attrs.frozen(kw_only=True)
class PreferenceRecipe(RecipeConfig):
    """What the ``dpo`` and ``rlhf`` recipes share: the model, the chat-SFT stage they start from
    (or ``init_state``), the labeled comparisons and the held-out replies."""

    init_state: str | None = None
    """Start from this ``save_state`` checkpoint (of ``base_model``) instead of an SFT stage."""
    sft_path: str = ASSET_PREFIX + "arithmetic_chat.jsonl"
    """Conversations of the SFT stage (``tempering-assets:<name>`` names a shipped file)."""
    sft_test_path: str = ASSET_PREFIX + "arithmetic_chat_test.jsonl"
    """Held-out conversations of the SFT stage: NLL and exact-match replies."""
    sft: SFTStage = stage_field(chat_stage(300))
    """The SFT stage before the preference stage (skipped with ``init_state``): ``--sft.steps``
    or ``--sft-steps``, ...; learning rate default 2e-3 for the tiny model (full fine-tuning),
    2e-4 otherwise (LoRA)."""
    pairs_path: str = ASSET_PREFIX + "arithmetic_preferences.jsonl"
    """Labeled comparisons (``tempering-assets:<name>`` names a shipped file)."""
    test_pairs: int = positive(60)
    """Pairs held out of ``pairs_path`` for the evaluation."""
    max_tokens: int = positive(16)
    """Longest reply sampled in the evaluations."""
    show: int = 5
    """Held-out replies printed and kept in ``summary.json``."""

    def validate(self) -> None:
        if self.init_state is None and self.sft.steps < 1:
            raise ValueError(
                f"{type(self).__name__}.sft.steps (--sft.steps) must be > 0 without --init-state, "
                f"got {self.sft.steps}"
            )

    async def run(self, s: RecipeSession) -> RecipeResult:
        extra: dict[str, Any] = {}
        stages: dict[str, str] = {}
        start = await self.sft_start(s, extra, stages)
        return await self.after_sft(s, start, extra, stages)

    async def after_sft(
        self, s: RecipeSession, start: str, extra: dict[str, Any], stages: dict[str, str]
    ) -> RecipeResult:
        """The stages after the SFT start (``start``: its ``save_state`` path)."""
        raise NotImplementedError

    async def sft_start(self, session: RecipeSession, extra: dict[str, Any], stages: dict[str, str]) -> str:
        """``init_state``, else the final state of the chat-SFT stage, whose figures go into
        ``extra`` (prefixed ``sft_``) and whose run directory into ``stages``."""
        if self.init_state is not None:
            return self.init_state
        stage = self.sft.for_model(self.base_model)
        sft = await train_chat_sft(session, stage, train_path=self.sft_path, test_path=self.sft_test_path)
        extra |= sft.figures("sft_") | {"sft_sampler_path": sft.sampler_path}
        stages["sft"] = str(session.run_dir / "sft")
        return sft.state_path

    def pairs(self, batch_size: int, flag: str) -> tuple[ComparisonData, int, list[LabeledComparison]]:
        """The labeled comparisons in batches of ``batch_size``, their number of training
        batches and their held-out pairs (refusing, naming the batch-size ``flag``, fewer training
        pairs than one batch or no held-out pair with a winner)."""
        data = ComparisonData(
            path=self.pairs_path, test_size=self.test_pairs, batch_size=batch_size, seed=self.seed
        )
        train, test = data()
        owner = type(self).__name__
        if len(train) < 1:
            raise ValueError(
                f"{owner}: {data.path} has fewer training pairs than one batch ({flag} {batch_size})"
            )
        if test is None or not chosen_answers(test.items):
            raise ValueError(f"{owner}: no held-out pairs from {data.path} (--test-pairs {data.test_size})")
        return data, len(train), list(test.items)

    def start_model(self, start: str) -> ModelConfig:
        """The model at the ``save_state`` checkpoint ``start`` (of ``base_model``)."""
        return ModelConfig(base_model=self.base_model, renderer_name=self.renderer_name, init_state=start)

    def replies(self, pairs: Sequence[LabeledComparison], renderer: Renderer) -> ReplyEvaluator:
        """The evaluator of greedy replies to the prompts of ``pairs`` (their chosen answers)."""
        return ReplyEvaluator(
            chosen_answers(pairs), renderer, max_tokens=self.max_tokens, n_show=self.show, seed=self.seed
        )


@attrs.frozen(kw_only=True)
class DPORecipe(PreferenceRecipe):
    """DPO on labeled comparisons from an SFT start, with held-out preference accuracy and
    reward margin before and after; see the module docstring. Calling it (``await recipe()``)
    runs it.

    Example::

        result = asyncio.run(DPORecipe(out="/tmp/dpo", sft=chat_stage(60), dpo=preference_stage(10, 8, 5))())
        result.figures["preference_accuracy_after"]
    """

    dpo: SFTStage = stage_field(
        preference_stage(60, 8, eval_every=20), required=True, renamed={"eval-every": "eval_every"}
    )
    """The DPO stage: ``steps`` (the pairs are repeated as needed: 30 batches an epoch at the
    defaults) of ``batch_size`` pairs, learning rate default 1e-3 for the tiny model (full
    fine-tuning), 1e-5 otherwise (LoRA), evaluated every ``eval_every`` steps (``--dpo.steps`` or
    ``--dpo-steps``, ...; ``--eval-every`` as before)."""
    beta: float = positive(0.1)
    """DPO's β: the implicit reward is ``β log(π / π_ref)``."""

    NAME: ClassVar[str] = "dpo"

    async def after_sft(
        self, s: RecipeSession, start: str, extra: dict[str, Any], stages: dict[str, str]
    ) -> RecipeResult:
        # 1. the SFT start: ``start``; 2. DPO from it
        renderer = self.renderer()
        stage = self.dpo.for_model(self.base_model, "dpo")
        data, n_train, test_pairs = self.pairs(stage.batch_size, "--dpo.batch-size")
        dpo = DPOConfig(
            run=s.run_config("dpo", stage.eval_every),
            model=self.start_model(start),
            data=data,
            adam=stage.adam(),
            beta=self.beta,
            num_epochs=-(-stage.steps // n_train),
            max_steps=stage.steps,
        )
        s.say(f"DPO, {stage.steps} steps of {stage.batch_size} pairs -> {s.run_dir / 'dpo'}")
        result = await dpo(s.service)
        stages["dpo"] = str(s.run_dir / "dpo")

        # 3. held-out evaluation of the reference (the start) and the final policy
        reference_path = str(RunDir(s.run_dir / "dpo").read_state()["reference_path"])
        final_path = result.final.sampler_path
        evaluations: list[PairLogprobs] = []
        replies = self.replies(test_pairs, renderer)
        for path in (reference_path, final_path):
            sampler = await s.sampler(path)
            evaluations.append(await pair_logprobs(sampler, renderer, test_pairs))
            await replies(sampler)
        figures, ci95 = dpo_pair_figures(evaluations[0], evaluations[1], beta=self.beta)
        before, after = replies.records[0], replies.records[-1]
        print(format_replies(before, after, "DPO policy; before: the SFT start"))
        figures |= {
            "dpo_loss_before": metric(result.metrics, "initial/test/dpo_loss"),
            "dpo_loss_after": metric(result.metrics, "test/dpo_loss"),
            "answer_accuracy_before": before.exact_match,
            "answer_accuracy_after": after.exact_match,
        }
        extra |= {
            "test_pairs": len(evaluations[0][0]),
            "init_state": start,
            "reference_path": reference_path,
            "dpo_state_path": result.final.state_path,
            "dpo_sampler_path": final_path,
            "replies": replies_json(before, after),
            "stages": stages,
        }
        ci95 |= {
            "answer_accuracy_before": before.exact_match_ci95,
            "answer_accuracy_after": after.exact_match_ci95,
        }
        return s.finish(figures, extra, ci95=ci95)

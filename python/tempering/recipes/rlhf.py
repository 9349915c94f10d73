"""``tempering recipe rlhf``: SFT, then a pairwise reward model, then RL of the SFT policy
against it.

The pipeline, built from the library's trainers (nothing here is a training loop):

1. SFT: the ``chat-sft`` stage (:func:`~tempering.recipes.chat_sft.train_chat_sft`,
   ``sft_steps`` steps on the shipped chats; ``<out>/sft``), or an existing checkpoint
   (``init_state``).
2. Reward model: :class:`tempering.preference.RewardModelConfig` on the shipped comparisons
   (``test_pairs`` held out), starting from the SFT weights (``rm_from_sft``) or from the base
   model; ``<out>/rm``. It is a pairwise model: shown a prompt and two replies it answers "A"
   or "B", and :class:`~tempering.preference.VerdictPreferenceModel` reads ``P(A better)`` from
   the two verdict tokens' logprobs, averaged over both orders (so ``P(A, B) = 1 - P(B, A)``).
3. RL: :func:`tempering.rl.train` from the SFT weights; each step takes ``rl.batch_size`` (``P``)
   prompts of the training comparisons and samples ``group_size`` (``G``) replies to each. The
   ``G`` replies play a round-robin tournament judged by the reward model
   (:class:`~tempering.envs.preference.PairwisePreferenceGroupBuilder`): a reply's reward is its win rate,
   and the advantage is that minus the group's mean, so only the reward model's *relative*
   judgement of the policy's own replies drives learning, which is what a pairwise model
   gives. Optional KL penalty towards the SFT policy (``kl_coef``); ``<out>/rl``.
4. Evaluation on the held-out prompts: a win rate is relative to its group (its mean is 0.5
   whatever the policy), so the policy's reward is measured against a fixed opponent instead:
   :class:`~tempering.envs.preference.ReferenceWinRateGroupBuilder` samples ``eval_samples``
   replies per held-out prompt (as RL samples them) and scores each by the reward model's
   probability that it beats the pair's chosen (reference) reply. Measured for the SFT policy
   before RL, every ``eval_every`` RL steps (``test/…`` in ``<out>/rl/metrics.jsonl``) and after
   the last. The ground truth is also reported: exact match of the greedy reply with the chosen
   answer.

Figures (``summary.json``): ``rm_accuracy_before``/``rm_accuracy_after`` (the reward model's
held-out pairwise accuracy), ``rm_reward_before``/``rm_reward_after`` (the policy's mean
held-out reward: P(reply beats the reference) under the reward model, at the start and end of
RL), ``answer_accuracy_before``/``answer_accuracy_after`` (greedy exact match; before = the SFT
policy), ``reply_chars_before``/``reply_chars_after`` (mean length of the greedy replies, to
see reward hacking by length), ``wall_seconds``; ``ci95``: the answer accuracies' 95% Wilson
intervals.

Shapes: ``P`` prompts per RL step, ``G`` replies per prompt; a tournament compares
``G (G - 1) / 2`` pairs, each in both orders (4 ``compute_logprobs`` calls).

Example::

    tempering recipe rlhf --out runs/rlhf                     # defaults: docs/recipes/rlhf.md
    tempering recipe rlhf --init-state <save_state path> --rl-steps 20
    result = asyncio.run(RLHFRecipe(out="/tmp/rlhf", sft=chat_stage(60), rl=RLStage(4, batch_size=8))())
    result.figures["rm_reward_after"]
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from tempering.evals.reply import format_replies, replies_json
from tempering.preference import RewardModelConfig
from tempering.preference.rlhf import RewardModelPrompts
from tempering.recipes._common import RecipeResult, fresh_model, non_negative, positive
from tempering.recipes.dpo import PreferenceRecipe, preference_stage
from tempering.recipes.stages import RecipeSession, RLStage, SFTStage, metric, rl_stage, stage_field
from tempering.rl import TinkerTokenCompleter
from tempering.rl.evaluate import evaluate_dataset
from tempering.training.checkpoints import sampler_weights

if TYPE_CHECKING:
    from tempering_protocols import SamplingClient

__all__ = ["RLHFRecipe"]


@attrs.frozen(kw_only=True)
class RLHFRecipe(PreferenceRecipe):
    """SFT, a pairwise reward model, then RL of the SFT policy against it, with the reward
    model's held-out accuracy and the policy's held-out reward before and after RL; see the
    module docstring. Calling it (``await recipe()``) runs it.

    Example::

        result = asyncio.run(RLHFRecipe(out="/tmp/rlhf", sft=chat_stage(60), rl=RLStage(4, batch_size=8))())
        result.figures["rm_accuracy_after"], result.figures["rm_reward_after"]
    """

    rm: SFTStage = stage_field(preference_stage(60, 8, eval_every=20), required=True)
    """The reward-model stage: ``steps`` (each pair is shown in both orders) of ``batch_size``
    pairs, learning rate default 2e-3 for the tiny model (full fine-tuning), 2e-4 otherwise
    (LoRA) (``--rm.steps`` or ``--rm-steps``, ...)."""
    rm_from_sft: bool = True
    """Start the reward model from the SFT weights (else from the base model)."""
    rl: RLStage = stage_field(
        RLStage(20, None, eval_every=10, beta2=0.95, batch_size=8),
        renamed={"rl-prompts": "batch_size", "eval-every": "eval_every"},
    )
    """The RL stage against the reward model: ``steps`` of ``batch_size`` prompts (``P``),
    learning rate default 2e-4 for the tiny model (full fine-tuning), 4e-5 otherwise (LoRA),
    evaluated every ``eval_every`` steps (``--rl.steps`` or ``--rl-steps``; ``--rl-prompts`` and
    ``--eval-every`` as before)."""
    group_size: int = 4
    """Replies per prompt (``G``), compared pairwise by the reward model."""
    kl_coef: float = non_negative(0.0)
    """KL penalty towards the SFT policy (0: off)."""
    eval_samples: int = positive(2)
    """Replies sampled per held-out prompt for the reward-model evaluation."""
    eval_seeds: int = positive(1)
    """The policy's held-out reward is measured with this many sampling seeds before and after
    RL: ``rm_reward_*`` is their mean, ``rm_reward_*_sd`` their sd (with 1, the reward after RL
    is the RL loop's last evaluation)."""
    eval_base: bool = False
    """Also measure the base model, untrained: ``rm_reward_base``, ``answer_accuracy_base``,
    ``reply_chars_base``."""

    NAME: ClassVar[str] = "rlhf"

    def validate(self) -> None:
        if self.group_size < 2:
            raise ValueError(
                f"RLHFRecipe.group_size (--group-size) must be >= 2 for a tournament, got {self.group_size}"
            )
        super().validate()

    async def after_sft(
        self, s: RecipeSession, start: str, extra: dict[str, Any], stages: dict[str, str]
    ) -> RecipeResult:
        # 1. SFT: ``start``
        renderer = self.renderer()
        policy = self.start_model(start)

        # 2. the reward model
        stage = self.rm.for_model(self.base_model, "rm")
        data, n_train, test_pairs = self.pairs(stage.batch_size, "--rm.batch-size")
        rm_config = RewardModelConfig(
            run=s.run_config("rm", stage.eval_every),
            model=policy if self.rm_from_sft else fresh_model(self),
            data=data,
            adam=stage.adam(),
            num_epochs=-(-stage.steps // n_train),
            max_steps=stage.steps,
        )
        s.say(f"reward model, {stage.steps} steps of {stage.batch_size} pairs -> {s.run_dir / 'rm'}")
        rm = await rm_config(s.service)
        stages["rm"] = str(s.run_dir / "rm")
        rm_path = rm.final.sampler_path
        assert rm_path is not None, "the final checkpoint always has sampler weights"

        # 3. RL of the SFT policy against the reward model
        task = RewardModelPrompts(
            data=attrs.evolve(data, batch_size=1), rm_sampler_path=rm_path, base_model=self.base_model,
            renderer_name=self.renderer_name, batch_size=self.rl.batch_size, group_size=self.group_size,
            test_group_size=self.eval_samples, seed=self.seed, service=s.service,
        )  # fmt: skip
        sft_path = extra.get("sft_sampler_path") or await sampler_weights(s.service, start, "sft-policy")
        # The start: the SFT policy on the held-out prompts, as RL's evaluation samples them.
        _, test_ds = await task()
        assert test_ds is not None

        async def rewards(sampler: SamplingClient) -> list[float]:
            policy = TinkerTokenCompleter(sampler, self.max_tokens, 1.0)
            seeds = [self.seed + 7919 * k for k in range(self.eval_seeds)]
            return [
                (await evaluate_dataset(test_ds, policy, seed=seed))["test/reward/mean"] for seed in seeds
            ]

        replies = self.replies(test_pairs, renderer)
        figures: dict[str, float] = {}
        if self.eval_base:
            base = await s.service.create_sampling_client(base_model=self.base_model)
            figures |= _spread("rm_reward_base", await rewards(base))
            await replies(base)
            record = replies.records[-1]
            figures |= {"answer_accuracy_base": record.exact_match, "reply_chars_base": record.mean_chars}
        sft_rewards = await rewards(await s.sampler(sft_path))
        rl_stage_config = self.rl.for_model(self.base_model, tiny=2e-4)
        s.say(
            f"RL, {self.rl.steps} steps of {self.rl.batch_size} prompts x {self.group_size} replies "
            f"-> {s.run_dir / 'rl'}"
        )
        rl = await rl_stage(
            s, "rl", rl_stage_config, dataset=task, model=policy, max_tokens=self.max_tokens, seed=self.seed,
            kl_penalty_coef=self.kl_coef, kl_reference=sft_path if self.kl_coef > 0 else None,
        )  # fmt: skip
        stages["rl"] = str(s.run_dir / "rl")
        final_path = rl.final.sampler_path

        # 4. held-out replies (greedy) of the SFT and the final policy
        final_rewards = (
            await rewards(await s.sampler(final_path))
            if self.eval_seeds > 1
            else [metric(rl.metrics, "test/reward/mean")]
        )
        for path in (sft_path, final_path):
            await replies(await s.sampler(path))
        before, after = replies.records[-2], replies.records[-1]
        print(format_replies(before, after, "RL policy; before: the SFT policy"))
        figures |= {
            "rm_accuracy_before": metric(rm.metrics, "initial/test/pref_accuracy"),
            "rm_accuracy_after": metric(rm.metrics, "test/pref_accuracy"),
            **_spread("rm_reward_before", sft_rewards),
            **_spread("rm_reward_after", final_rewards),
        }
        for when, record in (("before", before), ("after", after)):
            figures |= {
                f"answer_accuracy_{when}": record.exact_match,
                f"reply_chars_{when}": record.mean_chars,
            }
        extra |= {
            "rm_sampler_path": rm_path,
            "sft_sampler_path": sft_path,
            "rl_state_path": rl.final.state_path,
            "rl_sampler_path": final_path,
            "replies": replies_json(before, after),
            "stages": stages,
        }
        ci95 = {
            "answer_accuracy_before": before.exact_match_ci95,
            "answer_accuracy_after": after.exact_match_ci95,
        }
        return s.finish(figures, extra, ci95=ci95)


def _spread(key: str, values: list[float]) -> dict[str, float]:
    """``{key: mean}``, and ``key_sd`` (sample sd) over two or more values."""
    out = {key: statistics.fmean(values)}
    if len(values) > 1:
        out[f"{key}_sd"] = statistics.stdev(values)
    return out

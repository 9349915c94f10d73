"""``tempering recipe rubric``: RL against an LLM judge's rubric score.

The policy answers the shipped arithmetic and word questions (``arithmetic_chat*.jsonl``); an
LLM judge (:class:`~tempering.envs.judge.LLMJudge`) grades each reply by a rubric against the
reference answer and ends with ``Score: N`` (0..10); the reward is ``N / 10``. A verdict with no
score, or none in ``judge_timeout_s``, gives no reward, masks the turn, and is counted.

1. The judge: on the local engine the tiny model knows no rubric, so it is trained first, by SFT
   on ``judge_examples`` scripted verdicts (a reply equal to the reference scores 10, any other
   0; half the replies are right), run directory ``<out>/judge``. With ``--judge-sft-steps 0``
   the judge is ``--judge-model``'s base weights as they are (a large hosted model).
2. The policy: SFT on the shipped chats (``<out>/sft``), then RL from there against the judge
   (``<out>/rl``), ``rl_batch_size`` questions × ``group_size`` replies a step.
3. Evaluation of the SFT and RL policies on the held-out questions (``eval_samples`` replies
   each, temperature 1, seeded): the judge's mean reward, the true accuracy (the reply equals
   the reference), how often the judge agrees with the truth, and its unparsed verdicts.

Example::

    tempering recipe rubric                                # defaults: docs/recipes/rubric.md
    tempering recipe rubric --judge-sft-steps 20 --sft-steps 20 --rl-steps 2 --out /tmp/rubric
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

import attrs

from tempering.backend import ServiceClient, service_client
from tempering.envs.completer import SamplingMessageCompleter
from tempering.envs.judge import LLMJudge, RubricGroupBuilder
from tempering.recipes._agents import AgentRecipe, Evaluate, FixedGroups, play, recipe_renderer, write_chats
from tempering.recipes._common import (
    TINY_MODEL,
    RecipeResult,
    fresh_model,
    prepare_run_dir,
    recipe_service,
)
from tempering.recipes.stages import SFTStage, sft_stage_at
from tempering_protocols import Message, RLDataset, RLDatasetBuilder, SamplingClient, TrainOnWhat, Trajectory

__all__ = ["RUBRIC", "RubricRecipe", "RubricTask", "judge_examples", "load_questions"]

RUBRIC = "10 if the reply equals the reference answer, else 0."


def load_questions(name: str) -> list[tuple[str, str]]:
    """``(first user message, reference answer)`` of each single-turn chat of a shipped file."""
    from tempering import assets
    from tempering.data import load_chat

    out: list[tuple[str, str]] = []
    for convo in load_chat(assets.path(name)).items:
        messages = list(convo)
        if len(messages) == 2 and messages[0]["role"] == "user":
            out.append((messages[0]["content"], messages[1]["content"]))
    return out


def _judge(completer: SamplingMessageCompleter | None, timeout_s: float) -> LLMJudge:
    return LLMJudge(completer, rubric=RUBRIC, system_prompt="", timeout_s=timeout_s)  # type: ignore[arg-type]


def judge_examples(questions: Sequence[tuple[str, str]], n: int, rng: random.Random) -> list[list[Message]]:
    """``n`` scripted verdicts: a question, a reply (the reference half the time, else another
    question's answer) and ``Score: 10`` or ``Score: 0``."""
    judge = _judge(None, 1.0)
    answers = sorted({a for _, a in questions})
    rows: list[list[Message]] = []
    for _ in range(n):
        question, reference = rng.choice(questions)
        reply = reference if rng.random() < 0.5 else rng.choice([a for a in answers if a != reference])
        verdict = "Score: 10" if reply == reference else "Score: 0"
        rows.append([*judge.messages(question, reply, reference), {"role": "assistant", "content": verdict}])
    return rows


@attrs.frozen(kw_only=True)
class RubricTask:
    """The RL task: groups of judged replies to the training questions; the test set is one
    batch of the held-out questions. The judge samples from ``judge_path`` (a checkpoint) or
    ``judge_model``'s base weights, served by ``service``."""

    base_model: str = TINY_MODEL
    renderer_name: str | None = None
    judge_path: str | None = None
    judge_model: str | None = None
    judge_renderer_name: str | None = None
    judge_max_tokens: int = 16
    judge_timeout_s: float = 60.0
    batch_size: int = 8
    group_size: int = 8
    eval_samples: int = 2
    n_batches: int = 10
    seed: int = 0
    test: bool = True
    """Build the test set (the recipe evaluates by itself and passes ``False``)."""
    service: ServiceClient | None = attrs.field(default=None, eq=False, repr=False)

    async def judge(self) -> LLMJudge:
        service = self.service or service_client()
        model = self.judge_model or self.base_model
        if self.judge_path is not None:
            sampler = await service.create_sampling_client(model_path=self.judge_path)
        else:
            sampler = await service.create_sampling_client(base_model=model)
        renderer = recipe_renderer(model, self.judge_renderer_name or self.renderer_name)
        completer = SamplingMessageCompleter(
            sampler, renderer, max_tokens=self.judge_max_tokens, temperature=1.0
        )
        return _judge(completer, self.judge_timeout_s)

    def builders(
        self, questions: Sequence[tuple[str, str]], judge: LLMJudge, n: int
    ) -> list[RubricGroupBuilder]:
        renderer = recipe_renderer(self.base_model, self.renderer_name)
        return [RubricGroupBuilder(q, renderer, judge, reference=a, group_size=n) for q, a in questions]

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        judge = await self.judge()
        train = self.builders(load_questions("arithmetic_chat.jsonl"), judge, self.group_size)
        train_ds = FixedGroups(train, batch_size=self.batch_size, n_batches=self.n_batches, seed=self.seed)
        if not self.test:
            return train_ds, None
        test = self.builders(load_questions("arithmetic_chat_test.jsonl"), judge, self.eval_samples)
        return train_ds, FixedGroups(test, batch_size=len(test), n_batches=1, seed=self.seed)


def _figures(
    stage: str, builders: Sequence[RubricGroupBuilder], played: Sequence[Sequence[Trajectory]]
) -> dict[str, float]:
    """Judge reward, true accuracy, agreement and unparsed rate over the played replies."""
    reward = correct = agree = unparsed = n = 0.0
    for builder, trajectories in zip(builders, played, strict=True):
        for traj in trajectories:
            last = traj.transitions[-1]
            reply, _ = builder.renderer.parse_response(list(last.ac.tokens))
            truth = float(reply["content"].strip() == (builder.reference or "").strip())
            score = last.metrics.get("judge/score")
            n += 1
            reward += last.reward
            correct += truth
            unparsed += float(score is None)
            agree += float(score is not None and (score >= 0.5) == (truth == 1.0))
    n = max(n, 1.0)
    return {
        f"{stage}_judge_reward": reward / n,
        f"{stage}_accuracy": correct / n,
        f"{stage}_judge_agreement": agree / n,
        f"{stage}_judge_unparsed": unparsed / n,
    }


@attrs.frozen(kw_only=True)
class RubricRecipe(AgentRecipe):
    """Rubric: train (or take) a judge, SFT the policy, RL against the judge; calling it runs
    it. Figures: docs/recipes/rubric.md."""

    judge_model: str | None = None
    """The judge's base model; default ``base_model``."""
    judge_renderer_name: str | None = None
    judge_examples: int = 2000
    judge_sft_steps: int = 150
    """SFT steps of the judge (batches of ``sft_batch_size``, learning rate 2e-3); 0: use
    ``judge_model``'s base weights as the judge."""
    judge_timeout_s: float = 60.0
    judge_max_tokens: int = 16
    """Tokens per verdict (a hosted judge that reasons before its score needs a few hundred)."""
    sft_steps: int = 300
    sft_batch_size: int = 32
    sft_learning_rate: float = 2e-3
    rl_steps: int = 20
    rl_batch_size: int = 8
    group_size: int = 8
    max_tokens: int = 12
    eval_questions: int = 100
    """Held-out questions evaluated (the single-turn ones of ``arithmetic_chat_test.jsonl``: 58)."""
    eval_samples: int = 4

    def __attrs_post_init__(self) -> None:
        self.check_positive("judge_examples", "judge_max_tokens", "eval_questions", "eval_samples")
        if self.judge_sft_steps < 0:
            raise ValueError(f"RubricRecipe: judge_sft_steps must be >= 0, got {self.judge_sft_steps}")

    async def __call__(self) -> RecipeResult:
        from tempering import assets

        t_start = time.monotonic()
        out = prepare_run_dir("rubric", self.out)
        service = recipe_service(self.base_model)
        judge_model = self.judge_model or self.base_model
        judge_path: str | None = None
        if self.judge_sft_steps > 0:
            rng = random.Random(f"rubric-judge/{self.seed}")
            train_q, test_q = (
                load_questions("arithmetic_chat.jsonl"),
                load_questions("arithmetic_chat_test.jsonl"),
            )
            judge_train = write_chats(
                out / "data" / "judge_train.jsonl", judge_examples(train_q, self.judge_examples, rng)
            )
            judge_test = write_chats(out / "data" / "judge_test.jsonl", judge_examples(test_q, 200, rng))
            print(
                f"tempering recipe rubric: judge SFT, {self.judge_sft_steps} steps -> {out / 'judge'}",
                flush=True,
            )
            judge_sft = await sft_stage_at(
                out / "judge",
                service=service,
                model=fresh_model(
                    judge_model, self.lora_rank, seed=self.seed + 1, renderer_name=self.judge_renderer_name
                ),
                train_path=judge_train,
                test_path=judge_test,
                stage=SFTStage(self.judge_sft_steps, min(self.sft_batch_size, self.judge_examples), 2e-3),
                seed=self.seed,
                progress=self.progress,
            )
            judge_path = judge_sft.final.sampler_path

        async def make_task(sft: object) -> tuple[RLDatasetBuilder, Evaluate]:
            task = RubricTask(
                base_model=self.base_model,
                renderer_name=self.renderer_name,
                judge_path=judge_path,
                judge_model=judge_model,
                judge_renderer_name=self.judge_renderer_name,
                judge_timeout_s=self.judge_timeout_s,
                judge_max_tokens=self.judge_max_tokens,
                batch_size=self.rl_batch_size,
                group_size=self.group_size,
                eval_samples=self.eval_samples,
                n_batches=self.rl_steps,
                seed=self.seed,
                test=False,
                service=service,
            )
            held_out = load_questions("arithmetic_chat_test.jsonl")[: self.eval_questions]
            eval_builders = task.builders(held_out, await task.judge(), self.eval_samples)

            async def evaluate(stage: str, sampler: SamplingClient) -> dict[str, float]:
                played = await play(sampler, eval_builders, max_tokens=self.max_tokens, seed=self.seed + 7919)
                return _figures(stage, eval_builders, played)

            return task, evaluate

        return await self.sft_then_rl(
            "rubric",
            out,
            service,
            train_path=assets.path("arithmetic_chat.jsonl"),
            test_path=assets.path("arithmetic_chat_test.jsonl"),
            make_task=make_task,
            train_on_what=TrainOnWhat.LAST_ASSISTANT_MESSAGE,
            extra={"judge_checkpoint": judge_path},
            t_start=t_start,
        )

"""The rubric task: replies to the shipped arithmetic and word questions graded by an LLM
judge (:class:`~tempering.envs.judge.LLMJudge`) by :data:`RUBRIC` against the reference answer;
and :func:`judge_examples`, scripted verdicts that teach a small model to be that judge.

Example::

    train, test = await RubricTask(judge_model=HelperModel(path=judge_sampler_path), service=service)()
    rows = judge_examples(load_questions("arithmetic_chat.jsonl"), 2000, random.Random(0))
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import attrs

from tempering.envs.agent_data import AgentTask, HelperModel, helper_field
from tempering.envs.completer import SamplingMessageCompleter
from tempering.envs.judge import LLMJudge, RubricGroupBuilder
from tempering_protocols import Message, RLDataset, Trajectory

__all__ = ["RUBRIC", "RubricTask", "judge_examples", "load_questions", "rubric_figures"]

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
class RubricTask(AgentTask):
    """The RL task: groups of judged replies to the training questions; the test set is one
    batch of the held-out questions. The judge samples from ``judge_model`` (a checkpoint, or
    base weights), served by ``service``."""

    judge_model: HelperModel = helper_field()
    judge_max_tokens: int = 16
    judge_timeout_s: float = 60.0

    async def judge(self) -> LLMJudge:
        """The judge, sampling at temperature 1."""
        completer = await self.helper_completer(self.judge_model, max_tokens=self.judge_max_tokens)
        return _judge(completer, self.judge_timeout_s)

    def builders(
        self, questions: Sequence[tuple[str, str]], judge: LLMJudge, n: int
    ) -> list[RubricGroupBuilder]:
        """A group of ``n`` judged replies to each ``(question, reference)``."""
        renderer = self.renderer()
        return [RubricGroupBuilder(q, renderer, judge, reference=a, group_size=n) for q, a in questions]

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        judge = await self.judge()
        train = self.builders(load_questions("arithmetic_chat.jsonl"), judge, self.group_size)
        test = (
            self.builders(load_questions("arithmetic_chat_test.jsonl"), judge, self.eval_samples)
            if self.test
            else []
        )
        return self.datasets(train, test)


def rubric_figures(
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

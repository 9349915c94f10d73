"""LLM completers, the LLM judge and twenty questions against an LLM answerer."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from tempering.envs.agent_data import HelperModel
from tempering.envs.completer import SamplingMessageCompleter
from tempering.envs.judge import JudgeParseError, LLMJudge, RubricEnv, RubricGroupBuilder, parse_score
from tempering.envs.message import MessageEnvAdapter
from tempering.envs.rubric_task import RubricTask
from tempering.envs.twenty_questions import (
    TwentyQuestionsDataset,
    TwentyQuestionsEnv,
    TwentyQuestionsGroupBuilder,
    WordEntry,
    load_words,
    normalise_answer,
)
from tempering.envs.twenty_questions_task import TwentyQuestionsTask
from tempering.local.service import ServiceClient
from tempering.renderers import BaseRenderer
from tempering_protocols import Message, MessageCompleter
from tempering_protocols.rl import MASK_TURN
from tempering_protocols.testing import check_env_group_builder


class Scripted:
    """A message completer that replies from a list (and records what it saw)."""

    def __init__(self, *replies: str, delay: float = 0.0, fail: bool = False) -> None:
        self.replies = list(replies)
        self.delay = delay
        self.fail = fail
        self.seen: list[Sequence[Message]] = []

    async def __call__(self, messages: Sequence[Message], /) -> Message:
        self.seen.append(messages)
        await asyncio.sleep(self.delay)
        if self.fail:
            raise ConnectionError("judge server down")
        return {"role": "assistant", "content": self.replies.pop(0) if self.replies else "yes"}


@pytest.mark.timeout(120)
def test_sampling_completer_samples_a_real_reply(service: ServiceClient, renderer: BaseRenderer) -> None:
    async def go() -> tuple[tuple[Message, bool], tuple[Message, bool], Message]:
        sampler = await service.create_sampling_client(base_model="tempering/tiny")
        completer = SamplingMessageCompleter(sampler, renderer, max_tokens=8, seed=3)
        assert isinstance(completer, MessageCompleter)
        convo: list[Message] = [{"role": "user", "content": "hi"}]
        return (
            await completer.complete(convo),
            await completer.complete(convo),
            await completer.with_seed(4)(convo),
        )

    (a, ok_a), (b, _), c = asyncio.run(go())
    assert a["role"] == "assistant"
    assert a == b  # seeded: the same reply
    assert isinstance(ok_a, bool)
    assert c["role"] == "assistant"
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingMessageCompleter(None, renderer, max_tokens=0)  # type: ignore[arg-type]


def test_parse_score() -> None:
    assert parse_score("Good.\nScore: 7") == 7.0
    assert parse_score("score = 2.5 ... Score: 9", 0, 10) == 9.0
    with pytest.raises(JudgeParseError, match="no 'Score: N' line; it wrote: 'looks fine'"):
        parse_score("looks fine")
    with pytest.raises(JudgeParseError, match=r"outside 0\.\.10"):
        parse_score("Score: 11")


def _judge(completer: MessageCompleter, timeout_s: float = 5.0) -> LLMJudge:
    return LLMJudge(completer, rubric="10 if correct, else 0.", timeout_s=timeout_s)


@pytest.mark.timeout(30)
def test_judge_verdicts_and_failures() -> None:
    scripted = Scripted("Correct. Score: 10", "I cannot say", "Score: 4")
    judge = _judge(scripted)
    ok = asyncio.run(judge.judge("2+2?", "4", reference="4"))
    assert (ok.status, ok.score, ok.reward) == ("ok", 10.0, 1.0)
    assert "Reference answer: 4\nReply: 4" in scripted.seen[0][-1]["content"]
    unparsed = asyncio.run(judge.judge("2+2?", "5"))
    assert (unparsed.status, unparsed.reward) == ("unparsed", None)
    assert "no 'Score: N' line" in unparsed.error
    assert asyncio.run(judge.judge("2+2?", "5")).reward == 0.4
    slow = asyncio.run(_judge(Scripted("Score: 10", delay=30), timeout_s=0.1).judge("q", "r"))
    assert (slow.status, slow.reward) == ("timeout", None)
    down = asyncio.run(_judge(Scripted(fail=True)).judge("q", "r"))
    assert down.status == "error"
    assert "ConnectionError: judge server down" in down.error
    with pytest.raises(ValueError, match="max_score"):
        LLMJudge(scripted, rubric="x", min_score=5, max_score=5)


@pytest.mark.timeout(30)
def test_rubric_env_a_judge_that_times_out_gives_no_reward_and_is_counted() -> None:
    reply: Message = {"role": "assistant", "content": "4"}
    ok = asyncio.run(RubricEnv("2+2?", _judge(Scripted("Score: 8"))).step(reply))
    assert ok.reward == 0.8
    assert (ok.metrics["judge/ok"], ok.metrics["judge/timeout"], ok.metrics["judge/score"]) == (1, 0, 0.8)
    late = asyncio.run(RubricEnv("2+2?", _judge(Scripted("Score: 8", delay=30), timeout_s=0.1)).step(reply))
    assert late.reward == 0.0
    assert late.episode_done
    assert (late.metrics["judge/timeout"], late.metrics[MASK_TURN]) == (1, 1)
    kept = RubricEnv("2+2?", _judge(Scripted("no idea")), on_judge_failure="penalty")
    result = asyncio.run(kept.step(reply))
    assert (result.reward, result.metrics["judge/unparsed"]) == (0.0, 1)
    assert MASK_TURN not in result.metrics


def test_rubric_group_builder_conformance(renderer: BaseRenderer) -> None:
    check_env_group_builder(RubricGroupBuilder("2+2?", renderer, _judge(Scripted()), group_size=2))


WORDS = [WordEntry("cat", "animal"), WordEntry("dog", "animal"), WordEntry("red", "color")]


def test_shipped_words_and_normalise_answer() -> None:
    words = load_words()
    assert len(words) == 36
    assert WordEntry("cat", "animal") in words
    assert [normalise_answer(t) for t in ["Yes", " no.", "NO!", "maybe", ""]] == [
        "Yes.",
        "No.",
        "No.",
        None,
        None,
    ]


def _step(env: TwentyQuestionsEnv, text: str):  # type: ignore[no-untyped-def]
    return asyncio.run(env.step({"role": "assistant", "content": text}))


@pytest.mark.timeout(30)
def test_twenty_questions_game() -> None:
    answerer = Scripted("Yes, it is.", "No.", "perhaps")
    env = TwentyQuestionsEnv(WORDS[1], WORDS, answerer, max_turns=5, turn_cost=0.1)
    first = asyncio.run(env.initial_messages())
    assert "animal: cat, dog\ncolor: red" in first[0]["content"]
    s1 = _step(env, "Is it an animal?")
    assert s1.next_messages[-1] == {"role": "user", "content": "Yes."}
    assert answerer.seen[0][0]["content"] == "Secret word: dog (category: animal). Answer yes or no."
    s2 = _step(env, "Is it a cat or a dog?")  # names two words: no win
    assert s2.metrics["twenty_q/multi_guess"] == 1
    assert not s2.episode_done
    s3 = _step(env, "Is it red?")
    assert s3.next_messages[-1]["content"] == "(no answer)"
    assert s3.metrics["twenty_q/answer_invalid"] == 1
    win = _step(env, "Is it a DOG?")
    assert win.episode_done
    assert win.reward == pytest.approx(0.7)
    assert (win.metrics["twenty_q/won"], win.metrics["twenty_q/turns"]) == (1, 4)
    with pytest.raises(RuntimeError, match="single-use"):
        _step(env, "dog")


@pytest.mark.timeout(30)
def test_twenty_questions_answerer_faults_and_the_turn_limit() -> None:
    env = TwentyQuestionsEnv(WORDS[0], WORDS, Scripted(delay=30), max_turns=2, answer_timeout_s=0.1)
    s1 = _step(env, "Is it a color?")
    assert s1.metrics["twenty_q/answer_timeout"] == 1
    assert s1.next_messages[-1]["content"] == "(no answer)"
    s2 = _step(env, "Is it red?")
    assert s2.episode_done
    assert (s2.reward, s2.metrics["twenty_q/won"]) == (0.0, 0)
    down = TwentyQuestionsEnv(WORDS[0], WORDS, Scripted(fail=True))
    assert _step(down, "Is it red?").metrics["twenty_q/answer_error"] == 1
    with pytest.raises(ValueError, match="not among the words"):
        TwentyQuestionsEnv(WordEntry("zebra", "animal"), WORDS, Scripted())


@pytest.mark.timeout(60)
def test_twenty_questions_builder_and_dataset(renderer: BaseRenderer) -> None:
    builder = TwentyQuestionsGroupBuilder(WORDS[0], WORDS, renderer, Scripted(), group_size=2, max_turns=3)
    check_env_group_builder(builder)
    ds = TwentyQuestionsDataset(
        WORDS, WORDS, renderer, Scripted(), batch_size=2, group_size=3, n_batches=4, seed=1
    )
    batch = ds.get_batch(2)
    assert len(ds) == 4
    assert [b.secret for b in batch] == [b.secret for b in ds.get_batch(2)]  # type: ignore[attr-defined]
    envs = asyncio.run(batch[0].make_envs())
    assert len(envs) == 3
    assert all(isinstance(e, MessageEnvAdapter) for e in envs)


def test_twenty_questions_test_groups_play_the_training_rules() -> None:
    """The task's test groups come from its training dataset's ``group``: every word, the
    task's ``eval_samples`` games each, with the training games' turns, cost and answerer."""
    task = TwentyQuestionsTask(max_turns=3, turn_cost=0.1, eval_samples=2, group_size=4, batch_size=2)
    answerer = Scripted()
    games = task.games(answerer)
    assert (games.batch_size, games.group_size, games.max_turns, games.turn_cost) == (2, 4, 3, 0.1)
    assert [g.group_size for g in games.get_batch(0)] == [4, 4]  # type: ignore[attr-defined]
    one = games.group(WORDS[0], 5)
    assert (one.secret, one.group_size, one.max_turns, one.turn_cost, one.answerer) == (
        WORDS[0],
        5,
        3,
        0.1,
        answerer,
    )
    tests = task.eval_builders(answerer)
    assert [b.secret for b in tests] == load_words()
    assert {(b.group_size, b.max_turns, b.turn_cost) for b in tests} == {(2, 3, 0.1)}
    assert all(b.answerer is answerer for b in tests)


def test_helper_models_default_to_the_policy_and_refuse_anything_else(service: ServiceClient) -> None:
    """A judge's or answerer's model is one ``HelperModel``: unset parts are the policy's."""
    with pytest.raises(TypeError, match="answerer_model"):
        TwentyQuestionsTask(answerer_model="tempering/tiny")  # type: ignore[arg-type]
    policy = TwentyQuestionsTask(renderer_name="role_colon", service=service)
    answerer = asyncio.run(policy.answerer())
    assert isinstance(answerer, SamplingMessageCompleter)
    assert (answerer.renderer.name, answerer.max_tokens) == ("role_colon", 6)
    own = TwentyQuestionsTask(
        renderer_name="role_colon", answerer_model=HelperModel(renderer_name="chatml"), service=service
    )
    assert asyncio.run(own.helper_completer(own.answerer_model, max_tokens=3)).renderer.name == "chatml"
    judge = asyncio.run(RubricTask(judge_max_tokens=9, judge_timeout_s=5.0, service=service).judge())
    assert isinstance(judge.completer, SamplingMessageCompleter)
    assert (judge.completer.max_tokens, judge.timeout_s) == (9, 5.0)

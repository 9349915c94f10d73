"""Shipped environments: the conformance kit on each, rewards, message-level policies,
multi-turn prefix merging, self-play games and preference tournaments."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs
import pytest
import tinker

from tempering.data.hub import MathProblem
from tempering.envs import (
    MessageEnvAdapter,
    MessageStepResult,
    NimGroupBuilder,
    PairwisePreferenceGroupBuilder,
    Problem,
    ProblemDataset,
    ProblemGroupBuilder,
    exact_match,
    first_number_match,
    lowercase_fraction,
    tournament_scores,
)
from tempering.envs.code import CodeDataset, CodeGrading, CodeProblem
from tempering.envs.math import MathDataset, MathRewards
from tempering.envs.tasks import ArithmeticTask, ChatProblems, LowercaseTask
from tempering.renderers import BaseRenderer
from tempering.rl.data import trajectories_to_datums
from tempering.tools.sandbox import LocalSandbox
from tempering_protocols import MASK_TURN, Env, EnvGroupBuilder, Message, Observation, StopCondition
from tempering_protocols.testing import check_env, check_env_group_builder, check_rl_dataset_builder


def _say(renderer: BaseRenderer, text: str) -> list[int]:
    """The tokens of an assistant reply ``text`` (ended by the stop token)."""
    stop = renderer.get_stop_sequences()[0]
    assert isinstance(stop, int)
    return [*renderer.tokenizer.encode(text, add_special_tokens=False), stop]


class LongerIsBetter:
    """A deterministic preference model: the longer completion wins; equal lengths tie."""

    async def __call__(self, prompt: Sequence[Message], a: Sequence[Message], b: Sequence[Message]) -> float:
        la, lb = len(a[-1]["content"]), len(b[-1]["content"])
        return 1.0 if la > lb else 0.0 if la < lb else 0.5


class FirstIsBetter:
    """A fully position-biased preference model."""

    async def __call__(self, prompt: Sequence[Message], a: Sequence[Message], b: Sequence[Message]) -> float:
        return 1.0


@attrs.define
class CountingChat:
    """A two-turn message env: reward 1 per reply equal to the turn number."""

    turns: int = 2
    history: list[Message] = attrs.field(factory=lambda: [{"role": "user", "content": "count"}])

    async def initial_messages(self) -> Sequence[Message]:
        return list(self.history)

    async def step(self, message: Message, /) -> MessageStepResult:
        turn = sum(m["role"] == "assistant" for m in self.history) + 1
        reward = float(message["content"] == str(turn))
        self.history += [message, {"role": "user", "content": "next"}]
        return MessageStepResult(
            reward=reward, episode_done=turn >= self.turns, next_messages=list(self.history)
        )


@attrs.frozen
class CountingGroup(EnvGroupBuilder):
    renderer: BaseRenderer = attrs.field(eq=False)
    group_size: int = 3
    max_context_tokens: int | None = None

    async def make_envs(self) -> list[MessageEnvAdapter]:
        return [
            MessageEnvAdapter(CountingChat(), self.renderer, max_context_tokens=self.max_context_tokens)
            for _ in range(self.group_size)
        ]


def test_problem_group_conformance_and_rewards(renderer: BaseRenderer) -> None:
    builder = ProblemGroupBuilder(Problem("What is 2 + 2?", "4"), renderer, exact_match, group_size=3)
    right = check_env_group_builder(builder, actions=lambda ob, stop: _say(renderer, "4"))
    assert right.get_total_rewards() == [1.0, 1.0, 1.0]
    wrong = check_env_group_builder(builder, actions=lambda ob, stop: _say(renderer, "5"))
    assert wrong.get_total_rewards() == [0.0, 0.0, 0.0]
    # No stop token: unparsed, so the format penalty applies.
    unparsed = check_env_group_builder(builder, actions=lambda ob, stop: [ord("4")])
    assert unparsed.get_total_rewards() == pytest.approx([0.9] * 3)
    assert unparsed.trajectories_G[0].transitions[0].metrics["format"] == 0.0


def test_graders() -> None:
    assert first_number_match("the answer is 42.", "42") == 1.0
    assert first_number_match("41 or 42", "42") == 0.0
    assert lowercase_fraction("abC!", "") == 0.5
    assert lowercase_fraction("", "") == 0.0
    assert exact_match(" 7\n", "7") == 1.0


def test_problem_dataset_is_deterministic_and_covers_epochs(renderer: BaseRenderer) -> None:
    problems = [Problem(f"q{i}", str(i)) for i in range(5)]
    ds = ProblemDataset(problems, renderer, exact_match, batch_size=2, group_size=2, seed=3, n_batches=7)
    assert len(ds) == 7
    assert ds.get_batch(4) == ds.get_batch(4)
    first_epoch = [b.problem for i in range(2) for b in ds.get_batch(i)]  # type: ignore[attr-defined]
    assert len(set(first_epoch)) == 4


def test_datasets_give_each_group_their_settings(renderer: BaseRenderer) -> None:
    """Every single-reply family's dataset builds its groups with its group size, system prompt
    and tag (``SeededBatches.group_settings``) and its own grading and prompt fields."""
    shared = {"group_size": 3, "system_prompt": "Be brief.", "tag": "t"}
    problems = ProblemDataset(
        [Problem("q", "a")], renderer, exact_match, batch_size=1, format_coef=0.25, **shared
    )
    rewards = MathRewards()
    maths = MathDataset(
        [MathProblem("q", "1", "row")], renderer, rewards, batch_size=1, instruction="Box it.", **shared
    )
    grading = CodeGrading(sandbox=LocalSandbox())
    code = CodeDataset(
        [CodeProblem("f", "Write f.", ("assert f()",))], renderer, grading, batch_size=1, **shared
    )
    for ds in (problems, maths, code):
        assert ds.group_settings() == shared
    p, m, c = problems.get_batch(0)[0], maths.get_batch(0)[0], code.get_batch(0)[0]
    for group in (p, m, c):
        assert (group.group_size, group.system_prompt, group.tag) == (3, "Be brief.", "t")  # type: ignore[attr-defined]
    assert (p.grader, p.format_coef) == (exact_match, 0.25)  # type: ignore[attr-defined]
    assert (m.rewards, m.instruction) == (rewards, "Box it.")  # type: ignore[attr-defined]
    assert c.grading is grading  # type: ignore[attr-defined]


@pytest.mark.parametrize("task", [LowercaseTask(n_batches=3), ArithmeticTask(batch_size=4, group_size=2)])
def test_task_builders_conform(task: object, renderer: BaseRenderer) -> None:
    check_rl_dataset_builder(task, actions=lambda ob, stop: _say(renderer, "12"))


def test_multi_turn_message_env_merges_into_one_datum(renderer: BaseRenderer) -> None:
    assert renderer.extends_prefix

    def count(ob: Observation, stop: StopCondition) -> list[int]:
        return _say(renderer, str(renderer.decode(ob.to_ints()).count("assistant")))

    group = check_env_group_builder(CountingGroup(renderer), actions=count)
    assert [len(t.transitions) for t in group.trajectories_G] == [2, 2, 2]
    assert group.get_total_rewards() == [2.0, 2.0, 2.0]
    data_D, meta_D = trajectories_to_datums([group], [[0.5, 0.0, -0.5]])
    assert len(data_D) == 3  # one datum per two-turn trajectory
    assert [m["traj_idx"] for m in meta_D] == [0, 1, 2]


def test_message_env_parse_error_policies(renderer: BaseRenderer) -> None:
    async def run(policy: str) -> tuple[float, dict[str, float | int]]:
        env = MessageEnvAdapter(CountingChat(), renderer, on_parse_error=policy, penalty=-2.0)  # type: ignore[arg-type]
        await env.initial_observation()
        result = await env.step([ord("1")])  # no stop token: unparseable
        assert result.episode_done
        return result.reward, result.metrics

    reward, metrics = asyncio.run(run("penalty"))
    assert reward == -2.0
    assert metrics["message/parse_error"] == 1
    assert MASK_TURN not in metrics
    reward, metrics = asyncio.run(run("mask"))
    assert reward == 0.0
    assert metrics[MASK_TURN] == 1


def test_message_env_context_overflow(renderer: BaseRenderer) -> None:
    group = check_env_group_builder(
        CountingGroup(renderer, max_context_tokens=30), actions=lambda ob, stop: _say(renderer, "1")
    )
    for traj in group.trajectories_G:
        assert len(traj.transitions) == 1
        assert traj.transitions[0].metrics["message/context_overflow"] == 1
        assert traj.transitions[0].reward == 1.0 - 1.0


def test_message_adapter_alone_passes_check_env(renderer: BaseRenderer) -> None:
    check_env(
        MessageEnvAdapter(CountingChat(turns=3), renderer), actions=lambda ob, stop: _say(renderer, "1")
    )


def _nim_moves(
    renderer: BaseRenderer, moves: dict[int, str]
) -> Callable[[Observation, StopCondition], list[int]]:
    def act(ob: Observation, stop: StopCondition) -> list[int]:
        text = renderer.decode(ob.to_ints())
        pile = int(text.rsplit("Pile: ", 1)[1].split(".", 1)[0])
        return _say(renderer, moves.get(pile, "1"))

    return act


def test_nim_conformance_with_forfeit(renderer: BaseRenderer) -> None:
    # The kit plays members one after another: player 0 waits for player 1, who is not playing
    # yet, so player 0 wins by forfeit after turn_timeout_s; the game never hangs.
    group = check_env_group_builder(
        NimGroupBuilder(renderer, pile=5, turn_timeout_s=0.02), actions=lambda ob, stop: _say(renderer, "1")
    )
    assert group.final_rewards_G == [1.0, -1.0]


async def _play_nim(
    builder: NimGroupBuilder, policy: Callable[[Observation, StopCondition], list[int]]
) -> list[tuple[float, dict[str, float | int]]]:
    envs = list(await builder.make_envs())

    async def play(env: Env) -> list[float]:
        ob, stop = await env.initial_observation()
        rewards = []
        while True:
            result = await env.step(policy(ob, stop))
            rewards.append(result.reward)
            if result.episode_done:
                return rewards
            ob, stop = result.next_observation, result.next_stop_condition

    await asyncio.gather(*(play(e) for e in envs))
    return await builder.compute_group_rewards([], envs)


def test_nim_turn_taking_decides_the_winner(renderer: BaseRenderer) -> None:
    # Pile 5, both take 1 except at pile 3, where the mover takes 3 and wins.
    # p0: 5->4, p1: 4->3, p0: takes 3 -> wins.
    scored = asyncio.run(
        _play_nim(NimGroupBuilder(renderer, pile=5, n_games=2), _nim_moves(renderer, {3: "3"}))
    )
    assert [r for r, _ in scored] == [1.0, -1.0, 1.0, -1.0]
    # An invalid move loses at once.
    scored = asyncio.run(_play_nim(NimGroupBuilder(renderer, pile=5), _nim_moves(renderer, {5: "9"})))
    assert [r for r, _ in scored] == [-1.0, 1.0]


def test_nim_unparseable_reply_loses_at_once(renderer: BaseRenderer) -> None:
    # A reply without the stop token does not parse: that player's episode ends, and it loses at
    # once (the opponent is not left waiting turn_timeout_s for a move that never comes).
    def garbled_at_4(ob: Observation, stop: StopCondition) -> list[int]:
        text = renderer.decode(ob.to_ints())
        pile = int(text.rsplit("Pile: ", 1)[1].split(".", 1)[0])
        return renderer.tokenizer.encode("2", add_special_tokens=False) if pile == 4 else _say(renderer, "1")

    builder = NimGroupBuilder(renderer, pile=5, n_games=2, turn_timeout_s=60)
    # p0: 5->4; p1 garbles at 4 and loses.
    scored = asyncio.run(asyncio.wait_for(_play_nim(builder, garbled_at_4), timeout=10))
    assert [r for r, _ in scored] == [1.0, -1.0, 1.0, -1.0]


def test_tournament_scores_with_a_deterministic_model() -> None:
    prompt: list[Message] = [{"role": "user", "content": "hi"}]
    completions: list[Message] = [{"role": "assistant", "content": "x" * n} for n in (3, 1, 2, 2)]
    scores = asyncio.run(tournament_scores(LongerIsBetter(), prompt, completions))
    assert scores == pytest.approx([1.0, 0.0, 0.5, 0.5])
    assert sum(scores) == pytest.approx(len(completions) / 2)
    # Symmetric comparison cancels a pure position bias; asymmetric keeps it.
    assert asyncio.run(tournament_scores(FirstIsBetter(), prompt, completions)) == [0.5] * 4
    assert asyncio.run(
        tournament_scores(FirstIsBetter(), prompt, completions, symmetric=False)
    ) == pytest.approx([1.0, 2 / 3, 1 / 3, 0.0])


def test_preference_group_scores_a_tournament(renderer: BaseRenderer) -> None:
    prompt: list[Message] = [{"role": "user", "content": "say something long"}]
    builder = PairwisePreferenceGroupBuilder(prompt, renderer, LongerIsBetter(), group_size=3)
    replies = itertools.cycle(["aaa", "a", "aa"])
    group = check_env_group_builder(builder, actions=lambda ob, stop: _say(renderer, next(replies)))
    by_length = sorted(
        zip(
            (len(t.transitions[0].ac.tokens) for t in group.trajectories_G),
            group.final_rewards_G,
            strict=True,
        )
    )
    assert [r for _, r in by_length] == pytest.approx([0.0, 0.5, 1.0])
    assert [m["preference/win_rate"] for m in group.metrics_G] == pytest.approx(list(group.final_rewards_G))


def test_observations_are_model_inputs(renderer: BaseRenderer) -> None:
    env = asyncio.run(ProblemGroupBuilder(Problem("q", "a"), renderer, exact_match).make_envs())[0]
    ob, stop = asyncio.run(env.initial_observation())
    assert isinstance(ob, tinker.ModelInput)
    assert stop == renderer.get_stop_sequences()


def test_chat_problems_task(tmp_path: Path) -> None:
    """ChatProblems: a chat file's first user turns and replies as an RL task; its reward is
    reward_coef x exact match (0: none, for pure distillation); conversations that do not start
    with a user turn answered by the assistant are left out; a file with none is refused."""
    chats = tmp_path / "chats.jsonl"
    rows = [
        [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "5"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Hi"}],
        [{"role": "user", "content": "Reverse the word \"ab\"."}, {"role": "assistant", "content": "ba"}],
    ]  # fmt: skip
    chats.write_text("".join(json.dumps({"messages": r}) + "\n" for r in rows))
    train, test = asyncio.run(ChatProblems(train_path=str(chats), test_path=str(chats), group_size=2)())
    assert [p.question for p in train.problems] == ["What is 2 + 3?", 'Reverse the word "ab".']
    assert [p.answer for p in train.problems] == ["5", "ba"]
    assert train.grader(" 5", "5") == 1.0
    assert train.grader("6", "5") == 0.0
    assert test is not None
    assert len(test.problems) == 2
    silent, none = asyncio.run(ChatProblems(train_path=str(chats), reward_coef=0.0)())
    assert silent.grader("5", "5") == 0.0
    assert none is None
    check_rl_dataset_builder(ChatProblems(train_path=str(chats), group_size=2))
    only_system = tmp_path / "system.jsonl"
    only_system.write_text(json.dumps({"messages": rows[1]}) + "\n")
    with pytest.raises(ValueError, match=r"ChatProblems.train_path .*system.jsonl: no conversation"):
        asyncio.run(ChatProblems(train_path=str(only_system))())
    with pytest.raises(ValueError, match="reward_coef must be >= 0"):
        ChatProblems(train_path=str(chats), reward_coef=-1.0)

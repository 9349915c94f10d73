"""Guess the number: feedback, endings, rewards, invalid replies, single use, the conformance kit,
the dataset, the scripted players and the episode summary."""

from __future__ import annotations

import asyncio
import pickle
import random
from collections.abc import Callable, Iterator, Sequence

import pytest

from tempering.envs import (
    GuessNumberDataset,
    GuessNumberEnv,
    GuessNumberGame,
    GuessNumberGroupBuilder,
    GuessNumberRules,
    GuessNumberStats,
    GuessNumberTask,
    guess_number_stats,
)
from tempering.envs.guess_number import (
    bisect_guess,
    feasible_range,
    guess_feedback,
    play_scripted,
    random_consistent_guess,
    split_secrets,
)
from tempering.envs.message import MessageStepResult
from tempering.renderers import BaseRenderer
from tempering_protocols import Message, Observation, StopCondition, Trajectory
from tempering_protocols.rendering import decode_text
from tempering_protocols.testing import check_env, check_env_group_builder, check_rl_dataset_builder


def _say(renderer: BaseRenderer, text: str) -> list[int]:
    stop = renderer.get_stop_sequences()[0]
    assert isinstance(stop, int)
    return [*renderer.tokenizer.encode(text, add_special_tokens=False), stop]


def _reply(game: GuessNumberGame, text: str) -> MessageStepResult:
    return asyncio.run(game.step({"role": "assistant", "content": text}))


def _bisect_actions(
    renderer: BaseRenderer, low: int = 0, high: int = 15
) -> Callable[[Observation, StopCondition], list[int]]:
    """An action policy for the kit: decode the conversation, answer with bisection."""

    def act(ob: Observation, stop: StopCondition) -> list[int]:
        text = decode_text(renderer.tokenizer, ob.to_ints())
        messages: list[Message] = []
        for chunk in text.split("<|im_start|>")[1:]:
            role, _, content = chunk.partition("\n")
            messages.append({"role": role, "content": content.split("<|im_end|>")[0]})
        return _say(renderer, str(bisect_guess(messages, low, high, random.Random(0))))

    return act


def test_feedback_and_episode() -> None:
    assert [guess_feedback(5, g) for g in (3, 5, 9)] == ["higher", "correct", "lower"]
    game = GuessNumberGame(11, low=0, high=15, max_turns=5, turn_cost=0.1)
    assert asyncio.run(game.initial_messages()) == [
        {"role": "user", "content": "Guess a number from 0 to 15."}
    ]
    first = _reply(game, "8")
    assert not first.episode_done
    assert first.reward == 0.0
    assert first.next_messages[-2:] == [
        {"role": "assistant", "content": "8"},
        {"role": "user", "content": "higher"},
    ]
    assert _reply(game, " 13 ").next_messages[-1]["content"] == "lower"
    assert feasible_range(game.history, 0, 15) == (9, 12)
    wasted = _reply(game, "14")  # legal, but already ruled out
    assert wasted.metrics["guess/inconsistent"] == 1
    assert not wasted.episode_done
    hit = _reply(game, "11")
    assert hit.episode_done
    assert hit.reward == pytest.approx(1.0 - 0.1 * 3)
    assert hit.metrics["correct"] == 1
    assert hit.metrics["guess/turns"] == 4
    assert hit.metrics["guess/invalid"] == 0
    with pytest.raises(RuntimeError, match="single-use"):
        _reply(game, "11")


def test_max_turns_ends_without_reward() -> None:
    game = GuessNumberGame(3, low=0, high=15, max_turns=2)
    assert not _reply(game, "9").episode_done
    last = _reply(game, "8")
    assert last.episode_done
    assert last.reward == 0.0
    assert last.metrics["correct"] == 0
    assert last.metrics["guess/found"] == 0
    assert last.metrics["guess/turns"] == 2


@pytest.mark.parametrize("text", ["sixteen", "16", "-1", "3.5", "", "7 8"])
def test_invalid_guess_ends_with_penalty(text: str) -> None:
    game = GuessNumberGame(3, low=0, high=15, invalid_reward=-0.5)
    result = _reply(game, text)
    assert result.episode_done
    assert result.reward == -0.5
    assert result.metrics["guess/invalid"] == 1
    assert result.metrics["correct"] == 0


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError, match=r"secret 20 is outside 0\.\.15"):
        GuessNumberGame(20)
    with pytest.raises(ValueError, match="max_turns"):
        GuessNumberRules(max_turns=0)
    with pytest.raises(ValueError, match=r"GuessNumberGroupBuilder: secret 20 is outside 0\.\.15"):
        GuessNumberGroupBuilder(None, secret=20)  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match=r"n_test_secrets must be in 0\.\.15"):
        GuessNumberTask(n_test_secrets=16)
    with pytest.raises(ValueError, match="low <= high"):
        GuessNumberTask(rules=GuessNumberRules(low=9, high=3))


def test_token_env_unparseable_reply_is_invalid(renderer: BaseRenderer) -> None:
    env = GuessNumberEnv(GuessNumberGame(3, invalid_reward=-1.0), renderer)
    asyncio.run(env.initial_observation())
    no_stop = renderer.tokenizer.encode("12", add_special_tokens=False)  # truncated: no stop token
    result = asyncio.run(env.step(no_stop))
    assert result.episode_done
    assert result.reward == -1.0
    assert result.metrics["message/parse_error"] == 1
    assert result.metrics["guess/invalid"] == 1
    assert result.metrics["correct"] == 0
    with pytest.raises(RuntimeError, match="single-use"):
        asyncio.run(env.step(_say(renderer, "3")))


def test_observation_extends_the_previous_turn(renderer: BaseRenderer) -> None:
    env = GuessNumberEnv(GuessNumberGame(3), renderer)
    ob, _ = asyncio.run(env.initial_observation())
    action = _say(renderer, "8")
    result = asyncio.run(env.step(action))
    assert result.next_observation.to_ints()[: ob.length + len(action)] == [*ob.to_ints(), *action]


def test_conformance_and_bisection_always_wins(renderer: BaseRenderer) -> None:
    check_env_group_builder(GuessNumberGroupBuilder(renderer, secret=5, group_size=3))  # garbage actions
    for secret in range(16):
        group = check_env_group_builder(
            GuessNumberGroupBuilder(renderer, secret=secret, group_size=2),  # 5 turns: bisection finds 0..15
            actions=_bisect_actions(renderer),
        )
        assert all(r > 0 for r in group.get_total_rewards()), secret
    traj = check_env(
        GuessNumberEnv(GuessNumberGame(0, max_turns=3), renderer), actions=_bisect_actions(renderer)
    )
    assert [t.metrics.get("correct") for t in traj.transitions] == [None, None, 0]


def test_group_builder_pickles(renderer: BaseRenderer) -> None:
    rules = GuessNumberRules(low=1, high=100, max_turns=7)
    builder = GuessNumberGroupBuilder(renderer, secret=7, rules=rules, group_size=4)
    copy = pickle.loads(pickle.dumps(builder))
    assert copy == builder
    envs = asyncio.run(copy.make_envs())
    assert len(envs) == 4
    assert len({id(e) for e in envs}) == 4
    assert all(isinstance(e, GuessNumberEnv) and e.game.secret == 7 for e in envs)
    assert all(isinstance(e, GuessNumberEnv) and (e.game.high, e.game.max_turns) == (100, 7) for e in envs)


def test_task_splits_secrets_and_is_deterministic() -> None:
    train, test = split_secrets(0, 15, n_test=4, seed=0)
    assert len(train) == 12
    assert len(test) == 4
    assert not set(train) & set(test)
    assert set(train) | set(test) == set(range(16))
    assert split_secrets(0, 15, n_test=4, seed=0) == (train, test)
    assert split_secrets(0, 15, n_test=4, seed=1) != (train, test)
    task = GuessNumberTask(n_test_secrets=4, batch_size=3, group_size=2, test_group_size=5, n_batches=7)
    check_rl_dataset_builder(task)
    train_ds, test_ds = asyncio.run(task())
    assert isinstance(train_ds, GuessNumberDataset)
    assert isinstance(test_ds, GuessNumberDataset)
    assert len(train_ds) == 7
    assert len(test_ds) == 1
    seen = {
        b.secret for i in range(7) for b in train_ds.get_batch(i) if isinstance(b, GuessNumberGroupBuilder)
    }
    assert seen <= set(train)
    (test_batch,) = [test_ds.get_batch(0)]
    assert sorted(b.secret for b in test_batch if isinstance(b, GuessNumberGroupBuilder)) == list(test)
    assert all(isinstance(b, GuessNumberGroupBuilder) and b.group_size == 5 for b in test_batch)
    _, every = asyncio.run(GuessNumberTask(rules=GuessNumberRules(low=1, high=6), n_test_secrets=0)())
    assert every is not None
    assert sorted(b.secret for b in every.get_batch(0) if isinstance(b, GuessNumberGroupBuilder)) == [
        1,
        2,
        3,
        4,
        5,
        6,
    ]


def test_scripted_players() -> None:
    rng = random.Random(0)
    for secret in range(16):
        bisect = GuessNumberGame(secret, max_turns=5)
        play_scripted(bisect, bisect_guess, rng)
        assert bisect.found
        assert bisect.turns <= 5
    results: list[GuessNumberGame] = []
    for i in range(400):
        game = GuessNumberGame(i % 16, max_turns=5)
        messages = play_scripted(game, random_consistent_guess, rng)
        assert messages[-1]["role"] == "assistant"
        results.append(game)
    assert not any(g.invalid for g in results)
    success = sum(g.found for g in results) / len(results)
    assert 0.65 < success < 0.9  # about 77%: legal but slower than bisection


def _stats_of(games: Sequence[tuple[int, Sequence[str]]], renderer: BaseRenderer) -> GuessNumberStats:
    """Play each ``(secret, replies)`` game through the token env; summarise the episodes."""
    trajectories: list[Trajectory] = []
    for secret, replies in games:
        it = iter(replies)

        def act(ob: Observation, stop: StopCondition, it: Iterator[str] = it) -> list[int]:
            return _say(renderer, next(it, "0"))  # "0": the kit's step after the end

        trajectories.append(
            check_env(GuessNumberEnv(GuessNumberGame(secret, max_turns=3), renderer), actions=act)
        )
    return guess_number_stats(trajectories)


def test_stats(renderer: BaseRenderer) -> None:
    stats = _stats_of([(5, ["5"]), (5, ["1", "9", "5"]), (5, ["1", "0", "2"]), (5, ["x"])], renderer)
    assert stats.episodes == 4
    assert stats.success == 0.5
    assert stats.turns == pytest.approx((1 + 3 + 3 + 1) / 4)
    assert stats.turns_found == 2.0
    assert stats.invalid == 0.25
    assert stats.inconsistent == pytest.approx(1 / 7)  # "0" after "1 -> higher"

"""The conformance kit passes correct implementations and behaves as documented."""

from __future__ import annotations

import asyncio

import pytest
import tinker

from tempering_protocols import Message, Observation, StopCondition, TrainOnWhat
from tempering_protocols.testing import (
    CHECKS,
    Conformance,
    ConformanceError,
    acheck_env,
    acheck_env_group_builder,
    acheck_rl_dataset,
    acheck_token_completer,
    check_conformance,
    check_env,
    check_env_group_builder,
    check_message_completer,
    check_renderer,
    check_rl_dataset,
    check_rl_dataset_builder,
    check_supervised_dataset,
    check_supervised_dataset_builder,
    check_token_completer,
    default_actions,
    detect_kind,
)

from . import example_env
from .kit_cases_rl import NeverDone, OneStepEnv, OneStepGroup, RecordsCleanup
from .kit_cases_supervised import TinyDataset, TinyDatasetBuilder
from .kit_cases_text import (
    EchoCompleter,
    FixedCompleter,
    NoLogprobs,
    ToyRenderer,
    ToyTextRenderer,
    array_policy,
)

# ---------------------------------------------------------------------------- RL


def test_check_env_returns_the_played_trajectory() -> None:
    trajectory = check_env(OneStepEnv())
    assert [t.ac.tokens for t in trajectory.transitions] == [[1, 2, 3, 0]]
    assert trajectory.total_reward == 1.0


def test_check_env_plays_with_the_given_policy() -> None:
    seen: list[tuple[list[int], StopCondition]] = []

    def guess_three(ob: Observation, stop: StopCondition) -> list[int]:
        seen.append((ob.to_ints(), stop))
        return [3, example_env.END]

    trajectory = check_env(example_env.GuessEnv(secret=7, max_turns=3), actions=guess_three)
    assert len(trajectory.transitions) == 3
    assert trajectory.total_reward == 0.0
    # three turns, then one more action for the step the finished env must refuse
    first, second, _, after_done = seen
    assert first == ([example_env.PROMPT], [example_env.END])
    assert second[0] == [example_env.PROMPT, 3, example_env.END, example_env.HIGHER]
    assert after_done[0] == trajectory.final_ob.to_ints()


def test_bisecting_policy_solves_the_example() -> None:
    for secret in range(10):
        trajectory = check_env(example_env.GuessEnv(secret), actions=example_env.bisect_actions)
        assert trajectory.total_reward == 1.0


def test_default_actions_appends_a_stop_token_id_only() -> None:
    ob = tinker.ModelInput.from_ints([9])
    assert default_actions(ob, [42]) == [1, 2, 3, 42]
    assert default_actions(ob, ["</s>"]) == [1, 2, 3]
    assert default_actions(ob, []) == [1, 2, 3]


def test_a_policy_returning_non_tokens_is_a_usage_error() -> None:
    with pytest.raises(TypeError, match="action policy"):
        check_env(OneStepEnv(), actions=lambda ob, stop: "1 2 3")  # pyright: ignore[reportArgumentType]


def test_passing_a_class_instead_of_an_instance_is_a_usage_error() -> None:
    with pytest.raises(TypeError, match="OneStepEnv is a class; pass an instance"):
        check_env(OneStepEnv)


def test_check_env_group_builder_returns_the_scored_group() -> None:
    group = check_env_group_builder(example_env.GuessGroup(secret=4), actions=example_env.bisect_actions)
    assert len(group.trajectories_G) == 4
    # bisection finds 4 on the first guess ((0 + 9) // 2 == 4): everyone is fastest
    assert group.get_total_rewards() == [1.5, 1.5, 1.5, 1.5]
    assert group.metrics_G[0] == {"guess/fastest": 1.0}


def test_builder_with_protocol_defaults_passes() -> None:
    group = check_env_group_builder(OneStepGroup(size=2))
    assert list(group.final_rewards_G) == [0.0, 0.0]


def test_cleanup_runs_when_a_rule_fails() -> None:
    builder = RecordsCleanup()
    with pytest.raises(ConformanceError, match=r"^\[builder/group-rewards-length\]"):
        check_env_group_builder(builder)
    assert builder.cleaned == ["cleanup"]


def test_rl_dataset_and_builder_pass() -> None:
    check_rl_dataset(example_env.GuessDataset(), indices=[0, 3, 7], builders_per_batch=2)
    check_rl_dataset_builder(example_env.GuessDatasetBuilder())


def test_rl_dataset_checks_the_last_batch_by_default() -> None:
    class FailsLast(example_env.GuessDataset):
        def get_batch(self, index: int, /) -> list[example_env.GuessGroup]:
            if index == len(self) - 1:
                raise IndexError(index)
            return [example_env.GuessGroup(1)]

    with pytest.raises(ConformanceError, match=r"\[rl-dataset/raised\] FailsLast.get_batch\(7\)"):
        check_rl_dataset(FailsLast())
    check_rl_dataset(FailsLast(), indices=[0, 1])


# ---------------------------------------------------------------------------- supervised


def test_supervised_dataset_and_builder_pass() -> None:
    check_supervised_dataset(TinyDataset())
    check_supervised_dataset(TinyDataset(n_batches=5), indices=range(5), seed=3)
    check_supervised_dataset_builder(TinyDatasetBuilder())


def test_supervised_check_leaves_datasets_reseeded_as_asked() -> None:
    dataset = TinyDataset()
    check_supervised_dataset(dataset, seed=11)
    assert dataset.seed == 11


# ---------------------------------------------------------------------------- text


@pytest.mark.parametrize("renderer", [ToyRenderer(), ToyTextRenderer()], ids=["stop-token", "stop-string"])
def test_renderers_pass(renderer: object) -> None:
    check_renderer(renderer)


def test_renderer_needs_a_conversation_ending_with_the_assistant() -> None:
    with pytest.raises(ValueError, match="ending with an assistant message"):
        check_renderer(ToyRenderer(), messages=[{"role": "user", "content": "hi"}])


def test_toy_renderer_weights_follow_train_on_what() -> None:
    # The kit relies on the toy renderer being right; pin it.
    messages: list[Message] = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d"},
    ]
    last = ToyRenderer().build_supervised_example(messages)
    every = ToyRenderer().build_supervised_example(messages, TrainOnWhat.ALL_ASSISTANT_MESSAGES)
    assert last.weights.tolist() == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1]
    assert every.weights.tolist() == [0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1]


def test_completers_pass() -> None:
    assert check_token_completer(FixedCompleter()).tokens == [7, 8, 0]
    assert check_token_completer(array_policy, prompt=tinker.ModelInput.from_ints([5]), stop=["\n"])
    assert check_token_completer(NoLogprobs(), require_logprobs=False).maybe_logprobs is None
    assert check_token_completer(example_env.UniformGuesser()).stop_reason == "stop"
    assert check_message_completer(EchoCompleter())["role"] == "assistant"


def test_a_bad_stop_argument_is_a_usage_error() -> None:
    with pytest.raises(TypeError, match="stop must be"):
        check_token_completer(FixedCompleter(), stop=[1, "x"])  # pyright: ignore[reportArgumentType]


# ---------------------------------------------------------------------------- sync and async


def test_sync_checks_refuse_to_run_inside_an_event_loop() -> None:
    async def inside_a_loop() -> None:
        check_env(OneStepEnv())

    with pytest.raises(RuntimeError, match=r"await acheck_env\(\.\.\.\)"):
        asyncio.run(inside_a_loop())


def test_async_variants_run_inside_an_event_loop() -> None:
    async def inside_a_loop() -> None:
        assert (await acheck_env(OneStepEnv())).total_reward == 1.0
        group = await acheck_env_group_builder(example_env.GuessGroup(2))
        assert len(group.trajectories_G) == 4
        await acheck_rl_dataset(example_env.GuessDataset(), indices=[1])
        assert (await acheck_token_completer(FixedCompleter())).tokens == [7, 8, 0]
        with pytest.raises(ConformanceError, match=r"^\[env/never-finishes\]"):
            await acheck_env(NeverDone(), max_steps=3)

    asyncio.run(inside_a_loop())


# ---------------------------------------------------------------------------- dispatch


@pytest.mark.parametrize(
    ("subject", "kind"),
    [
        (OneStepEnv(), "env"),
        (OneStepGroup(), "env_group_builder"),
        (example_env.GuessDataset(), "rl_dataset"),
        (example_env.GuessDatasetBuilder(), "rl_dataset_builder"),
        (TinyDataset(), "supervised_dataset"),
        (TinyDatasetBuilder(), "supervised_dataset_builder"),
        (ToyRenderer(), "renderer"),
        (FixedCompleter(), "token_completer"),
        (array_policy, "token_completer"),
        (EchoCompleter(), "message_completer"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_detect_kind_and_check_conformance(subject: object, kind: str) -> None:
    assert detect_kind(subject) == kind
    check_conformance(subject)


def test_detect_kind_refuses_what_it_cannot_tell() -> None:
    with pytest.raises(TypeError, match="cannot tell which tempering protocol"):
        detect_kind(42)


def test_conformance_object_carries_every_check() -> None:
    kit = Conformance()
    for check in CHECKS.values():
        assert getattr(kit, check.__name__) is check
    assert kit.check is check_conformance

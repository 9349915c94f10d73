"""Rollouts with a scripted policy: the shared first turn, concurrency bound, failures counted
by type, timeouts, retries, viable groups, budgets, masking, cleanup, the process-pool executor."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import attrs
import pytest
import tinker

from tempering.envs import Problem, ProblemGroupBuilder, exact_match
from tempering.local.tiny import build_tiny_tokenizer
from tempering.renderers import get_renderer
from tempering.rl.executors import InlineExecutor, ProcessPoolExecutor
from tempering.rl.policy import GroupTokenCompleter, SeedableTokenCompleter, sampling_seed
from tempering.rl.rollouts import (
    MASK_TURN,
    GroupRollout,
    RolloutConfig,
    RolloutLimits,
    rollout_batch,
    rollout_group,
)
from tempering.rl.schedules import StaleGroupFilter, is_fresh
from tempering.rl.train import rollout_metrics
from tempering_protocols import (
    Action,
    Env,
    EnvGroupBuilder,
    Observation,
    StepResult,
    StopCondition,
    TokensWithLogprobs,
)

STOP = 0


@attrs.define
class ScriptedPolicy:
    """Answers ``answer`` (then the stop token); counts requests and the most in flight."""

    answer: list[int] = attrs.field(factory=lambda: [7])
    delay: float = 0.0
    version: int = 0
    requests: list[int] = attrs.field(factory=list[int])
    in_flight: int = 0
    max_in_flight: int = 0

    def _ac(self) -> TokensWithLogprobs:
        tokens = [*self.answer, STOP]
        return TokensWithLogprobs(tokens=tokens, maybe_logprobs=[-0.5] * len(tokens))

    async def _wait(self, n: int) -> None:
        self.requests.append(n)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(self.delay)
        self.in_flight -= 1

    async def __call__(self, model_input: Observation, stop: StopCondition, /) -> TokensWithLogprobs:
        await self._wait(1)
        return self._ac()

    async def sample_group(
        self, model_input: Observation, stop: StopCondition, n: int, /
    ) -> Sequence[TokensWithLogprobs]:
        await self._wait(n)
        return [self._ac() for _ in range(n)]


@attrs.define
class TurnsEnv(Env):
    """``turns`` turns; reward 1 per turn whose action starts with 7. Can fail, hang or mask."""

    prompt: tuple[int, ...] = (1, 2)
    turns: int = 1
    fail_at: int | None = None
    hang: bool = False
    mask_turns: bool = False
    log: list[str] | None = None
    t: int = 0

    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        return tinker.ModelInput.from_ints(list(self.prompt)), [STOP]

    async def step(self, action: Action, /) -> StepResult:
        if self.hang:
            await asyncio.sleep(10)
        if self.fail_at == self.t:
            raise KeyError("env bug")
        self.t += 1
        done = self.t >= self.turns
        return StepResult(
            reward=float(action[0] == 7),
            episode_done=done,
            next_observation=tinker.ModelInput.from_ints([3]),
            next_stop_condition=[STOP],
            metrics={MASK_TURN: 1} if self.mask_turns else {},
        )


@attrs.define(eq=False)
class Group(EnvGroupBuilder):
    """Members built from ``specs``; counts ``make_envs`` and ``cleanup`` calls."""

    specs: list[dict[str, object]]
    made: int = 0
    cleaned: int = 0
    fail_make: bool = False

    async def make_envs(self) -> list[Env]:
        self.made += 1
        if self.fail_make:
            raise OSError("no sandbox")
        # Retries (made > 1) get healthy envs.
        if self.made > 1:
            return [TurnsEnv() for _ in self.specs]
        return [TurnsEnv(**spec) for spec in self.specs]  # type: ignore[arg-type]

    async def cleanup(self) -> None:
        self.cleaned += 1


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


def test_shared_first_turn_is_one_request_with_num_samples_g() -> None:
    policy = ScriptedPolicy()
    r = asyncio.run(rollout_group(Group([{}] * 4), policy, RolloutConfig()))
    assert policy.requests == [4]
    assert r.group is not None
    assert r.group.get_total_rewards() == [1.0] * 4
    assert r.n_sample_requests == 1


def test_different_first_observations_sample_one_by_one() -> None:
    policy = ScriptedPolicy()
    asyncio.run(rollout_group(Group([{"prompt": (1,)}, {"prompt": (2,)}]), policy, RolloutConfig()))
    assert policy.requests == [1, 1]
    policy = ScriptedPolicy()
    asyncio.run(rollout_group(Group([{}] * 3), policy, RolloutConfig(share_first_turn=False)))
    assert policy.requests == [1, 1, 1]


def test_multi_turn_after_shared_first_turn() -> None:
    policy = ScriptedPolicy()
    r = asyncio.run(rollout_group(Group([{"turns": 3}] * 2), policy, RolloutConfig()))
    assert policy.requests == [2, 1, 1, 1, 1]
    assert r.group is not None
    assert [len(t.transitions) for t in r.group.trajectories_G] == [3, 3]


def test_sampling_concurrency_is_bounded() -> None:
    policy = ScriptedPolicy(delay=0.01)
    config = RolloutConfig(max_concurrent_samples=2, share_first_turn=False)
    out = asyncio.run(rollout_batch([Group([{}] * 3) for _ in range(4)], policy, config))
    assert len(out) == 4
    assert policy.max_in_flight == 2
    assert len(policy.requests) == 12


def test_failing_env_fails_its_rollout_not_the_run() -> None:
    builder = Group([{}, {"fail_at": 0}, {}, {}])
    r = asyncio.run(rollout_group(builder, ScriptedPolicy(), RolloutConfig(min_group_fraction=0.5)))
    assert r.failures == {"rollout/failed/KeyError": 1}
    assert r.n_failed == 1
    assert r.group is not None
    assert len(r.group.trajectories_G) == 3
    assert builder.cleaned == 1


def test_group_below_min_fraction_is_dropped_and_cleaned() -> None:
    builder = Group([{}, {"fail_at": 0}])
    r = asyncio.run(rollout_group(builder, ScriptedPolicy(), RolloutConfig(min_group_fraction=1.0)))
    assert r.group is None
    assert builder.cleaned == 1
    assert rollout_metrics([r])["env/frac_groups_failed"] == 1.0
    assert rollout_metrics([r])["rollout/failed/KeyError"] == 1.0


def test_make_envs_failure_is_counted() -> None:
    builder = Group([{}], fail_make=True)
    r = asyncio.run(rollout_group(builder, ScriptedPolicy(), RolloutConfig()))
    assert r.group is None
    assert r.failures == {"rollout/failed/OSError": 1}
    assert builder.cleaned == 1


def test_timeout_then_retry_on_a_fresh_env() -> None:
    builder = Group([{}, {"hang": True}])
    config = RolloutConfig(rollout_timeout_s=0.05, max_retries=1)
    r = asyncio.run(rollout_group(builder, ScriptedPolicy(), config))
    assert r.failures == {"rollout/failed/TimeoutError": 1}
    assert r.group is not None
    assert len(r.group.trajectories_G) == 2
    assert builder.made == 2


def test_turn_and_token_budgets_end_episodes() -> None:
    r = asyncio.run(rollout_group(Group([{"turns": 10}]), ScriptedPolicy(), RolloutConfig(max_turns=3)))
    assert r.group is not None
    assert len(r.group.trajectories_G[0].transitions) == 3
    assert r.end_reasons_G == ["max_turns"]
    assert r.group.trajectories_G[0].transitions[-1].episode_done
    config = RolloutConfig(max_trajectory_tokens=5)  # 2 tokens a turn: ends after the third turn
    r = asyncio.run(rollout_group(Group([{"turns": 10}]), ScriptedPolicy(), config))
    assert r.group is not None
    assert r.end_reasons_G == ["token_budget"]
    assert len(r.group.trajectories_G[0].transitions) == 3


def test_masked_turns_are_marked() -> None:
    r = asyncio.run(rollout_group(Group([{"mask_turns": True}]), ScriptedPolicy(), RolloutConfig()))
    assert r.group is not None
    assert r.group.trajectories_G[0].transitions[0].masked


def test_inline_executor_is_identity_and_limits_are_shared() -> None:
    builder = Group([{}])
    assert InlineExecutor().place(builder) is builder

    async def two() -> None:
        limits = RolloutLimits.from_config(RolloutConfig(max_concurrent_samples=1))
        policy = ScriptedPolicy(delay=0.01)
        await asyncio.gather(
            *(rollout_group(Group([{}]), policy, RolloutConfig(), limits=limits) for _ in range(3))
        )
        assert policy.max_in_flight == 1

    asyncio.run(two())


def test_scripted_policy_is_a_group_completer() -> None:
    assert isinstance(ScriptedPolicy(), GroupTokenCompleter)


@attrs.define
class SeedLog:
    """What a :class:`SeededPolicy` saw: (seed, num_samples) of every request."""

    requests: list[tuple[int | None, int]] = attrs.field(factory=list[tuple[int | None, int]])


@attrs.frozen
class SeededPolicy:
    """A seedable group completer: answers 7, records each request's seed; the delay of a
    request depends on its seed, so requests finish in a seed-dependent, shuffled order."""

    log: SeedLog
    seed: int | None = None

    def with_seed(self, seed: int | None, /) -> SeededPolicy:
        return SeededPolicy(self.log, seed)

    async def __call__(self, model_input: Observation, stop: StopCondition, /) -> TokensWithLogprobs:
        (ac,) = await self.sample_group(model_input, stop, 1)
        return ac

    async def sample_group(
        self, model_input: Observation, stop: StopCondition, n: int, /
    ) -> Sequence[TokensWithLogprobs]:
        self.log.requests.append((self.seed, n))
        await asyncio.sleep(((self.seed or 0) % 7) / 1000)
        return [TokensWithLogprobs(tokens=[7, STOP], maybe_logprobs=[-0.5, -0.5]) for _ in range(n)]


def test_requests_are_seeded_by_their_place_in_the_group() -> None:
    assert isinstance(SeededPolicy(SeedLog()), SeedableTokenCompleter)
    assert sampling_seed(0, "train", 1) == sampling_seed(0, "train", 1)
    assert (
        len({sampling_seed(0, "train", 1), sampling_seed(0, "train", "1"), sampling_seed(1, "train", 1)}) == 3
    )

    def seeds(seed: int | None, share: bool = True) -> list[tuple[int | None, int]]:
        log = SeedLog()
        # Member 2 fails its first turn once and is retried on a fresh env (attempt 1).
        group = Group([{"turns": 3}, {"turns": 3}, {"turns": 3, "fail_at": 1}])
        config = RolloutConfig(max_retries=1, share_first_turn=share)
        r = run(rollout_group(group, SeededPolicy(log), config, seed=seed))
        assert isinstance(r, GroupRollout)
        assert r.group is not None
        assert r.seed == seed
        return log.requests

    def key(*parts: int | str) -> int:
        return sampling_seed(5, *parts)

    got = seeds(5)
    # The shared first turn, then turns 1-2 of each member; member 2 fails at its turn 1 and its
    # retry (a fresh, healthy one-turn env) samples turn 0 as attempt 1.
    expected = [(key("first"), 3)] + [
        (key("member", g, a, t), 1)
        for g, a, turns in [(0, 0, (1, 2)), (1, 0, (1, 2)), (2, 0, (1,)), (2, 1, (0,))]
        for t in turns
    ]
    assert sorted(got, key=str) == sorted(expected, key=str)
    assert len({s for s, _ in got}) == len(got)  # every request its own seed
    assert sorted(seeds(5), key=str) == sorted(got, key=str)  # whatever the completion order
    unshared = seeds(5, share=False)
    assert (key("member", 0, 0, 0), 1) in unshared
    assert all(s is None for s, _ in seeds(None))
    # A batch seeds its groups from its own seed.
    log = SeedLog()
    run(rollout_batch([Group([{}]), Group([{}])], SeededPolicy(log), RolloutConfig(), seed=9))
    assert sorted(s for s, _ in log.requests) == sorted(
        sampling_seed(sampling_seed(9, "group", p), "member", 0, 0, 0) for p in (0, 1)
    )


def test_process_pool_executor_runs_env_work_in_workers() -> None:
    renderer = get_renderer("chatml", build_tiny_tokenizer())
    stop = renderer.get_stop_sequences()[0]
    assert isinstance(stop, int)
    policy = ScriptedPolicy(answer=[ord("4")])
    policy_stop = [ord("4")]
    del policy_stop
    builders = [
        ProblemGroupBuilder(Problem("2+2?", "4"), renderer, exact_match, group_size=3) for _ in range(2)
    ]

    async def go() -> None:
        with ProcessPoolExecutor(num_workers=1) as pool:
            policy.answer = [ord("4"), stop]
            out = await rollout_batch(builders, policy, RolloutConfig(), executor=pool)
            for r in out:
                assert r.group is not None
                assert r.group.get_total_rewards() == [1.0, 1.0, 1.0]
            assert policy.requests == [3, 3]
            # A failure inside a worker arrives by its type name.
            bad = ProblemGroupBuilder(Problem("2+2?", "4"), renderer, _raising_grader, group_size=2)
            r = await rollout_group(bad, policy, RolloutConfig(min_group_fraction=0.0), executor=pool)
            assert r.failures == {"rollout/failed/ZeroDivisionError": 2}

    asyncio.run(go())


def _raising_grader(response: str, answer: str) -> float:
    return 1 / 0


@pytest.mark.parametrize(
    ("version", "step", "bound", "fresh"),
    [(5, 5, 0, True), (4, 5, 0, False), (3, 5, 2, True), (2, 5, 2, False), (0, 1, 1, True), (0, 2, 1, False)],
)
def test_off_policy_bound_is_exact(version: int, step: int, bound: int, fresh: bool) -> None:
    assert is_fresh(version, step, bound) is fresh
    f = StaleGroupFilter(bound)

    async def one() -> object:
        return await rollout_group(Group([{}]), ScriptedPolicy(version=version), RolloutConfig())

    rollout = asyncio.run(one())
    assert f.accept(rollout, step) is fresh  # type: ignore[arg-type]
    assert f.n_stale == (0 if fresh else 1)


class _Judge:
    """A judge's completer: ``Score: 10`` to its first call, then something without a score."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, messages: object, /) -> dict[str, str]:
        self.calls += 1
        return {"role": "assistant", "content": "Score: 10" if self.calls == 1 else "no idea"}


def test_env_step_metrics_reach_the_rollout_metrics() -> None:
    """An env's own namespaced metrics (the judge's counts here) are in the step's metrics:
    summed per episode, averaged over episodes."""
    from tempering.envs.judge import LLMJudge, RubricGroupBuilder

    renderer = get_renderer("chatml", build_tiny_tokenizer())
    judge = LLMJudge(_Judge(), rubric="10 if correct, else 0.", timeout_s=5.0)  # type: ignore[arg-type]
    builder = RubricGroupBuilder("2+2?", renderer, judge, reference="4", group_size=2)
    policy = ScriptedPolicy(answer=[ord("4"), *renderer.get_stop_sequences()])  # type: ignore[list-item]
    r = asyncio.run(rollout_group(builder, policy, RolloutConfig(share_first_turn=False)))
    metrics = rollout_metrics([r])
    assert metrics["env/judge/ok"] == 0.5
    assert metrics["env/judge/unparsed"] == 0.5
    assert metrics["env/judge/timeout"] == 0.0
    assert metrics["env/judge/score"] == 0.5  # 1.0 for the graded reply, 0 for the other
    masked = asyncio.run(
        rollout_group(
            Group([{"turns": 3, "mask_turns": True}, {"turns": 3}]), ScriptedPolicy(), RolloutConfig()
        )
    )
    assert rollout_metrics([masked])["env/turn/masked"] == 1.5  # 3 masked turns over 2 episodes

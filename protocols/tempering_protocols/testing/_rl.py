"""Conformance checks for ``Env``, ``EnvGroupBuilder``, ``RLDataset`` and ``RLDatasetBuilder``."""

from __future__ import annotations

import functools
import math
import pickle
from collections.abc import Callable, Sequence
from typing import TypeAlias, cast

import tinker

from tempering_protocols.rl import Env, EnvGroupBuilder, RLDataset, RLDatasetBuilder
from tempering_protocols.testing._base import (
    METRICS_TYPE,
    STOP_CONDITION_TYPE,
    ConformanceError,
    acall,
    call,
    expect_type,
    name_of,
    pickle_round_trip,
    run_sync,
    short_repr,
)
from tempering_protocols.testing._structure import check_object_implements, object_problem
from tempering_protocols.types import (
    Action,
    Observation,
    StepResult,
    StopCondition,
    TokensWithLogprobs,
    Trajectory,
    TrajectoryGroup,
    Transition,
)

__all__ = [
    "ActionPolicy",
    "acheck_env",
    "acheck_env_group_builder",
    "acheck_rl_dataset",
    "acheck_rl_dataset_builder",
    "check_env",
    "check_env_group_builder",
    "check_rl_dataset",
    "check_rl_dataset_builder",
    "default_actions",
]

ActionPolicy: TypeAlias = Callable[[Observation, StopCondition], Action]
"""What the kit plays an env with: ``(observation, stop condition) -> action tokens``.

Example::

    def always_answer_seven(observation, stop):
        return [7, 0]   # the answer, then the stop token (id 0 here)
"""

DEFAULT_MAX_STEPS = 64


def default_actions(observation: Observation, stop: StopCondition, /) -> Action:
    """The kit's default policy: tokens ``[1, 2, 3]``, then the first stop token when stop is by id.

    Example::

        default_actions(tinker.ModelInput.from_ints([7]), [0])      # [1, 2, 3, 0]
        default_actions(tinker.ModelInput.from_ints([7]), ["\\n"])  # [1, 2, 3]
    """
    del observation
    first = stop[0] if stop else None
    return [1, 2, 3] if not isinstance(first, int) else [1, 2, 3, first]


def _is_action(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) for t in cast(list[object], value))


def _policy_action(actions: ActionPolicy, ob: Observation, stop: StopCondition) -> Action:
    """One action from the caller's policy; a wrong type is the caller's bug, not the env's."""
    action = actions(ob, stop)
    if not _is_action(action):
        raise TypeError(f"the action policy {name_of(actions)} returned {short_repr(action)}, not list[int]")
    return action


def _check_step_result(result: object, what: str) -> StepResult:
    rule = "env/step-type"
    expect_type(result, StepResult, rule=rule, what=f"{what} must return a StepResult")
    step = cast(StepResult, result)
    expect_type(step.reward, float, rule=rule, what=f"{what}: StepResult.reward must be a float")
    expect_type(step.episode_done, bool, rule=rule, what=f"{what}: StepResult.episode_done must be a bool")
    expect_type(
        step.next_observation,
        tinker.ModelInput,
        rule=rule,
        what=f"{what}: StepResult.next_observation must be a tinker.ModelInput",
    )
    expect_type(
        step.next_stop_condition,
        STOP_CONDITION_TYPE,
        rule=rule,
        what=f"{what}: StepResult.next_stop_condition must be list[str] or list[int]",
    )
    expect_type(step.metrics, METRICS_TYPE, rule=rule, what=f"{what}: StepResult.metrics must be Metrics")
    if not math.isfinite(step.reward):
        raise ConformanceError("env/reward-not-finite", f"{what} returned reward {step.reward}")
    return step


async def _play(env: object, actions: ActionPolicy, max_steps: int, where: str = "") -> Trajectory:
    """Run every env rule on ``env`` (consuming it) and return the trajectory it played.

    ``where`` says where the env came from, for messages (e.g. `` (member 2 of MyGroup)``).
    """
    name = name_of(env) + where
    check_object_implements(env, Env, where)
    if hasattr(env, "reset"):
        raise ConformanceError(
            "env/no-reset",
            f"{name} has reset(); envs are single-use: EnvGroupBuilder.make_envs builds fresh ones",
        )
    the_env = cast(Env, env)
    first = await acall("env/raised", f"{name}.initial_observation()", the_env.initial_observation)
    expect_type(
        first,
        tuple[tinker.ModelInput, STOP_CONDITION_TYPE],
        rule="env/initial-observation-type",
        what=f"{name}.initial_observation() must return (tinker.ModelInput, list[str] | list[int])",
    )
    ob, stop = first
    transitions: list[Transition] = []
    last: StepResult | None = None
    for step_index in range(max_steps):
        action = _policy_action(actions, ob, stop)
        what = f"{name}.step({short_repr(action, 60)}) (step {step_index})"
        result = await acall("env/raised", what, functools.partial(the_env.step, action))
        step = _check_step_result(result, what)
        transitions.append(
            Transition(
                ob=ob,
                ac=TokensWithLogprobs(tokens=action, maybe_logprobs=[0.0] * len(action)),
                reward=step.reward,
                episode_done=step.episode_done,
                metrics=step.metrics,
            )
        )
        if step.episode_done:
            last = step
            break
        ob, stop = step.next_observation, step.next_stop_condition
    if last is None:
        raise ConformanceError(
            "env/never-finishes",
            f"{name} did not set episode_done within max_steps={max_steps} steps of {name_of(actions)}",
        )
    final_ob = last.next_observation
    extra = _policy_action(actions, final_ob, last.next_stop_condition)
    try:
        await acall("env/raised", f"{name}.step() after episode_done", functools.partial(the_env.step, extra))
    except ConformanceError as err:
        if err.rule == "env/timeout":
            raise
        # refused, as it must be
    else:
        raise ConformanceError(
            "env/step-after-done",
            f"{name} accepted step() after episode_done; a finished env must raise (envs are single-use)",
        )
    return Trajectory(transitions=transitions, final_ob=final_ob)


async def acheck_env(
    env: object, /, *, actions: ActionPolicy = default_actions, max_steps: int = DEFAULT_MAX_STEPS
) -> Trajectory:
    """Async variant of :func:`check_env`, for use inside a running event loop.

    Example::

        trajectory = await acheck_env(MyEnv())
    """
    return await _play(env, actions, max_steps)


def check_env(
    env: object, /, *, actions: ActionPolicy = default_actions, max_steps: int = DEFAULT_MAX_STEPS
) -> Trajectory:
    """Play ``env`` to the end with ``actions`` and check every ``Env`` rule; return the trajectory.

    The env is consumed (envs are single-use). Rules: the ``protocol/*`` structure rules,
    ``env/no-reset``, ``env/initial-observation-type``, ``env/step-type``,
    ``env/reward-not-finite``, ``env/never-finishes`` (no ``episode_done`` within ``max_steps``),
    ``env/step-after-done`` (a finished env must refuse another step) and ``env/raised``.

    Example::

        trajectory = check_env(Reverse([5, 6, 7], stop_token=0),
                               actions=lambda ob, stop: [7, 6, 5, 0])
        assert trajectory.total_reward == 1.0
    """
    return run_sync(acheck_env(env, actions=actions, max_steps=max_steps), "check_env")


async def _make_envs(builder: EnvGroupBuilder, name: str) -> list[Env]:
    envs = await acall("builder/raised", f"{name}.make_envs()", builder.make_envs)
    what = f"{name}.make_envs() must return a sequence of Env"
    expect_type(envs, Sequence[object], rule="builder/make-envs-type", what=what)
    envs_G = list(cast(Sequence[object], envs))
    for member, env in enumerate(envs_G):
        problem = object_problem(env, Env)
        if problem is not None:
            raise ConformanceError("builder/make-envs-type", f"{what}: member {member}: {problem}")
    if not envs_G:
        raise ConformanceError("builder/empty-group", f"{name}.make_envs() returned no envs")
    return cast(list[Env], envs_G)


async def _check_builder(
    builder: object, actions: ActionPolicy, max_steps: int, where: str = ""
) -> TrajectoryGroup:
    name = name_of(builder) + where
    check_object_implements(builder, EnvGroupBuilder, where)
    the_builder = cast(EnvGroupBuilder, builder)
    clone = pickle_round_trip(the_builder, rule="builder/pickle", what=name)
    try:
        envs_G = await _make_envs(the_builder, name)
        G = len(envs_G)
        if len({id(env) for env in envs_G}) != G:
            raise ConformanceError(
                "builder/fresh-envs", f"{name}.make_envs() returned the same env object twice in one group"
            )
        again_G = await _make_envs(the_builder, name)
        if {id(env) for env in envs_G} & {id(env) for env in again_G}:
            raise ConformanceError(
                "builder/fresh-envs",
                f"{name}.make_envs() returned an env it had returned before; each call must build fresh envs",
            )
        try:
            clone_G = await _make_envs(clone, name)
        finally:
            await acall("builder/raised", f"{name}.cleanup() (unpickled copy)", clone.cleanup)
        if len(clone_G) != G:
            raise ConformanceError(
                "builder/pickle",
                f"{name} made {G} envs but its unpickled copy made {len(clone_G)}",
            )

        trajectories_G = [
            await _play(env, actions, max_steps, f" (member {g} of {name})") for g, env in enumerate(envs_G)
        ]
        rewards = await acall(
            "builder/raised",
            f"{name}.compute_group_rewards()",
            lambda: the_builder.compute_group_rewards(trajectories_G, envs_G),
        )
        what = f"{name}.compute_group_rewards() must return list[tuple[float, Metrics]]"
        expect_type(rewards, list[object], rule="builder/group-rewards-type", what=what)
        if len(rewards) != G:
            raise ConformanceError(
                "builder/group-rewards-length",
                f"{name}.compute_group_rewards() returned {len(rewards)} (reward, metrics) pairs "
                f"for a group of {G}; it must return one per member",
            )
        expect_type(rewards, list[tuple[float, METRICS_TYPE]], rule="builder/group-rewards-type", what=what)
        if not all(math.isfinite(reward) for reward, _ in rewards):
            raise ConformanceError(
                "builder/group-rewards-type", f"{name}.compute_group_rewards() returned a non-finite reward"
            )
        tags = call("builder/raised", f"{name}.logging_tags()", the_builder.logging_tags)
        expect_type(
            tags,
            list[str],
            rule="builder/logging-tags-type",
            what=f"{name}.logging_tags() must return list[str]",
        )
    finally:
        await acall("builder/raised", f"{name}.cleanup()", the_builder.cleanup)
    return TrajectoryGroup(
        trajectories_G=trajectories_G,
        final_rewards_G=[reward for reward, _ in rewards],
        metrics_G=[metrics for _, metrics in rewards],
    )


async def acheck_env_group_builder(
    builder: object, /, *, actions: ActionPolicy = default_actions, max_steps: int = DEFAULT_MAX_STEPS
) -> TrajectoryGroup:
    """Async variant of :func:`check_env_group_builder`.

    Example::

        group = await acheck_env_group_builder(ReverseGroup(prompt=(5, 6, 7)))
    """
    return await _check_builder(builder, actions, max_steps)


def check_env_group_builder(
    builder: object, /, *, actions: ActionPolicy = default_actions, max_steps: int = DEFAULT_MAX_STEPS
) -> TrajectoryGroup:
    """Check an ``EnvGroupBuilder``: pickling, fresh envs, every env's rules, group rewards.

    Builds the group, plays each env to the end with ``actions`` (running :func:`check_env`'s
    rules on each), scores the group and calls ``cleanup``. Returns the scored group.
    Rules: ``builder/pickle`` (round-trips and the copy makes as many envs),
    ``builder/make-envs-type``, ``builder/empty-group``, ``builder/fresh-envs`` (distinct envs,
    new on every call), ``builder/group-rewards-length`` (one ``(reward, metrics)`` per member),
    ``builder/group-rewards-type``, ``builder/logging-tags-type``, ``builder/raised``, and all
    ``env/*`` rules.

    Example::

        group = check_env_group_builder(ReverseGroup(prompt=(5, 6, 7)))
        assert len(group.trajectories_G) == 8
    """
    return run_sync(
        acheck_env_group_builder(builder, actions=actions, max_steps=max_steps), "check_env_group_builder"
    )


def _same_builder(a: object, b: object) -> bool:
    if type(a) is not type(b):
        return False
    if type(a).__eq__ is not object.__eq__:
        return bool(a == b)
    try:
        return pickle.dumps(a) == pickle.dumps(b)
    except Exception:
        return False


def _dataset_length(dataset: object) -> int:
    name = name_of(dataset)
    try:
        n = len(cast(Sequence[object], dataset))
    except Exception as exc:
        raise ConformanceError("rl-dataset/len", f"len({name}) failed: {type(exc).__name__}: {exc}") from exc
    if n <= 0:
        raise ConformanceError("rl-dataset/len", f"len({name}) is 0; the kit needs a batch to check")
    return n


def _indices(n: int, indices: Sequence[int] | None) -> list[int]:
    return sorted({0, n - 1}) if indices is None else list(indices)


def _rl_batch(dataset: RLDataset, name: str, index: int) -> list[EnvGroupBuilder]:
    batch = call("rl-dataset/raised", f"{name}.get_batch({index})", lambda: dataset.get_batch(index))
    what = f"{name}.get_batch({index}) must return a sequence of EnvGroupBuilder"
    expect_type(batch, Sequence[object], rule="rl-dataset/batch-type", what=what)
    builders_P = list(cast(Sequence[object], batch))
    for p, builder in enumerate(builders_P):
        problem = object_problem(builder, EnvGroupBuilder)
        if problem is not None:
            raise ConformanceError("rl-dataset/batch-type", f"{what}: item {p}: {problem}")
    if not builders_P:
        raise ConformanceError("rl-dataset/empty-batch", f"{name}.get_batch({index}) returned no builders")
    return cast(list[EnvGroupBuilder], builders_P)


async def _check_rl_dataset(
    dataset: object,
    indices: Sequence[int] | None,
    builders_per_batch: int,
    actions: ActionPolicy,
    max_steps: int,
) -> None:
    name = name_of(dataset)
    check_object_implements(dataset, RLDataset)
    the_dataset = cast(RLDataset, dataset)
    n = _dataset_length(dataset)
    for index in _indices(n, indices):
        builders_P = _rl_batch(the_dataset, name, index)
        for p, builder in enumerate(builders_P):
            where = f" (item {p} of {name}.get_batch({index}))"
            pickle_round_trip(builder, rule="builder/pickle", what=name_of(builder) + where)
        again_P = _rl_batch(the_dataset, name, index)
        same = len(builders_P) == len(again_P) and all(
            _same_builder(a, b) for a, b in zip(builders_P, again_P, strict=True)
        )
        if not same:
            raise ConformanceError(
                "rl-dataset/deterministic",
                f"{name}.get_batch({index}) returned different builders when called twice",
            )
        for p, builder in enumerate(builders_P[:builders_per_batch]):
            await _check_builder(builder, actions, max_steps, f" (item {p} of {name}.get_batch({index}))")


async def acheck_rl_dataset(
    dataset: object,
    /,
    *,
    indices: Sequence[int] | None = None,
    builders_per_batch: int = 1,
    actions: ActionPolicy = default_actions,
    max_steps: int = DEFAULT_MAX_STEPS,
) -> None:
    """Async variant of :func:`check_rl_dataset`.

    Example::

        await acheck_rl_dataset(MyDataset(batch_size=4))
    """
    await _check_rl_dataset(dataset, indices, builders_per_batch, actions, max_steps)


def check_rl_dataset(
    dataset: object,
    /,
    *,
    indices: Sequence[int] | None = None,
    builders_per_batch: int = 1,
    actions: ActionPolicy = default_actions,
    max_steps: int = DEFAULT_MAX_STEPS,
) -> None:
    """Check an ``RLDataset``: its length, batch types, determinism, and its builders.

    Checks the batches at ``indices`` (default: the first and the last). Each must be a
    non-empty sequence of builders, equal when fetched twice (compared with ``==`` when the
    builder defines it, else by pickled bytes), and every builder must pickle; the first
    ``builders_per_batch`` builders of each get the full :func:`check_env_group_builder`.
    Rules: ``rl-dataset/len``, ``rl-dataset/batch-type``, ``rl-dataset/empty-batch``,
    ``rl-dataset/deterministic``, ``rl-dataset/raised``, and the ``builder/*`` and ``env/*`` rules.

    Example::

        check_rl_dataset(MyDataset(batch_size=4), indices=[0, 1])
    """
    run_sync(
        acheck_rl_dataset(
            dataset,
            indices=indices,
            builders_per_batch=builders_per_batch,
            actions=actions,
            max_steps=max_steps,
        ),
        "check_rl_dataset",
    )


async def acheck_rl_dataset_builder(
    builder: object,
    /,
    *,
    indices: Sequence[int] | None = None,
    actions: ActionPolicy = default_actions,
    max_steps: int = DEFAULT_MAX_STEPS,
) -> None:
    """Async variant of :func:`check_rl_dataset_builder`.

    Example::

        await acheck_rl_dataset_builder(MyDatasetConfig(batch_size=4))
    """
    name = name_of(builder)
    check_object_implements(builder, RLDatasetBuilder)
    pickle_round_trip(builder, rule="rl-dataset-builder/pickle", what=name)
    the_builder = cast(RLDatasetBuilder, builder)
    built = await acall("rl-dataset-builder/raised", f"{name}()", the_builder)
    what = f"{name}() must return (RLDataset, RLDataset | None)"
    expect_type(built, tuple[object, object], rule="rl-dataset-builder/return-type", what=what)
    train, test = built
    for role, dataset in (("train", train), ("test", test)):
        if dataset is None and role == "test":
            continue
        problem = object_problem(dataset, RLDataset)
        if problem is not None:
            raise ConformanceError("rl-dataset-builder/return-type", f"{what}: the {role} dataset: {problem}")
        await _check_rl_dataset(dataset, indices, 1, actions, max_steps)


def check_rl_dataset_builder(
    builder: object,
    /,
    *,
    indices: Sequence[int] | None = None,
    actions: ActionPolicy = default_actions,
    max_steps: int = DEFAULT_MAX_STEPS,
) -> None:
    """Check an ``RLDatasetBuilder``: it pickles, and builds datasets that pass :func:`check_rl_dataset`.

    Rules: ``rl-dataset-builder/pickle``, ``rl-dataset-builder/return-type``,
    ``rl-dataset-builder/raised``, and the dataset rules for the train and the test dataset.

    Example::

        check_rl_dataset_builder(MyDatasetConfig(batch_size=4))
    """
    run_sync(
        acheck_rl_dataset_builder(builder, indices=indices, actions=actions, max_steps=max_steps),
        "check_rl_dataset_builder",
    )

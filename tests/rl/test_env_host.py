"""EnvHost: the env calls a worker process and a Ray actor serve, one group table for both."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Sequence

import attrs
import pytest
from ray_envs import WorkEnv, WorkGroup

from tempering.rl.executors import EnvHost
from tempering_protocols import Env, Metrics, Trajectory


@attrs.frozen
class _TurnsGroup(WorkGroup):
    """Rewards each member by the turns its env has played (shows which envs were passed)."""

    async def compute_group_rewards(
        self, trajectories_G: Sequence[Trajectory], envs_G: Sequence[Env], /
    ) -> list[tuple[float, Metrics]]:
        del trajectories_G
        return [(float(e.t), {}) for e in envs_G if isinstance(e, WorkEnv)]


def test_env_host_serves_a_group_from_make_envs_to_cleanup() -> None:
    async def main() -> None:
        host = EnvHost()
        assert await host.call("make_envs", 7, pickle.dumps(_TurnsGroup(group_size=2, turns=2))) == (0, 2)
        await host.call("initial_observation", 7, 1)
        step = await host.call("step", 7, 1, [7])
        assert getattr(step, "reward", None) == 1.0
        # a retry's fresh envs come after the first ones, made by the builder already there
        # (the bytes are not read again)
        assert await host.call("make_envs", 7, b"not a pickle") == (2, 2)
        await host.call("step", 7, 3, [7])
        await host.call("step", 7, 3, [7])
        assert await host.call("compute_group_rewards", 7, [], [1, 3, 2]) == [(1.0, {}), (2.0, {}), (0.0, {})]
        await host.call("cleanup", 7)
        with pytest.raises(LookupError, match="env group 7 is not in this worker"):
            await host.call("step", 7, 0, [7])
        with pytest.raises(ValueError, match="unknown op 'reset'; known: make_envs, initial_observation"):
            await host.call("reset", 7)

    asyncio.run(main())

"""Where an RL step's groups come from: the three sources of ``RLConfig.schedule``.

=============  ==================================================================================
schedule       source
=============  ==================================================================================
``sync``       :func:`in_order`: the step's groups, sampled with the newest weights, in batch order
``streaming``  :func:`as_completed`: the same groups, each as soon as it finishes
``async``      :class:`AsyncGroups`: a producer that starts batch ``i`` once
               ``i - steps submitted <= max_steps_off_policy``, and a queue of finished groups,
               filtered by :class:`StaleGroupFilter` (stale ones dropped or resampled)
=============  ==================================================================================

Example::

    source = AsyncGroups(prepare_rollout, batch, max_steps_off_policy=1, stale_policy="drop",
                         steps=range(0, 100))
    source.start()
    async for rollout in source.groups(step):   # until the step's groups are used up
        ...
    await source.submitted(step + 1)            # let the producer start the next batch

The schedules of the RL loop (``RLConfig.schedule``):

==============  ======================================================================================
schedule        groups of step ``s``
==============  ======================================================================================
``sync``        batch ``s`` sampled with the weights after step ``s-1``; all ``P`` groups finish,
                then the ``S`` minibatches train (on-policy)
``streaming``   batch ``s`` sampled with the weights after step ``s-1``; each minibatch trains as
                soon as ``ceil(P / S)`` groups have finished (in finishing order)
``async``       a producer samples batches ahead with the newest weights; step ``s`` takes the
                first ``P`` finished groups whose sampler version ``v`` has ``s - v <=
                max_steps_off_policy``; older ones are dropped or resampled (``stale_policy``),
                and counted. The producer never runs more than ``max_steps_off_policy`` batches
                ahead of training.
==============  ======================================================================================
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Literal

import attrs

from tempering.rl.rollouts import GroupRollout
from tempering_protocols import EnvGroupBuilder

__all__ = ["AsyncGroups", "StaleGroupFilter", "as_completed", "in_order", "is_fresh"]

PrepareRollout = Callable[[EnvGroupBuilder, int, int, int], Callable[[], Awaitable[GroupRollout]]]
"""``prepare(builder, batch, index, resample)``: the rollout of group ``index`` of step
``batch``'s batch with the newest weights (read when prepared), to run when called."""


def is_fresh(sampler_version: int, step: int, max_steps_off_policy: int) -> bool:
    """Whether samples from the weights of ``sampler_version`` may train step ``step``: at most
    ``max_steps_off_policy`` steps old (``step - sampler_version <= max_steps_off_policy``).

    Example::

        is_fresh(3, 5, 2)   # True: two steps old
        is_fresh(2, 5, 2)   # False: three steps old
    """
    return step - sampler_version <= max_steps_off_policy


@attrs.define
class StaleGroupFilter:
    """Sorts finished groups for step ``step``: fresh ones are used, stale ones are dropped (or
    handed back for resampling), and both are counted.

    Example::

        f = StaleGroupFilter(max_steps_off_policy=1)
        fresh = f.accept(rollout, step=4)   # False when rollout.version < 3
    """

    max_steps_off_policy: int
    n_stale: int = 0

    def accept(self, rollout: GroupRollout, step: int) -> bool:
        if is_fresh(rollout.version, step, self.max_steps_off_policy):
            return True
        self.n_stale += 1
        return False


async def in_order(tasks: Sequence[asyncio.Future[GroupRollout]]) -> AsyncIterator[GroupRollout]:
    """The ``sync`` schedule: every group of the step, in batch order, once all have finished."""
    for rollout in await asyncio.gather(*tasks):
        yield rollout


async def as_completed(tasks: Sequence[asyncio.Future[GroupRollout]]) -> AsyncIterator[GroupRollout]:
    """The ``streaming`` schedule: each group of the step as soon as it finishes."""
    for next_done in asyncio.as_completed(tasks):
        yield await next_done


@attrs.define(eq=False)
class AsyncGroups:
    """The ``async`` schedule: a producer that keeps sampling ahead of training (at most
    ``max_steps_off_policy`` steps), and the queue its finished groups wait in.

    ``prepare_rollout`` prepares one group's rollout with the newest weights; ``batch(step)`` is that step's
    builders; ``steps`` the steps this process runs.
    """

    _prepare_rollout: PrepareRollout
    _batch: Callable[[int], Sequence[EnvGroupBuilder]]
    max_steps_off_policy: int = attrs.field(kw_only=True)
    stale_policy: Literal["drop", "resample"] = attrs.field(kw_only=True)
    steps: range = attrs.field(kw_only=True)
    stale: StaleGroupFilter = attrs.field(init=False)
    queue: asyncio.Queue[tuple[GroupRollout, int, int]] = attrs.field(
        init=False, factory=lambda: asyncio.Queue[tuple[GroupRollout, int, int]]()
    )
    """Finished groups, with the step whose batch they came from and their resample count."""
    in_flight: int = attrs.field(init=False, default=0)
    producer: asyncio.Task[None] | None = attrs.field(init=False, default=None)
    trained: asyncio.Condition = attrs.field(init=False, factory=asyncio.Condition)
    steps_submitted: int = attrs.field(init=False)
    starved: bool = attrs.field(init=False, default=False)
    tasks: set[asyncio.Task[None]] = attrs.field(init=False, factory=lambda: set[asyncio.Task[None]]())

    def __attrs_post_init__(self) -> None:
        self.stale = StaleGroupFilter(self.max_steps_off_policy)
        self.steps_submitted = self.steps.start

    def start(self) -> None:
        """Start the producer (call from the event loop)."""
        self.producer = asyncio.ensure_future(self.produce())

    async def groups(self, step: int) -> AsyncIterator[GroupRollout]:
        """Fresh finished groups for ``step``, as they arrive (stale ones are dropped or
        resampled); ends when nothing more can arrive."""
        while True:
            if (
                self.queue.empty()
                and self.in_flight == 0
                and self.producer is not None
                and self.producer.done()
            ):
                return
            if self.queue.empty() and self.in_flight == 0:
                async with self.trained:  # nothing will arrive: let the producer start a batch
                    self.starved = True
                    self.trained.notify_all()
            rollout, batch, resample = await self.queue.get()
            if self.stale.accept(rollout, step):
                yield rollout
            elif self.stale_policy == "resample" and rollout.builder is not None:
                self.spawn(rollout.builder, batch, rollout.index, resample + 1)

    def spawn(self, builder: EnvGroupBuilder, batch: int, index: int, resample: int = 0) -> None:
        """Start group ``index`` of step ``batch``'s batch with the newest weights."""
        self.in_flight += 1
        rollout = self._prepare_rollout(builder, batch, index, resample)

        async def run() -> None:
            try:
                await self.queue.put((await rollout(), batch, resample))
            finally:
                self.in_flight -= 1

        task = asyncio.ensure_future(run())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def produce(self) -> None:
        """Batch ``i`` starts once ``i - steps submitted <= max_steps_off_policy``, with the
        newest weights."""
        for i in self.steps:
            async with self.trained:
                await self.trained.wait_for(
                    lambda i=i: self.starved or i - self.steps_submitted <= self.max_steps_off_policy
                )
                self.starved = False
            for p, b in enumerate(self._batch(i)):
                self.spawn(b, i, p)

    async def submitted(self, steps: int) -> None:
        """Record that ``steps`` steps have been submitted (their weights will sample next)."""
        async with self.trained:
            self.steps_submitted = steps
            self.trained.notify_all()

    def cancel(self) -> None:
        """Stop the producer and every group still sampling."""
        if self.producer is not None:
            self.producer.cancel()
        for task in list(self.tasks):
            task.cancel()

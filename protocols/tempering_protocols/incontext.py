"""In-context learning tasks: small discrete tasks, the source learners whose learning histories
algorithm distillation trains on, and the family (builder) that makes both.

A downstream package adds a task by implementing :class:`InContextTaskFamily`: tempering logs
its source learner's histories, serves them as a dataset in either format, trains a model on
them and evaluates the model in context (``tempering.ad``).

States and actions are small integers (``0..n_states-1``, ``0..n_actions-1``); an episode ends
after exactly ``horizon`` steps. ``describe_state`` / ``describe_action`` give the language
format its words.

Example::

    family = BanditFamily(n_arms=5)
    task = family.task(3, False)                 # one task: fixed arm probabilities
    learner = family.learner(task, 3)            # Thompson sampling, fresh
    s = task.reset()
    a, logprob = learner.act(s)
    s2, r = task.step(a)
    learner.update(s, a, r, s2, True)
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["InContextTask", "InContextTaskFamily", "SourceLearner"]


@runtime_checkable
class InContextTask(Protocol):
    """One task (fixed hidden parameters: arm probabilities, a goal), played for many episodes.

    Example::

        s = task.reset()
        s, r = task.step(2)
    """

    def reset(self) -> int:
        """Start an episode; the first state."""
        ...

    def step(self, action: int, /) -> tuple[int, float]:
        """Apply ``action``; the next state and the reward."""
        ...

    def optimal_return(self) -> float:
        """The best expected return of one episode (for regret)."""
        ...


@runtime_checkable
class SourceLearner(Protocol):
    """A learning algorithm improving on one task across episodes; its history is what the model
    distils.

    Example::

        a, logprob = learner.act(s)
        learner.update(s, a, r, s_next, done)
    """

    def act(self, state: int, /) -> tuple[int, float]:
        """The action for ``state`` and its log-probability under the learner's current policy."""
        ...

    def update(self, state: int, action: int, reward: float, next_state: int, done: bool, /) -> object:
        """Learn from one transition (``done``: it ended its episode)."""
        ...


@runtime_checkable
class InContextTaskFamily(Protocol):
    """A serializable config that builds tasks and source learners (the builder of a task kind).

    Example::

        task = family.task(7, False)
        learner = family.learner(task, 7)
    """

    @property
    def name(self) -> str: ...

    @property
    def n_states(self) -> int: ...

    @property
    def n_actions(self) -> int: ...

    @property
    def horizon(self) -> int: ...

    def task(self, seed: int, held_out: bool, /) -> InContextTask:
        """The task of ``seed`` in the training split, or in the held-out split (hidden parameters
        never trained on); the same arguments give the same hidden parameters."""
        ...

    def learner(self, task: InContextTask, seed: int, /) -> SourceLearner:
        """A fresh source learner for ``task``."""
        ...

    def describe_state(self, state: int, /) -> str:
        """The state in words (the language format)."""
        ...

    def describe_action(self, action: int, /) -> str:
        """The action in words (the language format; distinct per action)."""
        ...

"""A tempering RL run as a source of learning histories: RL on the token-level guess-number env
(:mod:`tempering.envs.guess_number`), every training number played every step, and its
trajectory log turned into learning histories of :class:`~tempering.ad.guess_env.GuessNumberEnvFamily`.

- :class:`GuessNumberSourceTask` (an ``RLDatasetBuilder``): each RL step is one group of ``G``
  games on every training number of the family (the even numbers of ``1..high``), under the
  env rules of the family (:func:`rules_of`: ``low=1``, its ``high``, its ``horizon`` turns), each
  group tagged ``secret=<n>`` so that the log says which number a game was on.
- :func:`rl_histories`: the RL run's trajectory log (``RLConfig(log_trajectories=True)``) as
  learning histories. The history of task ``(n, m)`` is the game of member ``m`` of the group on
  number ``n``, step after step: episode ``k`` was played by the policy after ``k`` updates, so
  the policy improves between every two consecutive episodes (the ``G`` games of one step come
  from the same weights; splitting them into ``G`` histories keeps one policy version per
  episode). Each reply becomes an action (its number, or ``invalid``), each turn's state is the
  feedback on the previous guess, the reward is 1 for the correct guess, the log-probability is
  the sum of the reply's token log-probabilities, and a game that ended early is padded to the
  horizon (``over`` / ``none``).

Shapes: ``P`` training numbers (groups per step), ``G`` games per number, ``S`` RL steps; the
histories hold ``P × G`` tasks of ``S`` episodes.

Example::

    family = GuessNumberEnvFamily(high=16, horizon=6)
    task = GuessNumberSourceTask(high=16, max_turns=6, group_size=8, n_batches=20)
    # ... tempering.rl.train(RLConfig(dataset=task, log_trajectories=True, ...)) into runs/src ...
    rl_histories("runs/src", family, renderer, "runs/ad/histories")
    read_histories("runs/ad/histories").returns_NE()     # (P*G) x S: the RL run's learning curves
"""

# pyarrow ships no type information: its tables, arrays and types are Unknown to the checker.
# pyright: reportUnknownMemberType=false, reportUnknownVariableType=false, reportUnknownArgumentType=false

from __future__ import annotations

import os
from pathlib import Path

import attrs
import numpy as np

from tempering.ad.guess_env import HIGHER, LOWER, OVER, START, GuessNumberEnvFamily
from tempering.ad.histories import HistoryError, SourceRun, write_task
from tempering.envs.agent_data import SameEveryBatch
from tempering.envs.guess_number import GuessNumberGroupBuilder, GuessNumberRules
from tempering.envs.guess_number_play import INTEGER
from tempering.envs.task_base import PolicyTask
from tempering.rl.trajectory_files import read_trajectories, trajectory_parts
from tempering_protocols import Renderer, RLDataset

__all__ = ["SECRET_TAG", "GuessNumberSourceTask", "rl_histories", "rules_of"]

SECRET_TAG = "secret="
"""The logging tag of a group, followed by its number: how the log says which number a game was on."""


def rules_of(family: GuessNumberEnvFamily) -> GuessNumberRules:
    """The token env's rules of ``family``'s game: numbers ``1..high``, ``horizon`` guesses."""
    return GuessNumberRules(low=1, high=family.high, max_turns=family.horizon)


@attrs.frozen(kw_only=True)
class GuessNumberSourceTask(PolicyTask):
    """The RL source's dataset builder: every training number of ``GuessNumberEnvFamily(high,
    max_turns)`` each step, ``group_size`` games each, ``n_batches`` steps; no test set.

    Example::

        train, _ = await GuessNumberSourceTask(high=16, max_turns=6, group_size=8, n_batches=20)()
    """

    high: int = 16
    """The largest number (the family's ``high``)."""
    max_turns: int = 6
    """Guesses per game (the family's ``horizon``)."""
    group_size: int = 8
    """Games per number per step (``G``)."""
    n_batches: int = 20
    """RL steps (``S``)."""

    def family(self) -> GuessNumberEnvFamily:
        return GuessNumberEnvFamily(high=self.high, horizon=self.max_turns)

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        family = self.family()
        renderer, rules = self.renderer(), rules_of(family)
        # Every training number every step, one group each, tagged with its number.
        groups = tuple(
            GuessNumberGroupBuilder(renderer, n, rules, self.group_size, f"{SECRET_TAG}{n}")
            for n in family.numbers(held_out=False)
        )
        return SameEveryBatch(groups, self.n_batches), None


def _action(family: GuessNumberEnvFamily, renderer: Renderer, tokens: list[int]) -> int:
    """The action of a reply: its number's action, or ``invalid`` (no stop token, or not a plain
    integer in ``1..high``: what the env counts as invalid)."""
    message, parsed = renderer.parse_response(tokens)
    text = message["content"].strip()
    if not parsed or INTEGER.fullmatch(text) is None or not 1 <= int(text) <= family.high:
        return family.invalid_action
    return int(text) - 1


def rl_histories(
    rl_log: str | os.PathLike[str],
    family: GuessNumberEnvFamily,
    renderer: Renderer,
    out: str | os.PathLike[str],
) -> Path:
    """Turn the trajectory log of an RL run on :class:`GuessNumberSourceTask` (a run directory,
    its ``trajectories``, or ``trajectories/rl``) into learning histories under
    ``out/trajectories/rl`` (see the module docstring); returns that directory. ``renderer``
    parses the replies (the run's). Raises :class:`~tempering.ad.histories.HistoryError`, naming
    the file and row, on a game without a ``secret=`` tag, a number that is not one of
    ``family``'s training numbers, a game longer than its ``horizon`` or that went on after the
    correct guess or an invalid reply (a run under other rules than ``family``'s), and on a
    step that lacks a game of some task.

    Example::

        rl_histories("runs/src/rl", GuessNumberEnvFamily(), renderer, "runs/ad/histories")
    """
    h = family.horizon
    numbers = family.numbers(held_out=False)
    # (number, member) -> step -> the episode's rows (state, action, reward, logprob)
    games: dict[tuple[int, int], dict[int, list[tuple[int, int, float, float]]]] = {}
    steps: set[int] = set()
    for part in trajectory_parts(rl_log):
        table = read_trajectories(part).to_pydict()
        current: list[tuple[int, int, float, float]] = []
        for r in range(len(table["step"])):
            where = f"{part}: row {r}"
            tags = [t for t in table["tags"][r] if t.startswith(SECRET_TAG)]
            if len(tags) != 1:
                raise HistoryError(
                    f"{where}: no '{SECRET_TAG}<number>' tag; the RL source's games come from "
                    "GuessNumberSourceTask, whose groups carry it"
                )
            secret = int(tags[0][len(SECRET_TAG) :])
            if secret not in numbers:
                raise HistoryError(
                    f"{where}: a game on {secret}, which is not one of {family.name}(high={family.high})'s "
                    f"training numbers {numbers}; run the source with rules_of(family)"
                )
            turn = int(table["turn"][r])
            if turn == 0:
                current = []
                state = START
            elif not current:
                raise HistoryError(f"{where}: turn {turn} of a game that has no turn before it here")
            else:
                prev_guess = current[-1][1] + 1
                state = HIGHER if secret > prev_guess else LOWER
            if turn >= h:
                raise HistoryError(
                    f"{where}: turn {turn + 1} of a game, more than the family's {h} turns (its horizon); "
                    "run the source with rules_of(family)"
                )
            action = _action(family, renderer, list(table["ac_tokens"][r]))
            reward = float(action == secret - 1)
            logprobs = table["ac_logprobs"][r]
            current.append((state, action, reward, float(np.sum(logprobs)) if logprobs else 0.0))
            done = bool(table["episode_done"][r])
            if (reward > 0 or action == family.invalid_action) and not done:
                what = "the correct guess" if reward else "an invalid reply"
                raise HistoryError(
                    f"{where}: the game went on after {what}; the token env's rules end it there"
                )
            if done:
                step, member = int(table["step"][r]), int(table["member"][r])
                padded = current + [(OVER, family.none_action, 0.0, 0.0)] * (h - len(current))
                episodes = games.setdefault((secret, member), {})
                if step in episodes:
                    raise HistoryError(
                        f"{where}: a second game of member {member} on {secret} in step {step}"
                    )
                episodes[step] = padded
                steps.add(step)
    if not games:
        raise HistoryError(f"{rl_log}: no finished games in the RL run's log")
    order = sorted(steps)
    rl_dir = Path(out) / "trajectories" / "rl"
    rl_dir.mkdir(parents=True, exist_ok=True)
    for old in rl_dir.glob("step-*.parquet"):
        old.unlink()
    for index, ((secret, member), episodes) in enumerate(sorted(games.items())):
        missing = [k for k in order if k not in episodes]
        if missing:
            raise HistoryError(
                f"{rl_log}: no game of member {member} on {secret} in step {missing[0]}; every step "
                "must play every number with every member (GuessNumberSourceTask does)"
            )
        rows = [row for k in order for row in episodes[k]]
        n_e = len(order)
        turn_R = np.tile(np.arange(h, dtype=np.int64), n_e)
        run = SourceRun(
            np.repeat(np.arange(n_e, dtype=np.int64), h),
            turn_R,
            np.array([x[0] for x in rows], dtype=np.int64),
            np.array([x[1] for x in rows], dtype=np.int64),
            np.array([x[2] for x in rows], dtype=np.float32),
            np.array([x[3] for x in rows], dtype=np.float32),
            turn_R == h - 1,
        )
        write_task(family, rl_dir, index, numbers.index(secret), "train", run)
    return rl_dir

"""In-context evaluation, online: a frozen model acts in held-out tasks for ``n_episodes``
episodes, its context (its own states, actions and rewards since the earliest episode start
that leaves at most ``context`` transitions, so that, like every training window, the context
begins at an episode start) carried across episodes; return per episode. Baselines on the same
tasks: the source learner's own learning curve, and a uniformly random policy.

Shapes: ``N`` held-out tasks (played side by side as one batch), ``E`` episodes, ``T``
transitions in the context.

Example::

    returns_NE = evaluate_in_context(model, family, seeds=range(20), n_episodes=20, seed=0)
    source_NE = source_curve(family, range(20), 20)
    write_curves("runs/ad/in-context", {"ad": returns_NE, "source": source_NE})
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from tempering.ad.histories import run_source
from tempering.ad.model import ADTransformer, check_spaces
from tempering.ad.tasks import BanditTask
from tempering.arrays import Float64Array
from tempering.training import RunDir
from tempering_protocols import InContextTask, InContextTaskFamily

__all__ = [
    "Curve",
    "cumulative_regret",
    "evaluate_in_context",
    "random_curve",
    "source_curve",
    "task_value",
    "write_curves",
]

Curve = Float64Array
"""Returns per held-out task and episode (``N × E``), or a figure per task (``N``)."""


def task_value(task: InContextTask, action: int, reward: float) -> float:
    """What an action earned: a bandit's expected reward (pseudo-regret, less noisy), else the reward."""
    return task.expected_reward(action) if isinstance(task, BanditTask) else reward


@torch.no_grad()
def evaluate_in_context(
    model: ADTransformer,
    family: InContextTaskFamily,
    seeds: Sequence[int],
    n_episodes: int,
    *,
    seed: int = 0,
    greedy: bool = False,
    held_out: bool = True,
) -> Curve:
    """The model's return in each of ``n_episodes`` episodes of each held-out task ``seeds``
    (``N × E``), weights frozen, context carried across episodes; actions sampled from the
    action head (``greedy``: its argmax). For bandits the return is the expected reward of the
    pulled arm. ``held_out=False`` plays the training split's tasks instead (a diagnosis: does
    the model do on the tasks it was trained on what it fails to do on new ones?).

    Example::

        evaluate_in_context(model, BanditFamily(), range(30), 100).sum(axis=1)   # per-task reward
    """
    check_spaces(model.config, n_states=family.n_states, n_actions=family.n_actions, what=family.name)
    model.eval()
    device = next(model.parameters()).device
    tasks = [family.task(s, held_out) for s in seeds]
    n, h, w = len(tasks), family.horizon, model.config.context
    total = n_episodes * h
    states_NT = torch.zeros(n, total, dtype=torch.long, device=device)
    actions_NT = torch.zeros(n, total, dtype=torch.long, device=device)
    rewards_NT = torch.zeros(n, total, device=device)
    logprobs_NT = torch.zeros(n, total, device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    returns_NE = np.zeros((n, n_episodes))
    i = 0
    for e in range(n_episodes):
        states_NT[:, i] = torch.tensor([t.reset() for t in tasks], device=device)
        for _ in range(h):
            # the context starts at an episode start, as every training window does
            lo = max(0, -((w - i - 1) // h) * h)
            out = model(states_NT[:, lo : i + 1], actions_NT[:, lo : i + 1], rewards_NT[:, lo : i + 1],
                        logprobs_NT[:, lo : i + 1])  # fmt: skip
            logp_NA = torch.log_softmax(out.action_logits_BTA[:, -1].float(), dim=-1)
            if greedy:
                act_N = logp_NA.argmax(-1)
            else:
                act_N = torch.multinomial(logp_NA.exp(), 1, generator=gen).squeeze(-1)
            actions_NT[:, i] = act_N
            logprobs_NT[:, i] = logp_NA.gather(-1, act_N[:, None]).squeeze(-1)
            next_states: list[int] = []
            for k, task in enumerate(tasks):
                action = int(act_N[k])
                s2, r = task.step(action)
                rewards_NT[k, i] = r
                returns_NE[k, e] += task_value(task, action, r)
                next_states.append(s2)
            i += 1
            if i < total:
                states_NT[:, i] = torch.tensor(next_states, device=device)
    return returns_NE


def source_curve(family: InContextTaskFamily, seeds: Sequence[int], n_episodes: int) -> Curve:
    """The source learner's own learning curve on the held-out tasks (``N × E``)."""
    out = np.zeros((len(seeds), n_episodes))
    for k, s in enumerate(seeds):
        run = run_source(family, s, n_episodes, held_out=True)
        task = family.task(s, True)
        values = [task_value(task, int(a), float(r)) for a, r in zip(run.action_R, run.reward_R, strict=True)]
        out[k] = np.bincount(run.episode_R, weights=values, minlength=n_episodes)
    return out


def random_curve(
    family: InContextTaskFamily, seeds: Sequence[int], n_episodes: int, *, seed: int = 0
) -> Curve:
    """A uniformly random policy's returns on the held-out tasks (``N × E``)."""
    rng = np.random.default_rng(seed)
    out = np.zeros((len(seeds), n_episodes))
    for k, s in enumerate(seeds):
        task = family.task(s, True)
        for e in range(n_episodes):
            task.reset()
            for _ in range(family.horizon):
                a = int(rng.integers(family.n_actions))
                _, r = task.step(a)
                out[k, e] += task_value(task, a, r)
    return out


def cumulative_regret(family: InContextTaskFamily, seeds: Sequence[int], returns_NE: Curve) -> Curve:
    """Per task, the summed shortfall from the best expected return over the episodes (``N``)."""
    best_N = np.array([family.task(s, True).optimal_return() for s in seeds])
    return (best_N[:, None] - returns_NE).sum(axis=1)


def write_curves(path: str | os.PathLike[str], curves: Mapping[str, Curve], config: object) -> Path:
    """Write the mean return per episode of each curve as a run directory ``tempering view``
    shows (``return/<name>`` against the episode as its step); returns the path."""
    run, _ = RunDir.open(path, config, "overwrite")
    n_e = min(c.shape[1] for c in curves.values())
    for e in range(n_e):
        line: dict[str, float | int] = {"step": e}
        for name, c in curves.items():
            line[f"return/{name}"] = float(c[:, e].mean())
            line[f"return_sd/{name}"] = float(c[:, e].std())
        run.append_metrics(line)
    return run.path

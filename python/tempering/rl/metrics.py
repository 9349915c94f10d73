"""The RL loop's metrics: what a step's rollouts say (``rollout_metrics``), how far the
sampler's logprobs are from the trainer's (``mismatch_metrics``), and where a step's time went
(``Timers``).

Metrics of an RL run (one line per step) include ``env/reward/mean``, ``env/<tag>/reward/mean``,
``env/correct``,
``env/turns``, ``env/end/<reason>``, ``env/stop/length``, ``env/frac_groups_dropped``, the envs'
own namespaced step metrics (``env/tools/calls``, ``env/judge/unparsed``, ``env/twenty_q/won``, …),
``rollout/failed/<Type>``, ``tokens/sampled``, ``tokens/trained``, ``kl/sample_train_v1`` and
``_v2`` (sampler vs. trainer logprobs), ``entropy/sampled``, ``optim/lr``, ``optim/grad_norm``,
``time/{rollout,sampling,env,data,train,wait}`` (and ``time/log_trajectories`` with
``log_trajectories``) and, every ``eval_every`` steps, ``test/…``.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence

import attrs
import numpy as np
from tinker import types as ttypes

from tempering.arrays import Float32Array
from tempering.rl.data import RaggedBatch
from tempering.rl.rollouts import GroupRollout
from tempering_protocols import Future

__all__ = ["Substep", "Timers", "mismatch_metrics", "rollout_metrics", "substep_metrics"]


def rollout_metrics(rollouts: Sequence[GroupRollout], prefix: str = "env") -> dict[str, float]:
    """Reward, correctness, episode-length, stop-reason, failure and token metrics of groups.

    Keys: ``{prefix}/reward/mean`` and ``/std`` (over trajectories), ``{prefix}/<tag>/reward/mean``,
    ``{prefix}/correct`` (mean of the ``correct`` step metric where envs report it),
    ``{prefix}/grader/<count>`` (``grader/timeouts`` etc. summed over the turns of envs that
    grade with ``MathGrader``), ``{prefix}/<ns>/<name>`` for every other step metric whose key has
    a ``/`` (``tools/calls``, ``judge/timeout``, ``twenty_q/won``: summed over an episode's turns,
    then the mean over the episodes, an episode that does not report it counting 0),
    ``{prefix}/turns``, ``{prefix}/end/<reason>`` (fractions), ``{prefix}/limit_hits/<reason>`` (counts),
    ``{prefix}/stop/length`` (fraction of turns that hit ``max_tokens``),
    ``{prefix}/frac_groups_failed``, ``rollout/failed/<Type>`` and ``tokens/sampled``.
    """
    rewards: list[float] = []
    by_tag: defaultdict[str, list[float]] = defaultdict(list)
    correct: list[float] = []
    turns: list[int] = []
    ends: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    graded: defaultdict[str, float] = defaultdict(float)
    per_episode: defaultdict[str, float] = defaultdict(float)
    n_turns = n_length = n_tokens = 0
    n_failed_groups = 0
    for r in rollouts:
        failures.update(r.failures)
        if r.group is None:
            n_failed_groups += 1
            continue
        totals = r.group.get_total_rewards()
        rewards += totals
        for tag in r.tags:
            by_tag[tag] += totals
        ends.update(r.end_reasons_G)
        for traj in r.group.trajectories_G:
            turns.append(len(traj.transitions))
            for t in traj.transitions:
                n_turns += 1
                n_tokens += len(t.ac.tokens)
                n_length += t.ac.stop_reason == "length"
                if "correct" in t.metrics:
                    correct.append(float(t.metrics["correct"]))
                for key, value in t.metrics.items():
                    if key.startswith("grader/"):  # counts: summed
                        graded[key] += float(value)
                    elif "/" in key:  # the env's own: summed per episode, averaged below
                        per_episode[key] += float(value)
    out: dict[str, float] = {
        f"{prefix}/reward/mean": float(np.mean(rewards)) if rewards else math.nan,
        f"{prefix}/reward/std": float(np.std(rewards)) if rewards else math.nan,
        f"{prefix}/turns": float(np.mean(turns)) if turns else math.nan,
        f"{prefix}/stop/length": n_length / n_turns if n_turns else math.nan,
        f"{prefix}/frac_groups_failed": n_failed_groups / len(rollouts) if rollouts else 0.0,
        "tokens/sampled" if prefix == "env" else f"{prefix}/tokens/sampled": float(n_tokens),
    }
    if correct:
        out[f"{prefix}/correct"] = float(np.mean(correct))
    for tag, values in by_tag.items():
        out[f"{prefix}/{tag}/reward/mean"] = float(np.mean(values))
    n_ends = sum(ends.values())
    for reason, count in ends.items():
        out[f"{prefix}/end/{reason}"] = count / n_ends
        if reason != "done":  # a limit (RolloutConfig): how many episodes it stopped
            out[f"{prefix}/limit_hits/{reason}"] = float(count)
    for key, count in failures.items():
        out[key if prefix == "env" else f"{prefix}/{key}"] = float(count)
    out |= {f"{prefix}/{key}": total for key, total in graded.items()}
    for key, total in per_episode.items():
        out.setdefault(f"{prefix}/{key}", total / len(turns))
    return out


def mismatch_metrics(
    batch: RaggedBatch, fb: ttypes.ForwardBackwardOutput, sampler_N: Float32Array | None = None
) -> dict[str, float]:
    """Sampler-vs-trainer logprob mismatch and the sampled-token entropy estimate, over the
    trained positions (``mask_N``). ``sampler_N``: the sampler's logprobs when ``batch.logprobs_N``
    are no longer theirs (an importance correction puts the trainer's there); default
    ``batch.logprobs_N``."""
    sampler_N = batch.logprobs_N if sampler_N is None else sampler_N
    outputs = [o["logprobs"].to_numpy().astype(np.float32, copy=False) for o in fb.loss_fn_outputs]
    if not outputs:
        return {}
    trainer_N = np.concatenate(outputs)
    if trainer_N.shape != sampler_N.shape or sampler_N.shape != batch.mask_N.shape:
        return {}
    mask_N = batch.mask_N > 0
    n = int(mask_N.sum())
    if n == 0:
        return {}
    diff = (sampler_N - trainer_N)[mask_N].astype(np.float64)
    return {
        "kl/sample_train_v1": float(diff.mean()),
        "kl/sample_train_v2": float(0.5 * (diff**2).mean()),
        "entropy/sampled": float(-sampler_N[mask_N].astype(np.float64).mean()),
    }


@attrs.define
class Substep:
    """One optimizer substep in flight: its futures, its minibatch, its metrics so far, and the
    sampler's logprobs when the minibatch's ``logprobs_N`` are the trainer's (an importance
    correction ran), so that ``kl/sample_train_*`` still compares sampler and trainer."""

    fb: Future[ttypes.ForwardBackwardOutput]
    opt: Future[ttypes.OptimStepResponse]
    batch: RaggedBatch
    extra: dict[str, float]
    sampler_N: Float32Array | None = None


async def substep_metrics(substeps: Sequence[Substep], *, loss_metrics: bool) -> dict[str, float]:
    """A step's results, once its substeps finish: the means over substeps of
    :func:`mismatch_metrics`, of each substep's ``extra`` and (``loss_metrics``: a custom loss's)
    the loss's own metrics; ``tokens/trained``; ``optim/loss_sum`` and ``optim/grad_norm`` (means).
    """
    out: dict[str, float] = {}
    losses: list[float] = []
    norms: list[float] = []
    trained = 0.0
    for sub in substeps:
        fb = await sub.fb
        opt = await sub.opt
        losses.append(fb.metrics.get("loss:sum", math.nan))
        if opt.metrics is not None and "grad_norm" in opt.metrics:
            norms.append(float(opt.metrics["grad_norm"]))
        trained += float(sub.batch.mask_N.sum())
        own = {k: v for k, v in fb.metrics.items() if k != "loss:sum"} if loss_metrics else {}
        for k, v in {**mismatch_metrics(sub.batch, fb, sub.sampler_N), **sub.extra, **own}.items():
            out[k] = out.get(k, 0.0) + v / len(substeps)
    out["tokens/trained"] = trained
    if losses:
        out["optim/loss_sum"] = float(np.mean(losses))
    if norms:
        out["optim/grad_norm"] = float(np.mean(norms))
    return out


@attrs.define
class Timers:
    """Seconds spent per part of a step, logged as ``time/<part>``."""

    values: defaultdict[str, float] = attrs.field(factory=lambda: defaultdict(float))

    def add(self, key: str, seconds: float) -> None:
        self.values[f"time/{key}"] += seconds

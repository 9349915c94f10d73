"""In-context evaluation of a language model on the language format: the same held-out tasks
and episodes as :func:`~tempering.ad.evaluate.evaluate_in_context`, but the context is the
transcript (:func:`~tempering.ad.dataset.transcript`) of at most ``window`` transitions from an
episode start (as every training window begins), the
model answers each state with an assistant message, and that message is read back as the
action whose words it is. A reply that names no action counts as an invalid action: a uniformly
random action is taken in its place (the count is returned).

Shapes: ``N`` held-out tasks (sampled side by side), ``E`` episodes.

Example::

    sampler = await service.create_sampling_client(model_path=sft.final.sampler_path)
    returns_NE, invalid = await evaluate_language_in_context(sampler, renderer, family, range(8), 8,
                                                             window=24)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tinker

from tempering.ad.dataset import HistoryDataset, WindowTooLongError, transcript
from tempering.ad.evaluate import Curve, task_value
from tempering_protocols import InContextTaskFamily, Renderer, SamplingClient

__all__ = ["check_transcripts_fit", "evaluate_language_in_context", "parse_action"]


def parse_action(family: InContextTaskFamily, text: str) -> int | None:
    """The action whose words ``text`` is (surrounding space ignored), else ``None``."""
    wanted = text.strip()
    for a in range(family.n_actions):
        if family.describe_action(a) == wanted:
            return a
    return None


def check_transcripts_fit(
    dataset: HistoryDataset,
    renderer: Renderer,
    context: int,
    *,
    max_tokens: int = 8,
    model: str = "the model",
) -> int:
    """The tokens of ``dataset``'s longest transcript (by characters) through ``renderer``, plus
    ``max_tokens`` for a reply; :class:`WindowTooLongError` when that exceeds ``context``, before
    any training: the same window is the evaluation's context.

    Example::

        check_transcripts_fit(HistoryDataset(h, window=30, fmt="language", family=f), renderer, 2048)
    """
    if len(dataset) == 0:
        return 0
    longest = max(range(len(dataset)), key=lambda i: sum(len(str(m["content"])) for m in dataset.messages(i)))
    n = renderer.build_generation_prompt(dataset.messages(longest)).length + max_tokens
    if n > context:
        fit = max(1, dataset.window * context // n)
        raise WindowTooLongError(
            f"a window of {dataset.window} transitions is {n} tokens as a transcript of {model} "
            f"(window {longest}, with {max_tokens} for the reply), longer than its context of {context} "
            f"tokens; lower --window (about {fit} transitions fit) or use a model with a longer context"
        )
    return n


async def evaluate_language_in_context(
    sampler: SamplingClient,
    renderer: Renderer,
    family: InContextTaskFamily,
    seeds: Sequence[int],
    n_episodes: int,
    *,
    window: int,
    seed: int = 0,
    max_tokens: int = 8,
) -> tuple[Curve, int]:
    """The language model's return per episode on each held-out task (``N × E``), sampled at
    temperature 1, weights frozen, the transcript carried across episodes; and the number of
    replies that named no action."""
    tasks = [family.task(s, True) for s in seeds]
    n, h = len(tasks), family.horizon
    states: list[list[int]] = [[] for _ in range(n)]
    actions: list[list[int]] = [[] for _ in range(n)]
    rewards: list[list[float]] = [[] for _ in range(n)]
    returns_NE = np.zeros((n, n_episodes))
    rng = np.random.default_rng(seed)
    invalid = 0
    i = 0
    for e in range(n_episodes):
        current = [t.reset() for t in tasks]
        for _ in range(h):
            futures = []
            for k in range(n):
                lo = max(0, -((window - i - 1) // h) * h)  # an episode start, as in training
                s_T = np.asarray([*states[k][lo:], current[k]], dtype=np.int64)
                a_T = np.asarray([*actions[k][lo:], 0], dtype=np.int64)
                r_T = np.asarray([*rewards[k][lo:], 0.0], dtype=np.float32)
                messages = transcript(family, s_T, a_T, r_T, lo % h)[:-1]  # up to the current state
                params = tinker.SamplingParams(
                    max_tokens=max_tokens, temperature=1.0, stop=renderer.get_stop_sequences(),
                    seed=seed * 1_000_003 + i * 1009 + k,
                )  # fmt: skip
                futures.append(sampler.sample(renderer.build_generation_prompt(messages), 1, params))
            for k, future in enumerate(futures):
                (seq,) = (await future).sequences
                message, _ = renderer.parse_response(seq.tokens)
                action = parse_action(family, message["content"])
                if action is None:
                    invalid += 1
                    action = int(rng.integers(family.n_actions))
                s2, r = tasks[k].step(action)
                states[k].append(current[k])
                actions[k].append(action)
                rewards[k].append(r)
                returns_NE[k, e] += task_value(tasks[k], action, r)
                current[k] = s2
            i += 1
    return returns_NE, invalid

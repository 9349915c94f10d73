"""Evaluators of a sampling client on the RL recipes' tasks, before and after RL.

- :func:`evaluate_code`: replies to :class:`~tempering.envs.code.CodeProblem` s played as the RL
  loop plays them (tests run in the task's sandbox): mean pass fraction, all-pass and
  code-block rates.
- :func:`evaluate_math`: held-out accuracy on math problems graded by
  :class:`~tempering.envs.math.MathRewards`, greedy and sampled over several seeds.

Example::

    figures = await evaluate_code(sampler, problems, renderer, grading, samples=4, max_tokens=96, seed=0)
    figures = await evaluate_math(sampler, test, renderer, MathRewards(), seeds=(0, 1, 2))
"""

from __future__ import annotations

import statistics
from collections.abc import Awaitable, Sequence

from tempering.data.hub import MathProblem
from tempering.envs.code import CodeGrading, CodeGroupBuilder, CodeProblem
from tempering.envs.math import DEFAULT_INSTRUCTION, MathRewards, prompt_messages
from tempering.rl.evaluate import play_groups
from tempering.rl.policy import TinkerTokenCompleter
from tempering_protocols import Renderer, SamplingClient

__all__ = ["evaluate_code", "evaluate_math"]


async def evaluate_code(
    sampler: SamplingClient,
    problems: Sequence[CodeProblem],
    renderer: Renderer,
    grading: CodeGrading,
    *,
    samples: int,
    max_tokens: int,
    seed: int,
) -> dict[str, float]:
    """``samples`` replies per problem at temperature 1: mean ``pass_fraction``, ``all_pass``,
    ``format`` (a code block was found) and ``sandbox_limit`` over every reply, and ``replies``.

    Example::

        await evaluate_code(sampler, test_problems, renderer, grading, samples=4, max_tokens=96, seed=0)
    """
    builders = [CodeGroupBuilder(p, renderer, grading, group_size=samples) for p in problems]
    policy = TinkerTokenCompleter(sampler, max_tokens, 1.0)
    played = await play_groups(builders, policy, seed=seed, what="code evaluation")
    metrics = [t.transitions[-1].metrics for t in played]
    if not metrics:
        raise RuntimeError("code evaluation: no replies")
    keys = ("pass_fraction", "all_pass", "format", "sandbox_limit")
    return {k: sum(float(m[k]) for m in metrics) / len(metrics) for k in keys} | {
        "replies": float(len(metrics))
    }


async def _accuracy(
    sampler: SamplingClient,
    problems: Sequence[MathProblem],
    renderer: Renderer,
    rewards: MathRewards,
    *,
    samples: int,
    temperature: float,
    max_tokens: int,
    seed: int,
    instruction: str | None,
) -> tuple[float, float]:
    """(accuracy, boxed fraction) of ``samples`` answers per problem; problem ``i`` is sampled
    with its own seed, derived from (``seed``, ``i``)."""
    import tinker

    stop = renderer.get_stop_sequences()
    futures = [
        sampler.sample(
            renderer.build_generation_prompt(prompt_messages(p.question, instruction, None)),
            samples,
            tinker.SamplingParams(
                max_tokens=max_tokens, temperature=temperature, stop=stop, seed=seed * 1_000_003 + i
            ),
        )
        for i, p in enumerate(problems)
    ]
    correct = boxed = n = 0.0
    for p, future in zip(problems, futures, strict=True):
        for seq in (await future).sequences:
            message, parsed = renderer.parse_response(seq.tokens)
            _, metrics = await rewards.score(message["content"], parsed, p.answer)
            correct += metrics["correct"]
            boxed += metrics["format"]
            n += 1
    return correct / max(n, 1), boxed / max(n, 1)


async def evaluate_math(
    sampler: SamplingClient,
    problems: Sequence[MathProblem],
    renderer: Renderer,
    rewards: MathRewards,
    *,
    seeds: Sequence[int],
    samples: int = 4,
    max_tokens: int = 32,
    instruction: str | None = DEFAULT_INSTRUCTION,
) -> dict[str, float]:
    """Held-out accuracy of ``sampler``: greedy (``accuracy_greedy``, ``boxed_greedy``) and at
    temperature 1 (``accuracy``, ``boxed``; ``samples`` answers per problem) for each seed of
    ``seeds``, with the mean over seeds and its standard deviation (``accuracy_std``).

    Example::

        figures = await evaluate_math(sampler, test, renderer, MathRewards(), seeds=(0, 1, 2))
        figures["accuracy"], figures["accuracy_std"], figures["accuracy_greedy"]
    """

    def run(temperature: float, n: int, seed: int) -> Awaitable[tuple[float, float]]:
        return _accuracy(
            sampler,
            problems,
            renderer,
            rewards,
            samples=n,
            temperature=temperature,
            max_tokens=max_tokens,
            seed=seed,
            instruction=instruction,
        )

    greedy, greedy_boxed = await run(0.0, 1, 0)
    runs = [await run(1.0, samples, s) for s in seeds]
    accuracies = [a for a, _ in runs]
    out = {
        "accuracy": statistics.fmean(accuracies),
        "accuracy_std": statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0,
        "boxed": statistics.fmean(b for _, b in runs),
        "accuracy_greedy": greedy,
        "boxed_greedy": greedy_boxed,
    }
    out.update({f"accuracy_seed{s}": a for s, a in zip(seeds, accuracies, strict=True)})
    return out

"""An accuracy evaluation's kept answers as the viewer's evaluation episodes.

:func:`accuracy_episodes` turns an :class:`~tempering.evals.accuracy.EvalRecord` (the sampled
answers an :class:`~tempering.evals.accuracy.AccuracyEvaluator` keeps for a report) into the
episodes :func:`~tempering.view.data.write_eval_rollouts` writes, so ``tempering view`` shows
them beside the RL rollouts.

Example::

    write_eval_rollouts(run_dir, record.step, accuracy_episodes(record))
"""

from __future__ import annotations

from typing import Any

from tempering.evals.accuracy import EvalRecord

__all__ = ["accuracy_episodes"]


def accuracy_episodes(record: EvalRecord) -> list[dict[str, Any]]:
    """The kept answers of ``record`` as the viewer's episodes: one group per problem, one
    single-turn episode per answer, tagged with the record's stage and ``eval``; the note gives
    the expected answer."""
    return [
        {
            "episode_id": f"{record.stage}-s{record.step}-p{p}-g{g}",
            "group": p,
            "member": g,
            "tags": [record.stage, "eval"],
            "note": f"expected {problem.answer}",
            "total_reward": a.reward,
            "advantage": a.advantage,
            "trained": False,
            "end_reason": "done",
            "turns": [
                {
                    "turn": 0,
                    "reward": a.reward,
                    "observation": problem.question,
                    "action": a.text,
                    "ac_tokens": list(a.tokens),
                    "ac_logprobs": list(a.logprobs) or None,
                    "ac_pieces": list(a.pieces),
                }
            ],
        }
        for p, (problem, answers) in enumerate(record.problems)
        for g, a in enumerate(answers)
    ]
